"""Triton kernel of :func:`inkling_kernels.gathered_rms_norm`.

Grid ``(cdiv(T, BLOCK_T),)``: a program owns ``BLOCK_T`` rows. It reads a row's ``tp``
pieces (``shards[r, t, :]``, contiguous) together, as ``[BLOCK_T, BLOCK_P, BLOCK_S]``
tiles (``BLOCK_P = pow2_ceil(tp)`` pieces side by side, ``BLOCK_S`` channels of each):
``cdiv(S, BLOCK_S)`` tiles a row, issued in one unrolled pass with the weight's tiles so
that every load of a decode step's single row is in flight at once. ``BLOCK_S`` divides
``S`` where a power of two large enough does (``S = 768`` at tp 8: three exact tiles of
8 x 256, no masked lanes). The squares add up lane by lane (fp32; one cross-lane
reduction a row), and the tiles kept in registers are normalised into the contiguous
output row. A row is read once. Rounding as
:func:`inkling_kernels.sconv_add_rmsnorm.rms_norm_ref`: ``dt(w * dt(x * rstd))``.
Nothing is allocated but the output and nothing syncs with the host: the launch replays
under CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._triton_common import INTERPRETER_ROWS, cdiv, is_interpreter, pow2_ceil
from ..checks import check_gathered_rms_norm_args

__all__ = ["GatheredNormConfig", "choose_gathered_norm_config", "gathered_rms_norm_triton"]


@triton.jit(do_not_specialize=["num_tokens"])
def _gathered_rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, num_tokens, eps,
    TP: tl.constexpr, S: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr,
):
    NC: tl.constexpr = (S + BLOCK_S - 1) // BLOCK_S  # tiles a row
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    r3 = rows.to(tl.int64)[:, None, None]
    p3 = tl.arange(0, BLOCK_P)[None, :, None]
    cols = tl.arange(0, BLOCK_S)[None, None, :]
    rmask = (r3 < num_tokens) & (p3 < TP)
    # every tile of the rows and of the weight loaded up front (a static loop: the loads
    # are in flight together and the tiles stay in registers for the second pass)
    kept = ()
    weights = ()
    sq = tl.zeros([BLOCK_T, BLOCK_P, BLOCK_S], dtype=tl.float32)  # squares per lane: one reduction
    for k in tl.static_range(NC):
        c = k * BLOCK_S + cols
        m = rmask & (c < S)
        x = tl.load(x_ptr + (p3 * num_tokens + r3) * S + c, mask=m, other=0.0)
        kept = kept + (x,)
        weights = weights + (tl.load(w_ptr + p3 * S + c, mask=(p3 < TP) & (c < S), other=0.0),)
        xf = x.to(tl.float32)
        sq += xf * xf
    total = tl.sum(tl.sum(sq, axis=2), axis=1)
    rstd = (1.0 / tl.sqrt_rn(total / (TP * S) + eps))[:, None, None]
    for k in tl.static_range(NC):
        c = k * BLOCK_S + cols
        m = rmask & (c < S)
        x = kept[k]
        y = (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
        tl.store(out_ptr + r3 * (TP * S) + p3 * S + c, (weights[k].to(tl.float32) * y).to(x.dtype), mask=m)


@dataclass(frozen=True)
class GatheredNormConfig:
    """One launch's tiling: rows a program, channels of each piece a tile, warps."""

    block_t: int
    block_s: int
    num_warps: int


# Elements a [BLOCK_P, BLOCK_S] tile holds at most, and the warps that load it.
TILE_ELEMENTS = 2048
TILE_WARPS = 4


def choose_gathered_norm_config(tp: int, width: int) -> GatheredNormConfig:
    """One row a program; tiles of up to ``TILE_ELEMENTS`` elements across all pieces,
    ``BLOCK_S`` the largest power of two that divides ``width`` within that (a masked
    power-of-two tail where ``width`` has no such factor of at least 64), four warps."""
    pieces = pow2_ceil(tp)
    cap = max(1, TILE_ELEMENTS // pieces)
    exact = width & -width  # the largest power of two dividing width
    block_s = min(cap, exact) if exact >= min(cap, 64) else min(cap, pow2_ceil(width))
    return GatheredNormConfig(1, block_s, max(1, min(TILE_WARPS, pieces * block_s // 256)))


def launch_gathered_rms_norm(
    shards: torch.Tensor, norm_weight: torch.Tensor, eps: float, config: GatheredNormConfig | None = None
) -> torch.Tensor:
    """Launch on checked arguments (:func:`inkling_kernels.checks.check_gathered_rms_norm_args`)."""
    tp, t, width = shards.shape
    out = torch.empty(t, tp * width, dtype=shards.dtype, device=shards.device)
    if t == 0:
        return out
    cfg = config or choose_gathered_norm_config(tp, width)
    if config is None and is_interpreter():
        cfg = GatheredNormConfig(INTERPRETER_ROWS, cfg.block_s, cfg.num_warps)  # (the fewest programs)
    if cfg.block_t & (cfg.block_t - 1) or cfg.block_s & (cfg.block_s - 1):
        raise ValueError(f"config tile sizes must be powers of two, got {cfg}")
    _gathered_rms_norm_kernel[(cdiv(t, cfg.block_t),)](
        shards, norm_weight, out, t, float(eps),
        TP=tp, S=width, BLOCK_T=cfg.block_t, BLOCK_P=pow2_ceil(tp), BLOCK_S=cfg.block_s, num_warps=cfg.num_warps,
    )
    return out


def gathered_rms_norm_triton(
    shards: torch.Tensor, norm_weight: torch.Tensor, eps: float, *, config: GatheredNormConfig | None = None
) -> torch.Tensor:
    """Check and launch directly, whatever the device (tests, benchmarks; CPU tensors
    under ``TRITON_INTERPRET=1``). Same contract as
    :func:`inkling_kernels.gathered_rms_norm`; ``config`` overrides the tile."""
    check_gathered_rms_norm_args(shards, norm_weight, eps)
    if config is not None and not isinstance(config, GatheredNormConfig):
        raise TypeError(f"config must be a GatheredNormConfig, got {type(config).__name__}")
    return launch_gathered_rms_norm(shards, norm_weight, eps, config)
