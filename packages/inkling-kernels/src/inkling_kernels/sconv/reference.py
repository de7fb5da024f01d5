"""Vectorised fp32 PyTorch references of ``fused_sconv``: the test oracle and the CPU path.

Semantics (docs/design.md §3.1). For one stream of a packed paged cache
``cache[num_blocks, H, N, D]`` (stream channels ``[stream_offset, stream_offset +
stream_width)`` of every head), each row ``t`` of ``x`` at absolute position
``p = positions[t]``:

1. stores ``x[t]`` into its slot ``slot_mapping[t]`` (skipped when the slot is
   negative or outside the cache);
2. for each tap ``i`` in ``[0, W)`` with source position ``src = p - (W-1) + i >= 0``
   reads the tap from ``x[t - (p - src)]`` when that row belongs to the current
   forward (``>= query_start[t]``), otherwise from the cache through the request's
   block table (a *pre-forward* tap; :mod:`inkling_kernels._reference_common`);
   accumulates ``weight[c, i] * tap`` in fp32;
3. ``out[t] = x[t] + act(acc)`` (``act(acc)`` when ``residual=False``), cast to
   ``x.dtype``.

Pre-forward taps see the cache *after* every write of the call: the hazard rule of
:mod:`inkling_kernels._reference_common` (a slot another request writes in this very
call reads that request's input).
"""

from __future__ import annotations

import torch

from .._reference_common import pre_forward_slots, tap_sources
from ..batch import SconvBatch
from ..checks import SconvProblem, _check_epilogue, check_conv_call, need_tensor

__all__ = ["causal_conv_ref", "fused_sconv_ref"]


def _activate(acc: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation == "silu":
        return torch.nn.functional.silu(acc)
    return acc


def causal_conv_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    activation: str | None = None,
    residual: bool = True,
) -> torch.Tensor:
    """Full-sequence depthwise causal conv of one sequence, fp32 math.

    x: [L, C] (any float dtype); weight: (C, W) or (C, 1, W), ``weight[:, W-1]``
    multiplies the current token. Returns ``x + act(conv(x))`` (or ``act(conv(x))``)
    in ``x.dtype``, [L, C]; positions before the sequence start read zero. Raises
    TypeError/ValueError saying what to change.
    """
    x = need_tensor("x", x)
    weight = need_tensor("weight", weight)
    _check_epilogue(activation, residual)
    if x.dim() != 2:
        raise ValueError(f"x must be [L, C], got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a float tensor, got {x.dtype}")
    if weight.dim() not in (2, 3) or (weight.dim() == 3 and weight.shape[1] != 1):
        raise ValueError(f"weight must be (C, W) or (C, 1, W), got shape {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be a float tensor, got {weight.dtype}")
    if weight.shape[-1] < 1:
        raise ValueError(f"kernel size W (weight.shape[-1]) must be >= 1, got {weight.shape[-1]}")
    w = weight.reshape(weight.shape[0], weight.shape[-1]).float()
    if w.shape[0] != x.shape[1]:
        raise ValueError(f"weight has {w.shape[0]} channels but x has {x.shape[1]}")
    length, kernel = x.shape[0], w.shape[1]
    xf = x.float()
    padded = torch.cat([xf.new_zeros(kernel - 1, xf.shape[1]), xf], dim=0)
    acc = xf.new_zeros(xf.shape)
    for i in range(kernel):
        acc += w[:, i] * padded[i : i + length]
    conv = _activate(acc, activation)
    return (xf + conv if residual else conv).to(x.dtype)


def reference_fused_sconv(
    x: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    prob: SconvProblem,
    stream_offset: int,
    stream_width: int,
    activation: str | None,
    residual: bool,
) -> torch.Tensor:
    """The reference on checked arguments (``prob`` from ``check_conv_call``). The
    batch's tap map is not used: the reference resolves every tap itself."""
    out = torch.empty_like(x)
    num_tokens, channels = prob.num_tokens, prob.channels
    if num_tokens == 0:
        return out
    n = batch.block_size
    lo, hi = stream_offset, stream_offset + stream_width
    heads = prob.num_heads
    w = prob.weight2d.float()

    # 1. insert every row of this call first (post-write semantics for all taps).
    slots = batch.slot_mapping
    written = (slots >= 0) & (slots < prob.num_slots)
    ws = slots[written]
    if ws.numel():
        cache[ws // n, :, ws % n, lo:hi] = x[written].view(-1, heads, stream_width)

    # 2. gather the W taps of every row, in fp32.
    seq = batch.seq_idx.long()
    rows = torch.arange(num_tokens, device=x.device)
    xf = x.float()
    acc = xf.new_zeros(num_tokens, channels)
    for i in range(prob.kernel_size):
        src, row, in_forward, pre_forward = tap_sources(
            batch.positions, rows, batch.query_start.long(), prob.kernel_size - 1 - i
        )
        tap = xf.new_zeros(num_tokens, channels)
        tap[in_forward] = xf[row[in_forward]]
        if bool(pre_forward.any()):
            slot, ok = pre_forward_slots(src[pre_forward], seq[pre_forward], batch.block_table, n, prob.num_slots)
            slot = torch.where(ok, slot, torch.zeros_like(slot))
            vals = cache[slot // n, :, slot % n, lo:hi].reshape(-1, channels).float()
            vals[~ok] = 0.0
            tap[pre_forward] = vals
        acc += w[:, i] * tap

    # 3. residual and cast.
    conv = _activate(acc, activation)
    out.copy_(xf + conv if residual else conv)
    return out


def fused_sconv_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    batch: SconvBatch,
    stream_offset: int,
    stream_width: int,
    *,
    activation: str | None = None,
    residual: bool = True,
) -> torch.Tensor:
    """Reference for :func:`inkling_kernels.fused_sconv` (same signature, checked).

    Mutates ``cache`` (the written slots' stream range only) and returns a new
    ``out`` [T, H*stream_width] in ``x.dtype``. Out-of-range slots are skipped on
    write and read as zero, exactly as the Triton kernel masks them.
    """
    prob = check_conv_call(x, weight, cache, batch, stream_offset, stream_width, activation, residual)
    return reference_fused_sconv(x, cache, batch, prob, stream_offset, stream_width, activation, residual)
