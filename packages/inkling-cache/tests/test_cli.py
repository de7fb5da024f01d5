"""The ``inkling-cache plan`` command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inkling_cache.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_tp8_shows_the_975b_figures(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "inkling-975b", "--tp", "8", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    g, s = data["conv_layouts"]["global"], data["conv_layouts"]["sliding"]
    assert (g["raw_head_size"], g["head_size"], g["num_heads"], g["num_layers"]) == (1792, 2048, 1, 11)
    assert (s["raw_head_size"], s["head_size"], s["num_heads"], s["num_layers"]) == (1024, 1024, 2, 55)
    assert g["page_bytes"] == s["page_bytes"] == 131072 // 8
    assert g["layers"] == list(range(5, 66, 6))
    assert g["stream_ranges"] == {"K": [0, 128], "V": [128, 128], "ATTN": [256, 768],
                                  "MLP": [1024, 768]}
    assert data["settings"]["tp_size"] == 8
    assert {k: v["block_size"] for k, v in data["unification"].items()} == {
        "conv/global": 4, "conv/sliding": 4, "attn/global": 32, "attn/sliding": 16}
    sweep = data["block_size_sweep"]
    for block, (conv, glob, slid) in {16: (4, 32, 16), 32: (8, 64, 32), 128: (32, 256, 128)}.items():
        row = sweep[str(block)]
        assert (row["conv/global"], row["conv/sliding"], row["attn/global"], row["attn/sliding"]) \
            == (conv, conv, glob, slid)
    assert [c["budget_gib"] for c in data["concurrency"]] == [16.0, 32.0, 64.0]


@pytest.mark.parametrize("block", [16, 32, 128])
def test_json_block_size_option(capsys: pytest.CaptureFixture[str], block: int) -> None:
    code, out, _ = run(capsys, "plan", "inkling-975b", "--block-size", str(block), "--json",
                       "--gpu-memory", "40", "--max-model-len", "32768",
                       "--max-num-batched-tokens", "2048")
    assert code == 0
    data = json.loads(out)
    conv = {16: 4, 32: 8, 128: 32}[block]
    assert data["unification"]["conv/global"]["block_size"] == conv
    assert data["settings"]["max_model_len"] == 32768
    (c,) = data["concurrency"]
    assert c["budget_gib"] == 40.0 and c["steady"] >= c["reserve"] >= 1
    kinds = {k["name"]: k for k in data["per_request"]["kinds"]}
    # the CLI's default: two batches in flight (vLLM's async scheduling on GPUs)
    assert data["settings"]["in_flight_tokens"] == 2 * 2048
    assert kinds["conv/global"]["reserve_blocks"] == -(-(3 + 2 * 2048) // conv) + 1
    # the tail-rows manager: 3 tails + the prompt-end and junction checkpoints, whatever the budget
    assert kinds["conv/global"]["tail_reserve_blocks"] == 3 * (-(-3 // conv) + 1) + 2


def test_admission_share_before_and_after(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "inkling-975b", "--tp", "8", "--json")
    assert code == 0
    adm = json.loads(out)["admission"]
    assert adm["window"]["prompt_len"] == 8192
    assert adm["window"]["conv_share"] > 0.8 and adm["tail"]["conv_share"] < 0.02
    code, text, _ = run(capsys, "plan", "inkling-975b", "--tp", "8")
    assert "conv share of the admission charge: window 81.4% (2.06 GiB), tail 1.7% (8.25 MiB)" in text


def test_text_output_matches_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "inkling-975b", "--tp", "8")
    assert code == 0
    for needle in ["1792", "2048", "12.5%", "Page unification at --block-size 16",
                   "16384 B (16 KiB)", "Concurrent requests", "conv/sliding"]:
        assert needle in out
    _, js, _ = run(capsys, "plan", "inkling-975b", "--tp", "8", "--json")
    conc = json.loads(js)["concurrency"][0]
    assert f"16 GiB  " in out and str(conc["steady"]) in out


def test_config_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = {"hidden_size": 256, "num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 64,
           "swa_num_key_value_heads": 4, "swa_head_dim": 32, "sliding_window_size": 32,
           "sconv_kernel_size": 4, "local_layer_ids": [0, 1, 2], "max_position_embeddings": 4096}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    # D unpadded: conv pages of 4 * 1 * 384 * 2 = 3072 B do not divide the 4096 B attention pages
    code, _, err = run(capsys, "plan", str(path), "--tp", "2", "--padding", "none")
    assert code == 2 and "does not divide the largest page" in err
    code, out, _ = run(capsys, "plan", str(path), "--tp", "2", "--json", "--padding", "none",
                       "--pad-pages")
    assert code == 0
    data = json.loads(out)
    assert data["conv_layouts"]["global"]["head_size"] == 2 * 64 + 2 * 128
    assert data["unification"]["conv/global"]["padded"] is True
    assert data["page_bytes"] == 4096
    assert data["settings"]["max_model_len"] == 4096


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["plan", "inkling-975b", "--tp", "16"], "exceeds num_kv_heads"),
        (["plan", "inkling-975b", "--tp", "3"], "does not divide"),
        (["plan", "no-such-model"], "neither a preset"),
        (["plan", "inkling-975b", "--block-size", "0"], "block_size"),
        (["plan", "inkling-975b", "--gpu-memory", "-1"], "budget"),
        (["plan", "inkling-975b", "--dtype", "int8"], "unknown dtype"),
        (["plan", "inkling-975b", "--padding", "none"], "does not divide the largest page"),
        (["plan", "inkling-975b", "--tp", "x"], "invalid int value"),
        (["plan"], "CONFIG"),
        ([], "missing command"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("inkling-cache: error: ")
    assert words in err


def test_console_script_exit_codes() -> None:
    exe = shutil.which("inkling-cache")
    cmd = [exe] if exe else [sys.executable, "-m", "inkling_cache.cli"]
    ok = subprocess.run([*cmd, "plan", "inkling-975b", "--tp", "8", "--json"],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0
    assert json.loads(ok.stdout)["conv_layouts"]["global"]["head_size"] == 2048
    bad = subprocess.run([*cmd, "plan", "inkling-975b", "--tp", "16"],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("config, missing", [
    ({}, "hidden_size, num_hidden_layers, num_key_value_heads, head_dim, swa_num_key_value_heads, "
         "swa_head_dim, sliding_window"),
    ({"model_type": "inkling_mm_model", "text_config": {"hidden_size": 256, "head_dim": 64}},
     "num_hidden_layers, num_key_value_heads, swa_num_key_value_heads, swa_head_dim, sliding_window"),
])
def test_config_missing_required_fields_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: dict, missing: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = run(capsys, "plan", str(tmp_path))
    assert code == 2 and out == ""
    assert f"does not give {missing}:" in err and len(err.splitlines()) == 1


def test_alias_counts_as_the_required_field() -> None:
    from inkling_cache.cli import missing_fields

    assert missing_fields({"sliding_window_size": 32}) == missing_fields({"sliding_window": 32})
    assert "sliding_window" not in missing_fields({"sliding_window_size": 32})
    data = json.loads((Path(__file__).parent / "data" / "transformers_inkling_text_default.json").read_text())
    assert missing_fields(data) == []
