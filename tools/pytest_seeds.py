"""Reproducible randomness for every package's tests (imported by each
``packages/*/tests/conftest.py``; one copy instead of four).

Every test starts from RNGs seeded by its own id: the file name, the test name and its
parameters. The seed is the same in every process and from any rootdir, unlike
``hash()`` of a str, which PYTHONHASHSEED randomises per process. Python's ``random``
is always seeded, and torch (CPU and every CUDA device) too when the environment has
it: the inkling-cache environment must not. A failing test prints its seeds, and those
that ``case_seed`` handed out, in a "seeds" section of its report.

A conftest takes it with::

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
    from pytest_seeds import _seed_rngs, case_seed, pytest_runtest_makereport  # noqa: E402,F401
"""

from __future__ import annotations

import importlib.util
import random
import zlib
from collections.abc import Callable

import pytest

__all__ = ["_seed_rngs", "case_seed", "pytest_runtest_makereport", "stable_seed"]

_HAS_TORCH = importlib.util.find_spec("torch") is not None
SEEDED = "random, torch" if _HAS_TORCH else "random"
_SEEDS = pytest.StashKey[list]()


def _seed_all(seed: int) -> None:
    random.seed(seed)
    if _HAS_TORCH:
        import torch

        torch.manual_seed(seed)  # CPU and every CUDA device


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
