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
    assert groups == {"sconv", "sconv_seq_metadata", "sconv_kv", "sconv_add_rmsnorm", "layer", "layer+gather",
                      "gathered_rms_norm", "rel_attention"}
    assert res["copy_GBps"] > 0 and res["command"].startswith("python3 packages/inkling-kernels/benchmarks/run.py")
    # the full size set names the cases RESULTS.md reports
    full = {c.name for c in run._cases.registry(run._cases.FULL)}
    assert {"sconv prefill 8192, ATTN", "sconv mixed 255+2048, ATTN", "layer global tp8 decode 1",
            "layer+gather sliding tp8 prefill 8192", "rel_attention decode 1 x 32k"} <= full


def test_the_peers_all_gather_copy_gives_the_rows_ours_reads_as_pieces(run: Any) -> None:
    """The layer+gather cases' peer copies the all-gathered [tp, T, S] buffer into rows as
    vLLM's all_gather(dim=-1) returns them: rank r's shard in columns r * S ..; ours reads
    the same buffer as pieces (gathered_rms_norm), so both norm the same rows."""
    pieces = torch.randn(4, 5, 3)
    rows = run._cases._gathered_rows(pieces)
    assert torch.equal(rows, torch.cat(list(pieces), dim=-1))
    assert rows.data_ptr() != pieces.data_ptr()  # a copy, timed as the peer's
    with pytest.raises(ValueError, match="tp > 1"):
        run._cases._layer("global", 1, [(3, 1)], gather=True)


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


def test_host_mode_times_the_python_with_the_launches_stubbed(run: Any, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``--host --smoke``: each case is checked with the real (interpreted) kernels, then
    timed with every Triton kernel of the package replaced by a no-op, and the kernels
    are put back afterwards."""
    from inkling_kernels.sconv import kernel as sconv_kernel
    from inkling_kernels.sconv_add_rmsnorm import kernel as norm_kernel

    originals = (sconv_kernel._fused_sconv_kernel, norm_kernel._sconv_add_rmsnorm_kernel)
    seen = []
    real_timer = run.time_host

    def timer(launches: list[Any], reps: int) -> float:
        seen.append((sconv_kernel._fused_sconv_kernel, norm_kernel._sconv_add_rmsnorm_kernel))
        return real_timer(launches, reps)

    monkeypatch.setattr(run, "time_host", timer)
    out = tmp_path / "results.json"
    assert run.main(["--smoke", "--host", "--reps", "1", "--only", "sconv decode|sconv_add_rmsnorm decode",
                     "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["host"] and res["copy_GBps"] == 0.0
    assert [r["case"] for r in res["cases"]] == ["sconv decode 3, ATTN", "sconv_add_rmsnorm decode 3"]
    assert all(r["ok"] and r["ours_us"] > 0 and r["of_copy"] is None for r in res["cases"])
    assert seen and all(isinstance(k, run._NoLaunch) for pair in seen for k in pair)
    assert (sconv_kernel._fused_sconv_kernel, norm_kernel._sconv_add_rmsnorm_kernel) == originals


def test_attention_tilings_are_checked_and_timed_beside_the_default(run: Any, tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    tiling = "block_q=1,block_n=16,bias=row,num_warps=2,num_stages=1"
    assert run.main(["--smoke", "--reps", "1", "--only", "rel_attention sliding decode",
                     "--attention-config", tiling, "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["cases"]
    assert row["ok"] and set(row["ours_variants_us"]) == {"default", f"tiling {tiling}"}
    assert row["ours_us"] == min(row["ours_variants_us"].values())


def test_a_tiling_with_a_wrong_output_fails_its_case(run: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real = run._cases.paged_rel_attention_triton

    def wrong_when_tiled(*args: Any, config: Any = None, **kw: Any) -> torch.Tensor:
        out = real(*args, config=config, **kw)
        if config is not None:
            out[0] += 1.0
        return out

    monkeypatch.setattr(run._cases, "paged_rel_attention_triton", wrong_when_tiled)
    out = tmp_path / "results.json"
    assert run.main(["--smoke", "--reps", "1", "--only", "rel_attention sliding decode",
                     "--attention-config", "block_q=1,block_n=16,bias=row", "--out", str(out)]) == 1
    (row,) = json.loads(out.read_text())["cases"]
    assert not row["ok"] and "tiling block_q=1,block_n=16,bias=row" in row["error"]


@pytest.mark.parametrize("spec, says", [("block_q=1,blocks=16", "blocks=16"), ("block_q=1", "block_n"),
                                        ("block_q=2,block_n=16,bias=row", "block_q=1")])
def test_a_bad_attention_config_is_refused_before_any_case(run: Any, spec: str, says: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run.main(["--smoke", "--only", "rel_attention", "--attention-config", spec])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--attention-config" in err and says in err
