"""fp32 PyTorch references of the fused short conv + residual add (+ RMSNorm).

They are the CPU paths of :func:`inkling_kernels.fused_sconv_add_rmsnorm` and
:func:`inkling_kernels.fused_sconv_add` (the same without the norm) and oracles of
their tests. They share the tap resolution of every reference
(:mod:`inkling_kernels._reference_common`) but gather differently from
:func:`inkling_kernels.fused_sconv_ref` (each token's whole window of ``W`` inputs in
one gather from a post-write view of the cache), so that the two check each other.

Rounding follows transformers' Inkling exactly (``InklingShortConvolution``, the
decoder layer's ``residual + ...`` and ``InklingRMSNorm``), ``dt`` being the
activation dtype::

    s        = dt(d + conv(d))                 # fp32 math, conv weight in fp32
    new_h    = dt(hidden + s)
    y        = dt(new_h * rsqrt(mean(new_h**2) + eps))     # (the norm op only)
    normed   = dt(norm_weight * y)             # weight applied as is (no 1 + w offset)

In float32 every ``dt(...)`` is exact.
"""

from __future__ import annotations

import torch

from .._reference_common import pre_forward_slots, tap_sources
from ..batch import SconvBatch
from ..checks import SconvProblem

__all__ = [
    "fused_sconv_add_ref",
    "fused_sconv_add_rmsnorm_ref",
    "rms_norm_ref",
]


def rms_norm_ref(x: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``InklingRMSNorm`` on the last dimension, result in ``x.dtype``.

    The normalisation runs in fp32 and is rounded to ``x.dtype`` before the weight
    multiplies it; the product is rounded to ``x.dtype`` again (transformers would
    return float32 for a float32 weight on a bf16 input; this op keeps ``x.dtype``).
    """
    xf = x.float()
    variance = xf.square().mean(dim=-1, keepdim=True)
    y = (xf * torch.rsqrt(variance + eps)).to(x.dtype)
    return (norm_weight.float() * y.float()).to(x.dtype)


def reference_sconv_add(
    hidden: torch.Tensor,
    d: torch.Tensor,
    prob: SconvProblem,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
) -> torch.Tensor:
    """``new_hidden = dt(hidden + dt(d + conv(d)))`` on checked arguments (``prob``
    from the launch's checks); ``C`` may be a channel shard of the hidden row.

    Stores ``d``'s rows in their slots (negative or out-of-range slots are skipped),
    then convolves each row over its window: taps of rows in this forward
    (``>= query_start``) come from ``d``, earlier ones from the cache *after* this
    call's writes (so a slot another request writes in this call reads its value);
    taps before position 0, outside the block table or outside the cache read zero.
    Returns ``[T, C]`` in ``d.dtype``.
    """
    num_tokens, channels = prob.num_tokens, prob.channels
    if num_tokens == 0:
        return torch.empty_like(d)
    n, width, heads, kernel = batch.block_size, stream_width, prob.num_heads, prob.kernel_size
    lo, hi = stream_offset, stream_offset + width
    num_slots = prob.num_slots

    # Write first: every later read sees this call's inputs.
    slots = batch.slot_mapping
    keep = (slots >= 0) & (slots < num_slots)
    if bool(keep.any()):
        kept = slots[keep]
        cache[kept // n, :, kept % n, lo:hi] = d[keep].reshape(-1, heads, width)

    # Window of every row: [T, W] taps, oldest first (distance W-1 .. 0).
    lags = torch.arange(kernel - 1, -1, -1, device=d.device)
    rows = torch.arange(num_tokens, device=d.device)
    src, row, from_d, pre = tap_sources(
        batch.positions[:, None], rows[:, None], batch.query_start.long()[:, None], lags[None, :]
    )
    req = batch.seq_idx.long()[:, None].expand(-1, kernel)
    slot, usable = pre_forward_slots(src, req, batch.block_table, n, num_slots)
    from_cache = pre & usable
    slot = torch.where(from_cache, slot, torch.zeros_like(slot))
    cached = cache[slot // n, :, slot % n, lo:hi].reshape(num_tokens, kernel, channels).float()

    window = torch.where(
        from_d[..., None],
        d.float()[row.clamp(min=0)],
        torch.where(from_cache[..., None], cached, torch.zeros_like(cached)),
    )  # [T, W, C]
    w = prob.weight2d.float().t()  # [W, C]
    conv = (window * w[None]).sum(dim=1)

    s = (d.float() + conv).to(d.dtype)
    return (hidden.float() + s.float()).to(d.dtype)


def reference_sconv_add_rmsnorm(
    hidden: torch.Tensor,
    d: torch.Tensor,
    prob: SconvProblem,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    norm_weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`reference_sconv_add`, then the norm of the whole row: ``(new_hidden,
    normed)``, both ``[T, C]`` in ``d.dtype``."""
    new_hidden = reference_sconv_add(hidden, d, prob, cache, batch, stream_offset, stream_width)
    return new_hidden, rms_norm_ref(new_hidden, norm_weight, eps)


def fused_sconv_add_rmsnorm_ref(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    norm_weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference for :func:`inkling_kernels.fused_sconv_add_rmsnorm` (checked; same
    signature)."""
    from . import check_sconv_add_rmsnorm_args

    prob = check_sconv_add_rmsnorm_args(hidden, d, weight, cache, batch, stream_offset, stream_width, norm_weight, eps)
    return reference_sconv_add_rmsnorm(hidden, d, prob, cache, batch, stream_offset, stream_width, norm_weight, float(eps))


def fused_sconv_add_ref(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
) -> torch.Tensor:
    """Reference for :func:`inkling_kernels.fused_sconv_add` (checked; same
    signature)."""
    from . import check_sconv_add_args

    prob = check_sconv_add_args(hidden, d, weight, cache, batch, stream_offset, stream_width)
    return reference_sconv_add(hidden, d, prob, cache, batch, stream_offset, stream_width)
