"""Per-test RNG seeds, shared with the other packages' tests (tools/pytest_seeds.py; the e2e
tests under the repository's tests/ seed their engines themselves)."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Per-test RNG seeds (and ``case_seed``), shared by every package's tests: tools/pytest_seeds.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from pytest_seeds import _seed_rngs, case_seed, pytest_runtest_makereport  # noqa: E402,F401


@pytest.fixture(scope="module")
def vllm_ctx() -> Iterator[Any]:
    """A default ``VllmConfig`` made current, and vLLM's distributed state at world size 1
    (set up here unless a test before set it up already)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    config = VllmConfig()
    owns = not ps.model_parallel_is_initialized()
    with tempfile.TemporaryDirectory() as tmp, set_current_vllm_config(config):
        if owns:
            ps.init_distributed_environment(
                world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{tmp}/init", backend="gloo"
            )
            ps.initialize_model_parallel(1, 1)
        try:
            yield config
        finally:
            if owns:
                ps.destroy_model_parallel()
                ps.destroy_distributed_environment()
