"""benchmarks/run.py on CPU: every case of the smoke size set builds, checks its output
against the reference and is timed; a case whose op is wrong makes the run fail."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch) -> Any:
    """benchmarks/run.py as a module, the kernels on CPU under the interpreter."""
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", "triton")
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("inkling_bench_run", BENCH / "run.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("_cases", None)


def test_smoke_runs_every_case(run: Any, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    assert run.main(["--smoke", "--reps", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    names = [c.name for c in run._cases.registry(run._cases.SMOKE)]
    assert [r["case"] for r in res["cases"]] == names
    assert all(r["ok"] and r["ours_us"] > 0 for r in res["cases"])
    groups = {r["group"] for r in res["cases"]}
    assert groups == {"sconv", "sconv_seq_metadata", "sconv_kv", "sconv_add_rmsnorm", "layer",
                      "gathered_rms_norm", "rel_attention"}
    assert res["copy_GBps"] > 0 and res["command"].startswith("python3 packages/inkling-kernels/benchmarks/run.py")
    # the full size set names the cases RESULTS.md reports
    full = {c.name for c in run._cases.registry(run._cases.FULL)}
    assert {"sconv prefill 8192, ATTN", "sconv mixed 255+2048, ATTN", "layer global tp8 decode 1",
            "rel_attention decode 1 x 32k"} <= full


def test_a_wrong_op_fails_the_run(run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = run._cases.fused_sconv

    def off_by_one_row(x: torch.Tensor, *args: Any) -> torch.Tensor:
        out = real(x, *args)
        out[-1] += 1.0
        return out

    monkeypatch.setattr(run._cases, "fused_sconv", off_by_one_row)
    out = tmp_path / "results.md"
    assert run.main(["--smoke", "--reps", "1", "--only", "sconv decode|gathered", "--out", str(out)]) == 1
    text = out.read_text()
    assert "| sconv decode 3, ATTN | **FAIL** |" in text
    assert "| gathered_rms_norm tp2 decode 3 | " in text and text.count("**FAIL**") == 1
