"""Run the Triton kernels under the interpreter on machines without a GPU.

TRITON_INTERPRET must be set before triton (or any kernel module) is imported, so
it is set here, at collection time. On a CUDA machine the kernels are compiled.

Also: the hypothesis profile and the per-test RNG seeds (tools/pytest_seeds.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from hypothesis import settings

# Derandomised by default: CI runs the same examples every time (a failure replays
# from a clean clone); HYPOTHESIS_PROFILE=explore draws fresh ones.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# Per-test RNG seeds (and ``case_seed``), shared by every package's tests: tools/pytest_seeds.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from pytest_seeds import _seed_rngs, case_seed, pytest_runtest_makereport  # noqa: E402,F401
