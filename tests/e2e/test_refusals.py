"""Checkpoints outside the dense, relative-logit-free subset are refused by a real
vLLM engine while it loads the model, with a message saying what is unsupported."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# One process tries each checkpoint; the engine core runs in-process so the
# model's exception reaches the caller unchanged.
TRY_LOAD = r"""
import json, sys
if __name__ == "__main__":
    from vllm import LLM
    results = {}
    for path in sys.argv[1:]:
        try:
            LLM(model=path, dtype="float32", max_model_len=256, enforce_eager=True)
            results[path] = "loaded"
        except Exception as exc:
            results[path] = f"{type(exc).__name__}: {exc}"
    print("RESULTS " + json.dumps(results))
"""


def _variant(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def refusals(checkpoints: dict[str, Path], scratch: Path, vllm_env: dict[str, str]) -> dict[str, str]:
    import torch
    from safetensors.torch import load_file, save_file

    rel = _variant(checkpoints["default"], scratch / "refuse-rel-logits")
    tensors = load_file(str(rel / "model.safetensors"))
    key = "model.layers.1.self_attn.rel_logits_proj.proj"
    tensors[key] = torch.full_like(tensors[key], 0.01)
    save_file(tensors, str(rel / "model.safetensors"), metadata={"format": "pt"})

    moe = _variant(checkpoints["default"], scratch / "refuse-moe")
    cfg = json.loads((moe / "config.json").read_text())
    cfg["mlp_layer_types"] = ["dense", "sparse", "dense", "dense"]
    (moe / "config.json").write_text(json.dumps(cfg))

    env = {**vllm_env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", TRY_LOAD, str(rel), str(moe)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert lines, (proc.stdout + proc.stderr)[-5000:]
    results: dict[str, Any] = json.loads(lines[-1][len("RESULTS "):])
    return {"rel": results[str(rel)], "moe": results[str(moe)]}


def test_nonzero_relative_logit_projection_is_refused(refusals: dict[str, str]) -> None:
    assert "UnsupportedCheckpoint" in refusals["rel"] or "relative-logit" in refusals["rel"], refusals["rel"]
    assert "rel_logits_proj.proj is non-zero" in refusals["rel"]


def test_moe_layers_are_refused(refusals: dict[str, str]) -> None:
    assert "MoE layers are not supported" in refusals["moe"], refusals["moe"]
    assert "[1]" in refusals["moe"]  # names the offending layer
