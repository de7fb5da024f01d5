"""Per-test RNG seeds (the e2e tests under the repository's tests/ seed their engines
themselves)."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

import pytest
import torch

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
