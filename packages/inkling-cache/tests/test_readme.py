"""The README's opening example runs as a script and prints what its comments say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


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
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:-1] == claimed
