"""The README's examples run: the opening one as a script, printing what its comments
say; the runtime one prints what it says and computes the conv."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import torch

from inkling_kernels import causal_conv_ref

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_runtime_example():
    text = README.read_text(encoding="utf-8")
    (code,) = [c for c in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "rt.block_table_row" in c]
    namespace: dict = {"__name__": "readme_example"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), namespace)
    printed = out.getvalue().strip()
    claimed = re.search(r'print\(rt\.block_table_row\("a"\), rt\.num_free_blocks\)\s+# (.*?):', code)
    assert claimed is not None and printed == claimed.group(1)
    conv, x, outs = namespace["conv"], namespace["x"], namespace["outs"]
    torch.testing.assert_close(torch.cat(outs["a"]), causal_conv_ref(x["a"], conv.weight))
    torch.testing.assert_close(torch.cat(outs["b"]), causal_conv_ref(x["b"], conv.weight))
    assert torch.equal(namespace["same"], x["a"])


def test_readme_opening_example_prints_its_comments(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, flags=re.S)
    assert match is not None, "the README has no python example"
    code = match.group(1)
    assert len(code.splitlines()) <= 25, "the opening example should stay short"
    claimed = [m.group(1).strip() for m in re.finditer(r"^[ \t]*print\(.*\)[ \t]+# (.+)$", code, flags=re.M)]
    assert claimed, "the example's print lines carry their output as a comment"
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:-1] == claimed
