from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest
import torch

from inkling_model import set_metadata_provider

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
