"""The README's examples run: the opening one as a script, printing what its comments
say; the runtime one prints what it says and computes the conv."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import torch
from readme_check import check_opening_example  # (tools/, put on the path by conftest.py)

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
    check_opening_example(README, tmp_path, timeout=300)
