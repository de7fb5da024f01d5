"""The README's opening example starts a vLLM engine on the tiny Inkling and prints
what its comments say; its serving section names the main job's checkpoint and the
options the e2e server test uses."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from readme_check import check_opening_example  # (tools/, put on the path by conftest.py)

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_opening_example_prints_its_comments(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    env = dict(os.environ)
    env["VLLM_CACHE_ROOT"] = str(tmp_path / "vllm-cache")
    env["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"  # vLLM logs to stdout by default
    check_opening_example(README, tmp_path, timeout=900, env=env)


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


def test_serving_section_documents_model_and_the_cache() -> None:
    from inkling_vllm.demo.tiny import reference_cache_dir

    serve = _section(README.read_text(encoding="utf-8"), "Serve a model")
    assert "hatch run main --model DIR" in serve and "exit status 2" in serve
    # the documented place of the transformers-format copy is where it goes
    where = reference_cache_dir("/x").parent
    assert f"~/.cache/inkling-sconv/{where.name}/" in serve and where.parent.name == "inkling-sconv"
