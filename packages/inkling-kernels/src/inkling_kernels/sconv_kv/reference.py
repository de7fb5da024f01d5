"""fp32 PyTorch reference of ``fused_sconv_kv``: the K and V convs as two
``fused_sconv`` reference calls (the test oracle and the CPU path).

The two streams occupy disjoint ranges of the cache's D, so writing all of K's rows,
convolving K, then doing the same for V equals one launch that inserts both streams'
rows and then convolves ("insert the whole batch, then convolve", docs/design.md
§3.2): a stream's taps read only its own range.
"""

from __future__ import annotations

import torch

from ..batch import SconvBatch
from ..checks import SconvProblem, check_kv_call
from ..sconv.reference import reference_fused_sconv

__all__ = ["fused_sconv_kv_ref"]


def reference_fused_sconv_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    probs: tuple[SconvProblem, SconvProblem],
    k_offset: int,
    v_offset: int,
    head_dim: int,
    activation: str | None,
    residual: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference on checked arguments (``probs`` from ``check_kv_call``)."""
    return tuple(  # type: ignore[return-value]
        reference_fused_sconv(x.contiguous(), cache, batch, prob, offset, head_dim, activation, residual)
        for x, prob, offset in ((k, probs[0], k_offset), (v, probs[1], v_offset))
    )


def fused_sconv_kv_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_weight: torch.Tensor,
    v_weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    k_offset: int,
    v_offset: int,
    head_dim: int,
    *,
    activation: str | None = None,
    residual: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for :func:`inkling_kernels.fused_sconv_kv` (same signature, checked):
    ``fused_sconv_ref`` of K, then of V. Mutates ``cache`` (both streams' ranges of
    the written slots); returns new contiguous ``(k_out, v_out)``."""
    probs = check_kv_call(k, v, k_weight, v_weight, cache, batch, k_offset, v_offset, head_dim, activation, residual)
    return reference_fused_sconv_kv(k, v, cache, batch, probs, k_offset, v_offset, head_dim, activation, residual)
