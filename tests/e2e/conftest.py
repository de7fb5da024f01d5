"""Fixtures for the end-to-end tests: tiny checkpoints, the transformers reference,
and vLLM engines run (once per session each) in subprocesses by run_scenarios.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "run_scenarios.py"
ENGINE_TIMEOUT_S = 900
#: tiny checkpoints the engines run on: "default" (transformers' format, every
#: feature on), "padded" (the same with unpadded conv pages), "release" (the same
#: weights in the original release layout)
VARIANTS = ("default", "padded", "release")


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inkling_e2e")


@pytest.fixture(scope="session")
def checkpoints(scratch: Path) -> dict[str, Path]:
    from inkling_vllm.demo.tiny import build_tiny_checkpoint

    return {v: build_tiny_checkpoint(scratch / f"tiny-{v}", variant=v) for v in VARIANTS}


@pytest.fixture(scope="session")
def hf(checkpoints: dict[str, Path]) -> dict[str, Any]:
    """transformers' model of each variant (the release layout's from its
    transformers-format copy: the same weights)."""
    from inkling_vllm.demo.parity import HfReference
    from inkling_vllm.demo.tiny import reference_checkpoint

    return {v: HfReference(reference_checkpoint(p)) for v, p in checkpoints.items()}


def engine_env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    env["VLLM_CACHE_ROOT"] = str(scratch / "vllm-cache")
    env.pop("INKLING_E2E_SETTINGS", None)
    return env


@pytest.fixture(scope="session")
def vllm_env(scratch: Path) -> dict[str, str]:
    """Environment for a vLLM subprocess (small KV cache, scratch compile cache)."""
    return engine_env(scratch)


class Engines:
    """Runs each engine configuration at most once per session."""

    def __init__(self, scratch: Path, checkpoints: dict[str, Path]) -> None:
        self.scratch = scratch
        self.checkpoints = checkpoints
        self.results: dict[str, dict[str, Any]] = {}

    def __call__(self, engine: str, variant: str) -> dict[str, Any]:
        key = f"{engine}-{variant}"
        if key not in self.results:
            out = self.scratch / f"{key}.json"
            proc = subprocess.run(
                [sys.executable, str(RUNNER), engine, str(self.checkpoints[variant]), str(out)],
                env=engine_env(self.scratch),
                capture_output=True,
                text=True,
                timeout=ENGINE_TIMEOUT_S,
            )
            if proc.returncode != 0:
                tail = (proc.stdout + proc.stderr)[-6000:]
                pytest.fail(f"engine {key} failed (rc {proc.returncode}):\n{tail}")
            self.results[key] = json.loads(out.read_text())
        return self.results[key]


@pytest.fixture(scope="session")
def engines(scratch: Path, checkpoints: dict[str, Path]) -> Engines:
    return Engines(scratch, checkpoints)
