"""The README's opening example starts a vLLM engine on the tiny Inkling and prints
what its comments say; its serving section names the main job's checkpoint and the
options the e2e server test uses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_opening_example_prints_its_comments(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    text = README.read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, flags=re.S)
    assert match is not None, "the README has no python example"
    code = match.group(1)
    assert len(code.splitlines()) <= 25, "the opening example should stay short"
    claimed = [m.group(1).strip() for m in re.finditer(r"^[ \t]*print\(.*\)[ \t]+# (.+)$", code, flags=re.M)]
    assert claimed, "the example's print lines carry their output as a comment"
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ)
    env["VLLM_CACHE_ROOT"] = str(tmp_path / "vllm-cache")
    env["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"  # vLLM logs to stdout by default
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-5000:]
    assert run.stdout.split("\n")[:-1] == claimed, run.stdout


def test_serving_section_uses_the_main_jobs_checkpoint_and_loopback() -> None:
    from inkling_vllm.demo.main import tiny_checkpoint_dir

    serve = _section(README.read_text(encoding="utf-8"), "Serve a model")
    assert f"~/.cache/inkling-sconv/{tiny_checkpoint_dir().name}" in serve
    command = re.search(r"python -m inkling_vllm\.demo\.serve (.*?)\n(.*?)\n", serve)
    assert command is not None
    options = " ".join(command.groups())
    for option in ("--host 127.0.0.1", "--served-model-name tiny-inkling", "--dtype float32"):
        assert option in options
    for endpoint in ("/health", "/v1/models", "/v1/chat/completions", "/v1/completions"):
        assert f"127.0.0.1:8000{endpoint}" in serve
