"""The check every package's ``tests/test_readme.py`` runs on its README (imported from
the repository's tools/, which each package's ``tests/conftest.py`` puts on the path).

The README's first ``python`` block is its opening example: at most 25 lines, whose
``print(...)`` lines carry what they print as a trailing comment. It must run as a
script from an empty folder and print exactly those lines.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["check_opening_example"]


def check_opening_example(readme: Path, tmp_path: Path, *, timeout: float = 120,
                          env: Mapping[str, str] | None = None) -> None:
    """Run ``readme``'s opening example in ``tmp_path`` and assert it prints what its
    comments say (``env``: the script's environment, default the test's)."""
    text = readme.read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, flags=re.S)
    assert match is not None, "the README has no python example"
    code = match.group(1)
    assert len(code.splitlines()) <= 25, "the opening example should stay short"
    claimed = [m.group(1).strip() for m in re.finditer(r"^[ \t]*print\(.*\)[ \t]+# (.+)$", code, flags=re.M)]
    assert claimed, "the example's print lines carry their output as a comment"
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=None if env is None else dict(env),
                         capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-5000:]
    assert run.stdout.split("\n")[:-1] == claimed, run.stdout
