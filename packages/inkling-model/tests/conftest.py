"""Shared fixtures: unique owner names, a clean metadata provider, per-test RNG seeds."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

# The Triton paths (INKLING_KERNELS_CPU_BACKEND=triton) run under the interpreter on
# machines without a GPU; it must be on before triton is first imported.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from inkling_model import set_metadata_provider  # noqa: E402

_counter = itertools.count()


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """Owner names unique across the session (the registry is process-wide)."""

    def make(prefix: str = "layer") -> str:
        return f"{prefix}.{next(_counter)}"

    return make


@pytest.fixture(autouse=True)
def _reset_provider_and_threads() -> Iterator[None]:
    torch.set_num_threads(2)
    previous = set_metadata_provider(None)
    yield
    set_metadata_provider(previous)


# Per-test RNG seeds (and ``case_seed``), shared by every package's tests: tools/pytest_seeds.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from pytest_seeds import _seed_rngs, case_seed, pytest_runtest_makereport  # noqa: E402,F401
