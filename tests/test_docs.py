"""The user-facing documentation: the root README keeps the two set-up commands that CI
and new users run (and hatch.toml defines what they call), its package table names what
each pyproject declares, and no document reads as a work log."""

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


def _name(requirement: str) -> str:
    """``"torch>=2.4"`` -> ``"torch"``."""
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


def _package_table() -> dict[str, str]:
    """The root README's package table: package -> its "depends on" cell."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| \[`(inkling-[a-z]+)`\]\([^)]*\) \|.*\| ([^|]*) \|$", readme, re.M)
    return {name: cell for name, cell in rows}


def test_root_readme_package_table_matches_the_pyprojects() -> None:
    table = _package_table()
    packages = sorted(p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml"))
    assert sorted(table) == packages, f"the root README's package table lists {sorted(table)}, not {packages}"
    for name, cell in table.items():
        project = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        required = {_name(r) for r in project.get("dependencies", [])}
        extras = project.get("optional-dependencies", {})
        optional = {_name(r) for reqs in extras.values() for r in reqs}
        named = set(re.findall(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*", cell.lower()))
        missing = sorted(r for r in required | optional if r not in named)
        assert not missing, f"the root README's row for {name} does not name {missing} (its pyproject's dependencies)"
        for extra in extras:
            assert f"`{extra}`" in cell, f"the root README's row for {name} does not name its extra `{extra}`"
        siblings = {n for n in named if n.startswith("inkling-")}
        undeclared = sorted(siblings - required - optional)
        assert not undeclared, f"the root README's row for {name} names {undeclared}, undeclared in its pyproject"
        if not required | optional:
            assert cell.strip() == "—", f"{name} declares no dependencies; its row says {cell!r}"


# "session 12", "sessions 15-17", "call 3", "round 7", "issue 9", a run's date
HISTORY = re.compile(r"\b(sessions? \d|calls? \d|rounds? \d|issue ?#?\d|20\d\d-\d\d-\d\d)", re.I)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_carry_no_work_history(doc: Path) -> None:
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
            if HISTORY.search(line)]
    assert not hits, f"{doc.relative_to(ROOT)} reads as a log (move measurements to a RESULTS file):\n" + "\n".join(hits)
