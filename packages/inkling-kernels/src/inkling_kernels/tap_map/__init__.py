"""``sconv_tap_map``: the step's tap map, built once per step and KV-cache group.

It resolves where every earlier tap of every token comes from (codes in
:mod:`.kernel`), so that the group's conv launches read their taps through it: no
block-table walk and no same-step hazard search per launch.

- :func:`sconv_tap_map` — the op (``torch.ops.inkling.sconv_tap_map``, mutating the buffer);
- :mod:`.kernel` — the two Triton launches; :mod:`.reference` — the exact reference.
"""

# No ``from __future__ import annotations``: torch.library infers the op schema from
# the real annotation objects.
from typing import Optional

import torch

from .._dispatch import uses_triton
from ..batch import SconvBatch
from ..checks import check_tap_map_call
from .reference import reference_sconv_tap_map, sconv_tap_map_ref

__all__ = ["sconv_tap_map", "sconv_tap_map_ref"]


# The batch travels as SconvBatch.op_args(): positions .. kernel_size.
@torch.library.custom_op("inkling::sconv_tap_map", mutates_args=("tap_map_out",))
def _sconv_tap_map_op(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_idx: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    tap_map: Optional[torch.Tensor],
    block_size: int,
    kernel_size: Optional[int],
    tap_map_out: torch.Tensor,
) -> None:
    batch = SconvBatch.from_op_args(
        positions, block_table, seq_idx, slot_mapping, query_start, tap_map, block_size, kernel_size
    )
    assert kernel_size is not None  # checked by sconv_tap_map
    if not uses_triton(positions.device):
        reference_sconv_tap_map(batch, kernel_size, tap_map_out)
        return
    from .kernel import launch_sconv_tap_map

    launch_sconv_tap_map(batch, kernel_size, tap_map_out)


@_sconv_tap_map_op.register_fake
def _sconv_tap_map_fake(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_idx: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    tap_map: Optional[torch.Tensor],
    block_size: int,
    kernel_size: Optional[int],
    tap_map_out: torch.Tensor,
) -> None:
    batch = SconvBatch.from_op_args(
        positions, block_table, seq_idx, slot_mapping, query_start, tap_map, block_size, kernel_size,
        check=True,
    )
    check_tap_map_call(batch, tap_map_out)


def sconv_tap_map(batch: SconvBatch, tap_map_out: torch.Tensor) -> SconvBatch:
    """Fill the step's tap map ``tap_map_out[:T]`` from ``batch`` (two launches) and
    return the batch carrying it.

    Build it once per step and KV-cache group, after the per-token metadata; every
    conv launch of the group then reads it. Entry ``[t, k]`` says where the tap at
    distance ``k + 1`` of row ``t`` comes from: ``-1`` none; ``-(r + 2)`` row ``r`` of
    x; ``s + ((u + 1) << 32)`` cache slot ``s``, or, when row ``u >= 0`` of the same
    call writes slot ``s`` (a same-step prefix hit, any alignment), that row of x.

    Args:
        batch: the step's batch; it must name its ``kernel_size`` W.
        tap_map_out: [>= T, W-1] int64, contiguous; a persistent buffer (its address
            survives across steps, so CUDA graphs replay).
    """
    check_tap_map_call(batch, tap_map_out)
    torch.ops.inkling.sconv_tap_map(*batch.op_args(), tap_map_out)
    return batch._replace_unchecked(tap_map=tap_map_out[: batch.num_tokens])  # checked above
