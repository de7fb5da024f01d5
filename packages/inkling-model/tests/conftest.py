"""Shared fixtures: unique owner names, a clean metadata provider, per-test RNG seeds."""

from __future__ import annotations

import itertools
import os
import random
import zlib
from collections.abc import Callable, Iterator

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
