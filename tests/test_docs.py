"""The user-facing documentation: the root README keeps the two set-up commands that CI
and new users run (and hatch.toml defines what they call), and no document reads as a
work log."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "docs" / "design.md",
        *sorted((ROOT / "packages").glob("*/README.md"))]


def test_root_readme_keeps_the_set_up_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for command in ("python3 -m pip install hatch && hatch run main",
                    "python3 -m pip install hatch && hatch run all:test"):
        assert f"\n    {command}\n" in readme, f"the root README lost the command {command!r}"
    envs = tomllib.loads((ROOT / "hatch.toml").read_text(encoding="utf-8"))["envs"]
    assert "main" in envs["default"]["scripts"]
    assert "test" in envs["all"]["scripts"]
    assert "python3 -m pip install hatch && hatch run all:test" in (ROOT / ".ci" / "run").read_text()


# "session 12", "sessions 15-17", "call 3", "round 7", "issue 9", a run's date
HISTORY = re.compile(r"\b(sessions? \d|calls? \d|rounds? \d|issue ?#?\d|20\d\d-\d\d-\d\d)", re.I)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_carry_no_work_history(doc: Path) -> None:
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
            if HISTORY.search(line)]
    assert not hits, f"{doc.relative_to(ROOT)} reads as a log (move measurements to a RESULTS file):\n" + "\n".join(hits)
