"""Triton kernel of :func:`inkling_kernels.gathered_rms_norm`.

Grid ``(cdiv(T, BLOCK_T),)``: a program owns ``BLOCK_T`` rows and loads each row's
``tp`` pieces (``shards[r, t, :]``, contiguous) as ``BLOCK_S``-wide chunks in one
unrolled pass (all loads in flight together: a decode step's single row would
otherwise wait for each chunk in turn), adds up the squares lane by lane (fp32; one
cross-lane reduction a row, not one per chunk), then normalises the chunks it kept in
registers into the contiguous output row. A row is read once. Rounding as
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

__all__ = ["GatheredNormConfig", "choose_gathered_norm_config", "launch_gathered_rms_norm"]


@triton.jit(do_not_specialize=["num_tokens"])
def _gathered_rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, num_tokens, eps,
    TP: tl.constexpr, S: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
):
    NC: tl.constexpr = (S + BLOCK_S - 1) // BLOCK_S  # chunks a piece
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = (rows < num_tokens)[:, None]
    rows64 = rows.to(tl.int64)[:, None]
    cols = tl.arange(0, BLOCK_S)
    # every chunk of the rows loaded up front (a static loop: the loads are in flight
    # together and the chunks stay in registers for the second pass)
    kept = ()
    sq = tl.zeros([BLOCK_T, BLOCK_S], dtype=tl.float32)  # squares per lane: one reduction
    for k in tl.static_range(TP * NC):
        c = (k % NC) * BLOCK_S + cols
        m = rmask & (c < S)[None, :]
        x = tl.load(x_ptr + ((k // NC) * num_tokens + rows64) * S + c[None, :], mask=m, other=0.0)
        kept = kept + (x,)
        xf = x.to(tl.float32)
        sq += xf * xf
    rstd = (1.0 / tl.sqrt_rn(tl.sum(sq, axis=1) / (TP * S) + eps))[:, None]
    for k in tl.static_range(TP * NC):
        c = (k % NC) * BLOCK_S + cols
        m = rmask & (c < S)[None, :]
        x = kept[k]
        y = (x.to(tl.float32) * rstd).to(x.dtype).to(tl.float32)
        w = tl.load(w_ptr + (k // NC) * S + c, mask=c < S, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows64 * (TP * S) + (k // NC) * S + c[None, :], (w[None, :] * y).to(x.dtype), mask=m)


@dataclass(frozen=True)
class GatheredNormConfig:
    """One launch's tiling: rows a program, channels a chunk, warps."""

    block_t: int
    block_s: int
    num_warps: int


def choose_gathered_norm_config(width: int) -> GatheredNormConfig:
    """One row a program, pieces in chunks of up to 2048 channels, four warps (the
    fastest tiles of a GPU sweep; the row count does not change the choice)."""
    block_s = min(2048, pow2_ceil(width))
    return GatheredNormConfig(1, block_s, max(1, min(4, block_s // 256)))


def launch_gathered_rms_norm(
    shards: torch.Tensor, norm_weight: torch.Tensor, eps: float, config: GatheredNormConfig | None = None
) -> torch.Tensor:
    """Launch on checked arguments (:func:`inkling_kernels.checks.check_gathered_rms_norm_args`)."""
    tp, t, width = shards.shape
    out = torch.empty(t, tp * width, dtype=shards.dtype, device=shards.device)
    if t == 0:
        return out
    cfg = config or choose_gathered_norm_config(width)
    if config is None and is_interpreter():
        cfg = GatheredNormConfig(INTERPRETER_ROWS, cfg.block_s, cfg.num_warps)  # (the fewest programs)
    if cfg.block_t & (cfg.block_t - 1) or cfg.block_s & (cfg.block_s - 1):
        raise ValueError(f"config tile sizes must be powers of two, got {cfg}")
    _gathered_rms_norm_kernel[(cdiv(t, cfg.block_t),)](
        shards, norm_weight, out, t, float(eps),
        TP=tp, S=width, BLOCK_T=cfg.block_t, BLOCK_S=cfg.block_s, num_warps=cfg.num_warps,
    )
    return out
