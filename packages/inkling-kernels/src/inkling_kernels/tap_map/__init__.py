"""``sconv_tap_map``: the step's tap map, built once per step and KV-cache group.

It resolves where every earlier tap of every token comes from (codes in
:mod:`.kernel`), so that the group's conv launches read their taps through it: no
block-table walk and no same-step hazard search per launch.

- :func:`sconv_tap_map` — the op (``torch.ops.inkling.sconv_tap_map``, mutating the buffer);
- :mod:`.kernel` — the two Triton launches; :mod:`.reference` — the exact reference.
"""

from __future__ import annotations

from typing import Any

import torch

from .._dispatch import run_op, uses_triton
from ..batch import OP_SCHEMA, SconvBatch
from ..checks import check_tap_map_call
from .reference import reference_sconv_tap_map, sconv_tap_map_ref

__all__ = ["sconv_tap_map", "sconv_tap_map_ref"]


# The batch travels as SconvBatch.op_args() (OP_SCHEMA).
@torch.library.custom_op(
    "inkling::sconv_tap_map",
    mutates_args=("tap_map_out",),
    schema=f"({OP_SCHEMA}, Tensor(a!) tap_map_out) -> ()",
)
def _sconv_tap_map_op(*args: Any) -> None:
    batch, (tap_map_out,) = SconvBatch.split_op_args(args)
    _run(batch, tap_map_out)


def _run(batch: SconvBatch, tap_map_out: torch.Tensor) -> None:
    """The op's work on checked arguments."""
    assert batch.kernel_size is not None  # checked by sconv_tap_map
    if not uses_triton(batch.device):
        reference_sconv_tap_map(batch, batch.kernel_size, tap_map_out)
        return
    from .kernel import launch_sconv_tap_map

    launch_sconv_tap_map(batch, batch.kernel_size, tap_map_out)


@_sconv_tap_map_op.register_fake
def _sconv_tap_map_fake(*args: Any) -> None:
    batch, (tap_map_out,) = SconvBatch.split_op_args(args, check=True)
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
    run_op(_sconv_tap_map_op, *batch.op_args(), tap_map_out, direct=lambda: _run(batch, tap_map_out))
    return batch._replace_unchecked(tap_map=tap_map_out[: batch.num_tokens])  # checked above
