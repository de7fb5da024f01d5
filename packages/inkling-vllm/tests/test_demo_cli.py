"""The demo commands' plain parts, without an engine: the main job's --help, the
serve command's model argument, where the transformers-format copy of a release
checkpoint goes (never into the checkpoint), and the quiet exit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inkling_vllm.demo.main import DESCRIPTION, PROG
from inkling_vllm.demo.serve import model_argument


def test_main_help_names_the_command_and_is_plain_text() -> None:
    out = subprocess.run([sys.executable, "-m", "inkling_vllm.demo.main", "--help"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith(f"usage: {PROG} ") and PROG == "python -m inkling_vllm.demo.main"
    assert "hatch run main" in out
    for markup in (":func:", ":mod:", ":data:", "``"):
        assert markup not in out, markup
    # --model and the cache folder are documented
    assert "--model DIR" in out and "~/.cache/inkling-sconv" in out and "INKLING_CACHE_DIR" in out
    assert DESCRIPTION.splitlines()[0] in out


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_main_refuses_a_bad_token_count_before_anything_starts(value: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "inkling_vllm.demo.main", "--max-tokens", value],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--max-tokens: expected a whole number >= 1" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""  # not even the first step began


@pytest.mark.parametrize("args, model", [
    (["/m", "--port", "8000"], "/m"),
    (["--port", "8000", "--model", "/m"], "/m"),
    (["--model=/m"], "/m"),
    (["--port", "8000"], None),
    (["/m", "--help"], None),
])
def test_serve_model_argument(args: list[str], model: str | None) -> None:
    assert model_argument(args) == model


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inkling_vllm.demo.tiny import REFERENCE_DIR, build_tiny_checkpoint

    path = build_tiny_checkpoint(tmp_path_factory.mktemp("ref") / "tiny", variant="release")
    shutil.rmtree(path / REFERENCE_DIR)  # as a downloaded release checkpoint: no copy beside it
    return path


def _listing(path: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*")}


def test_reference_copy_goes_to_the_cache_not_the_checkpoint(release: Path, tmp_path: Path) -> None:
    from safetensors import safe_open

    from inkling_vllm.demo.tiny import reference_cache_dir, reference_checkpoint

    before = _listing(release)
    ref = reference_checkpoint(release, cache_dir=tmp_path)
    assert _listing(release) == before  # nothing written into the checkpoint
    assert ref == reference_cache_dir(release, tmp_path) and ref.parent == tmp_path
    assert json.loads((ref / "config.json").read_text())["model_type"] == "inkling_text"
    with safe_open(str(ref / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" in f.keys() and not any(k.startswith("model.llm.") for k in f.keys())
    # reused as it is, until the checkpoint changes
    stamp = (ref / "model.safetensors").stat().st_mtime_ns
    assert reference_checkpoint(release, cache_dir=tmp_path) == ref
    assert (ref / "model.safetensors").stat().st_mtime_ns == stamp
    config = release / "config.json"
    config.write_text(config.read_text() + "\n")
    assert reference_cache_dir(release, tmp_path) != ref


def test_quiet_exit_drops_only_what_comes_after_the_program(tmp_path: Path) -> None:
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write('teardown noise\\n'))\n"
        "from inkling_vllm.demo import quiet\n"
        "if sys.argv[1] == 'quiet': quiet.silence_stderr_at_exit()\n"
        "sys.stderr.write('program output\\n'); sys.stderr.flush()\n"
    )
    loud = subprocess.run([sys.executable, "-c", code, "loud"], capture_output=True, text=True, timeout=60)
    calm = subprocess.run([sys.executable, "-c", code, "quiet"], capture_output=True, text=True, timeout=60)
    assert loud.stderr == "program output\nteardown noise\n"
    assert calm.stderr == "program output\n"


def test_main_reports_an_engine_that_does_not_start(release: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """An engine that fails to start: one line naming the error and exit status 3 (with
    --verbose the traceback as well), after the checkpoint check passed."""
    import vllm

    from inkling_vllm.demo import main as demo_main

    def no_engine(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no device for the engine")

    for name, value in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_CACHE_ROOT", str(release.parent / "vllm")),
                        ("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(vllm, "LLM", no_engine)
    assert demo_main.main(["--model", str(release), "--verbose"]) == demo_main.ENGINE_FAILED == 3
    err = capsys.readouterr().err
    assert "the vLLM engine did not start: RuntimeError: no device for the engine" in err, err
    assert "Traceback" in err  # --verbose
