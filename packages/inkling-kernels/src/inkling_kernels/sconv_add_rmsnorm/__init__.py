"""Fused short conv + outer residual add + RMSNorm, for the ATTN and MLP streams.

In every Inkling decoder layer the attention and MLP outputs ``d`` pass through a
short conv and are added to the residual stream, which the next RMSNorm reads::

    new_hidden = hidden + (d + conv(d))       # conv: the paged causal conv of fused_sconv
    normed     = rmsnorm(new_hidden) * norm_weight

:func:`fused_sconv_add_rmsnorm` does all of it in one pass over the rows (one Triton
launch on CUDA; a program owns whole rows, since RMSNorm needs the full row), and
stores ``d``'s rows in their cache slots exactly as :func:`inkling_kernels.fused_sconv`
does, with the same semantics for pre-forward taps (post-write: correct under
same-step prefix hits in any batch order).

Where it applies: the norm needs the full hidden row, so the conv must see it. With
the packed layout's tensor parallelism the ATTN/MLP conv runs on the rank's hidden
shard (``hidden/tp`` channels) before the all-gather; there the row is partial and
this op does not apply (use ``fused_sconv`` on the shard, gather, then norm). It
applies at ``tp == 1``, or wherever the conv's channels are the whole hidden row.
The op checks that ``norm_weight`` covers all of ``d``'s channels; the model layer
checks the layout.
"""

# No ``from __future__ import annotations``: torch.library infers the op schema from
# the real annotation objects.
import math
from typing import Optional, cast

import torch

from .._validation import SconvProblem, check_fused_sconv_args, check_tap_map_for_call
from ..ops import uses_triton
from .reference import fused_sconv_add_rmsnorm_ref, rms_norm_ref

__all__ = [
    "check_sconv_add_rmsnorm_args",
    "fused_sconv_add_rmsnorm",
    "fused_sconv_add_rmsnorm_ref",
    "rms_norm_ref",
]


def check_sconv_add_rmsnorm_args(
    hidden: object,
    d: object,
    weight: object,
    cache: object,
    positions: object,
    block_table: object,
    seq_idx: object,
    slot_mapping: object,
    query_start: object,
    stream_offset: object,
    stream_width: object,
    block_size: object,
    norm_weight: object,
    eps: object,
) -> SconvProblem:
    """Validate a call; raise TypeError/ValueError saying what to change.

    The conv arguments are checked exactly as for ``fused_sconv`` (``d`` in the
    role of ``x``); then ``hidden``, ``norm_weight`` and ``eps``. Reads only shapes,
    dtypes, strides and devices (safe under CUDA-graph capture).
    """
    prob = check_fused_sconv_args(
        d, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, None, True,
    )
    d = cast(torch.Tensor, d)  # checked above
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"hidden must be a torch.Tensor, got {type(hidden).__name__}")
    if hidden.shape != d.shape:
        raise ValueError(
            f"hidden has shape {tuple(hidden.shape)} but d has {tuple(d.shape)}: both are "
            "[T, C] rows of the residual stream and the sublayer output"
        )
    if hidden.dtype != d.dtype:
        raise TypeError(f"hidden dtype {hidden.dtype} differs from d dtype {d.dtype}")
    if hidden.device != d.device:
        raise ValueError(f"hidden is on {hidden.device} but d is on {d.device}")
    if not hidden.is_contiguous():
        raise ValueError("hidden must be contiguous: pass hidden.contiguous()")
    if not isinstance(norm_weight, torch.Tensor):
        raise TypeError(f"norm_weight must be a torch.Tensor, got {type(norm_weight).__name__}")
    if norm_weight.dim() != 1 or norm_weight.shape[0] != prob.channels:
        raise ValueError(
            f"norm_weight must have shape [C] = [{prob.channels}] (the full row the norm "
            f"reads), got {tuple(norm_weight.shape)}; the fused op needs the conv to see "
            "the whole hidden row (tp == 1 for the ATTN/MLP streams)"
        )
    if norm_weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"norm_weight must be a float tensor, got {norm_weight.dtype}")
    if norm_weight.device != d.device:
        raise ValueError(f"norm_weight is on {norm_weight.device} but d is on {d.device}")
    if prob.channels > 1 and norm_weight.stride(0) != 1:
        raise ValueError("norm_weight must be contiguous: pass norm_weight.contiguous()")
    if isinstance(eps, bool) or not isinstance(eps, (float, int)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite float >= 0, got {eps}")
    return prob


@torch.library.custom_op("inkling::fused_sconv_add_rmsnorm", mutates_args=("cache",))
def _fused_sconv_add_rmsnorm_op(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_idx: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    stream_offset: int,
    stream_width: int,
    block_size: int,
    norm_weight: torch.Tensor,
    eps: float,
    tap_map: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    prob = check_sconv_add_rmsnorm_args(
        hidden, d, weight, cache, positions, block_table, seq_idx, slot_mapping,
        query_start, stream_offset, stream_width, block_size, norm_weight, eps,
    )
    if not uses_triton(d.device):  # the reference resolves taps itself: no map
        return fused_sconv_add_rmsnorm_ref(
            hidden, d, prob, cache, positions, block_table, seq_idx, slot_mapping,
            query_start, stream_offset, stream_width, block_size, norm_weight, float(eps),
        )
    from .kernel import launch_sconv_add_rmsnorm  # Triton only off the CPU path

    return launch_sconv_add_rmsnorm(
        hidden, d, prob, cache, positions, block_table, seq_idx, slot_mapping,
        query_start, stream_offset, stream_width, block_size, norm_weight, float(eps),
        tap_map=tap_map,
    )


@_fused_sconv_add_rmsnorm_op.register_fake
def _fused_sconv_add_rmsnorm_fake(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_idx: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    stream_offset: int,
    stream_width: int,
    block_size: int,
    norm_weight: torch.Tensor,
    eps: float,
    tap_map: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    prob = check_sconv_add_rmsnorm_args(
        hidden, d, weight, cache, positions, block_table, seq_idx, slot_mapping,
        query_start, stream_offset, stream_width, block_size, norm_weight, eps,
    )
    if tap_map is not None:
        check_tap_map_for_call(tap_map, prob, d.device)
    return torch.empty_like(d), torch.empty_like(d)


def fused_sconv_add_rmsnorm(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    cache: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_idx: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    stream_offset: int,
    stream_width: int,
    block_size: int,
    norm_weight: torch.Tensor,
    eps: float,
    *,
    tap_map: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden + d + conv(d), rmsnorm(that) * norm_weight)`` in one pass.

    Args:
        hidden: [T, C] residual stream, bf16/fp16/fp32, contiguous (d's dtype).
        d: [T, C] sublayer output (attention after o_proj, or the MLP/MoE output),
            contiguous; ``C = H * stream_width`` must be the full hidden row.
        weight: (C, W) or (C, 1, W) conv weight, fp32 or d.dtype; ``weight[:, W-1]``
            multiplies the current token.
        cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size: exactly as for
            :func:`inkling_kernels.fused_sconv`; ``cache`` is mutated (each valid
            slot's stream range receives its row of ``d``).
        norm_weight: [C] the following RMSNorm's weight (any float dtype), applied
            as transformers' ``InklingRMSNorm`` does: ``w * dt(x * rsqrt(mean(x^2) + eps))``.
        eps: the norm's epsilon (``rms_norm_eps``).
        tap_map: optional, the step's tap map (:func:`inkling_kernels.sconv_tap_map`
            on the same metadata), exactly as for ``fused_sconv``: the CUDA kernel
            then reads each tap's source from it instead of resolving it.

    Returns:
        ``(new_hidden, normed)``, two new [T, C] tensors in d.dtype, rounded at the
        points where transformers rounds (see :mod:`.reference`).
    """
    # Checked here too so that bad input raises the errors above, not the dispatcher's.
    prob = check_sconv_add_rmsnorm_args(
        hidden, d, weight, cache, positions, block_table, seq_idx, slot_mapping,
        query_start, stream_offset, stream_width, block_size, norm_weight, eps,
    )
    if tap_map is not None:
        check_tap_map_for_call(tap_map, prob, d.device)
    return torch.ops.inkling.fused_sconv_add_rmsnorm(
        hidden, d, weight, cache, positions, block_table, seq_idx, slot_mapping, query_start,
        stream_offset, stream_width, block_size, norm_weight, float(eps), tap_map,
    )
