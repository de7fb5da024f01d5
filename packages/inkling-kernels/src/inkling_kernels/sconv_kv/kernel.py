"""Launcher of ``fused_sconv_kv``: the fused conv kernel of :mod:`inkling_kernels.sconv`
with two streams (``STREAMS=2``).

Each program takes ``BLOCK_T`` rows times ``BLOCK_C`` channels of one head, resolves
its rows' taps once (the step's tap map, or without one the shared tap resolution and
hazard rule of :mod:`inkling_kernels._triton_common`), then stores and convolves its
K tile and its V tile, each at its own offset in D and read through its own row
stride. Grid, tiles and the tap-map decision are those of one stream of the launch's
shape (``sconv.kernel.choose_config``, ``MAP_MIN_WORK``); nothing is allocated but the
two outputs (and, for a large launch without a map, its map), nothing syncs with the
host: the launch replays under CUDA graphs. Prefill-sized mapped launches (``sconv.kernel.rows_batch``:
at least ``ROWS_MIN_TOKENS`` rows, mostly prompt rows) run the
row-register kernel instead (:mod:`inkling_kernels.sconv.rows_kernel`), one launch whose
grid's third axis picks K or V (a launch each if their row strides or weight layouts
differ).
"""

from __future__ import annotations

import torch

from ..batch import SconvBatch
from ..checks import SconvProblem, check_kv_call, outputs_for
from ..sconv.kernel import ConvStream, SconvConfig, launch_conv_streams

__all__ = ["fused_sconv_kv_triton"]


def launch_fused_sconv_kv(
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
    *,
    config: SconvConfig | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    auto_map: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate the outputs and launch once, on arguments that passed
    :func:`inkling_kernels.checks.check_kv_call` (which made ``probs``)."""
    k_out, v_out = out if out is not None else (k.new_empty(k.shape), v.new_empty(v.shape))
    streams = (
        ConvStream(k, probs[0].weight2d, k_out, k_offset),
        ConvStream(v, probs[1].weight2d, v_out, v_offset),
    )
    launch_conv_streams(
        streams, cache, batch, probs[0], head_dim, activation, residual, config=config, auto_map=auto_map
    )
    return k_out, v_out


def fused_sconv_kv_triton(
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
    config: SconvConfig | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    auto_map: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check and launch the Triton kernel directly, whatever the device (tests run CPU
    tensors under ``TRITON_INTERPRET=1``; benchmarks pass ``config``). Same contract
    as :func:`inkling_kernels.fused_sconv_kv`; ``out`` (two contiguous tensors shaped
    like k) receives the results (tests poison them first)."""
    probs = check_kv_call(k, v, k_weight, v_weight, cache, batch, k_offset, v_offset, head_dim, activation, residual)
    outputs = outputs_for(
        "out", out, k, (("k", k), ("v", v), ("k_weight", k_weight), ("v_weight", v_weight), ("cache", cache))
    )
    return launch_fused_sconv_kv(
        k, v, cache, batch, probs, k_offset, v_offset, head_dim, activation, residual,
        config=config, out=outputs, auto_map=auto_map,
    )
