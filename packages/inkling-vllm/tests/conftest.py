"""Per-test RNG seeds, shared with the other packages' tests (tools/pytest_seeds.py; the e2e
tests under the repository's tests/ seed their engines themselves)."""

from __future__ import annotations

import sys
from pathlib import Path

# Per-test RNG seeds (and ``case_seed``), shared by every package's tests: tools/pytest_seeds.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from pytest_seeds import _seed_rngs, case_seed, pytest_runtest_makereport  # noqa: E402,F401
