"""The README's opening example runs as a script and prints what its comments say."""

from __future__ import annotations

from pathlib import Path

from readme_check import check_opening_example  # (tools/, put on the path by conftest.py)

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_opening_example_prints_its_comments(tmp_path: Path) -> None:
    check_opening_example(README, tmp_path)
