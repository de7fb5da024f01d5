"""Run the Triton kernels under the interpreter on machines without a GPU.

TRITON_INTERPRET must be set before triton (or any kernel module) is imported, so
it is set here, at collection time. On a CUDA machine the kernels are compiled.

Also: per-test RNG seeds (below) and the hypothesis profile.
"""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Callable

import pytest
import torch
from hypothesis import settings

# Derandomised by default: CI runs the same examples every time (a failure replays
# from a clean clone); HYPOTHESIS_PROFILE=explore draws fresh ones.
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

SEEDED = "random, torch"


def _seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # CPU and every CUDA device


# --- reproducible randomness ---------------------------------------------------
# Every test starts from RNGs seeded by its own id (file name, test name and
# parameters: the same in every process and from any rootdir, unlike hash() of a
# str, which PYTHONHASHSEED randomises per process). A failing test prints its seeds.
_SEEDS = pytest.StashKey[list]()


def stable_seed(*parts: object) -> int:
    """A 32-bit seed from ``parts`` (their ``str``), equal in every process."""
    return zlib.crc32("\x1f".join(map(str, parts)).encode())


def _test_id(item: pytest.Item) -> str:
    return "::".join([item.path.name, *item.nodeid.split("::")[1:]])


@pytest.fixture(autouse=True)
def _seed_rngs(request: pytest.FixtureRequest) -> None:
    seed = stable_seed(_test_id(request.node))
    request.node.stash[_SEEDS] = [f"{SEEDED} seeded with {seed} (stable_seed of the test id)"]
    _seed_all(seed)


@pytest.fixture
def case_seed(request: pytest.FixtureRequest) -> Callable[..., int]:
    """``case_seed(*parts)``: :func:`stable_seed` of ``parts``, shown if the test fails."""

    def make(*parts: object) -> int:
        seed = stable_seed(*parts)
        request.node.stash.setdefault(_SEEDS, []).append(f"case_seed{parts!r} = {seed}")
        return seed

    return make


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    if report.failed and item.stash.get(_SEEDS, None):
        report.sections.append(("seeds", "\n".join(item.stash[_SEEDS])))
    return report
