"""Shared test settings: a small hypothesis CI profile (2-core CI machine, a few minutes
at most), derandomised so that every run draws the same examples (HYPOTHESIS_PROFILE=explore
draws fresh ones), and per-test RNG seeds."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

settings.register_profile(
    "inkling-cache", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
    derandomize=True, print_blob=True,
)
settings.register_profile(
    "explore", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "inkling-cache"))

# Per-test RNG seeds (and ``case_seed``), shared by every package's tests: tools/pytest_seeds.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from pytest_seeds import _seed_rngs, case_seed, pytest_runtest_makereport  # noqa: E402,F401
