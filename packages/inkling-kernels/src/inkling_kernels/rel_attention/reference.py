"""Dense fp32 reference of Inkling's relative-logit attention for one sequence.

Written directly from the per-(query, key) definition, with no paging and no
chunking, so that it can serve as the test oracle of :mod:`.paged`. For a query row
at absolute position ``p`` (head ``h``, kv head ``h // (Hq // Hkv)``) and a key at
absolute position ``j``, with ``d = p - j``::

    tau   = 1 + alpha * log(max((p + 1) / n_floor, 1))   if log_scaling else 1
    rel   = r[p, h] @ rel_proj                            # [E] bias per distance
    bias  = rel[d] if 0 <= d < E else 0
    logit = ((tau * q[p, h]) . k[j]) * scale + tau * bias
    seen  = d >= 0 and (window is None or d < window)
    out   = sum_j softmax_j(logit over seen keys) * v[j]

A query that sees no key at all gets a zero output row.
"""

from __future__ import annotations

import math

import torch

__all__ = ["check_log_scaling", "check_scale", "check_window", "log_scale_factor", "rel_attention_ref"]

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_scale(scale: object) -> float:
    """``scale`` as a finite float, or TypeError/ValueError."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float (1/head_dim for Inkling), got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def check_window(window: object) -> int | None:
    """``window`` as None or an int >= 1, or TypeError/ValueError."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(
            f"window must be None (global layer) or an int (sliding_window_size), got {type(window).__name__}"
        )
    if window < 1:
        raise ValueError(f"window must be >= 1 (a query always sees itself), got {window}; pass None for no window")
    return window


def check_log_scaling(log_scaling: object) -> tuple[int, float] | None:
    """``log_scaling`` as None or ``(n_floor: int >= 1, alpha: finite float)``."""
    if log_scaling is None:
        return None
    if not isinstance(log_scaling, tuple) or len(log_scaling) != 2:
        raise TypeError(
            "log_scaling must be None or a tuple (n_floor, alpha) = "
            f"(config.log_scaling_n_floor, config.log_scaling_alpha), got {log_scaling!r}"
        )
    n_floor, alpha = log_scaling
    if isinstance(n_floor, bool) or not isinstance(n_floor, int):
        raise TypeError(f"log_scaling n_floor must be an int, got {type(n_floor).__name__}")
    if n_floor < 1:
        raise ValueError(f"log_scaling n_floor must be >= 1, got {n_floor}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"log_scaling alpha must be a float, got {type(alpha).__name__}")
    if not math.isfinite(alpha):
        raise ValueError(f"log_scaling alpha must be finite, got {alpha}")
    return n_floor, float(alpha)


def log_scale_factor(positions: torch.Tensor, log_scaling: tuple[int, float] | None) -> torch.Tensor:
    """Per-query logit multiplier ``tau`` in fp32, shape ``positions.shape``.

    ``1 + alpha * log(max((p + 1) / n_floor, 1))``; all ones without log scaling.
    """
    if log_scaling is None:
        return torch.ones(positions.shape, dtype=torch.float32, device=positions.device)
    n_floor, alpha = log_scaling
    ratio = (positions.to(torch.float32) + 1.0) / float(n_floor)
    return 1.0 + alpha * torch.log(torch.clamp(ratio, min=1.0))


def _check_ref_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    r: torch.Tensor,
    rel_proj: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
) -> None:
    for name, t in (("q", q), ("k", k), ("v", v), ("r", r)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-D tensor [tokens, heads, dim]")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be bfloat16, float16 or float32, got {t.dtype}")
    for name, t in (("rel_proj", rel_proj), ("q_positions", q_positions), ("k_positions", k_positions)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape [Tk, Hkv, Dh]")
    tq, hq, dh = q.shape
    if k.shape[2] != dh:
        raise ValueError(f"k head_dim {k.shape[2]} differs from q head_dim {dh}")
    if k.shape[1] < 1 or hq % k.shape[1] != 0:
        raise ValueError(f"q heads {hq} must be a multiple of kv heads {k.shape[1]}")
    if r.shape[:2] != (tq, hq):
        raise ValueError(f"r must be [Tq, Hq, d_rel] = [{tq}, {hq}, d_rel], got {tuple(r.shape)}")
    if rel_proj.dim() != 2 or rel_proj.shape[0] != r.shape[2] or rel_proj.shape[1] < 1:
        raise ValueError(f"rel_proj must be [d_rel, E] = [{r.shape[2]}, E >= 1], got {tuple(rel_proj.shape)}")
    if q_positions.shape != (tq,) or q_positions.dtype not in INDEX_DTYPES:
        raise ValueError(f"q_positions must be an int [Tq] = [{tq}] tensor")
    if k_positions.shape != (k.shape[0],) or k_positions.dtype not in INDEX_DTYPES:
        raise ValueError(f"k_positions must be an int [Tk] = [{k.shape[0]}] tensor")


def rel_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    r: torch.Tensor,
    rel_proj: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    *,
    scale: float,
    window: int | None = None,
    log_scaling: tuple[int, float] | None = None,
) -> torch.Tensor:
    """Dense relative-logit attention of one sequence (fp32 math).

    Args:
        q: [Tq, Hq, Dh] queries (already RMS-normalised by the caller).
        k, v: [Tk, Hkv, Dh] every key/value the sequence has (``Hq % Hkv == 0``;
            query head ``h`` reads kv head ``h // (Hq // Hkv)``).
        r: [Tq, Hq, d_rel] relative states of the query rows.
        rel_proj: [d_rel, E] bank of bias-vs-distance profiles (E = extent).
        q_positions: [Tq] int absolute positions of the query rows.
        k_positions: [Tk] int absolute positions of the keys.
        scale: multiplier of ``q . k`` (1/head_dim for Inkling).
        window: sliding window (a key is seen when ``p - j < window``) or None.
        log_scaling: ``(n_floor, alpha)`` to scale each query's logits by ``tau(p)``,
            or None.

    Returns:
        [Tq, Hq, Dh] in ``q.dtype``; rows that see no key are zeros.
    """
    _check_ref_args(q, k, v, r, rel_proj, q_positions, k_positions)
    scale = check_scale(scale)
    window = check_window(window)
    log_scaling = check_log_scaling(log_scaling)
    hq, hkv = q.shape[1], k.shape[1]
    extent = rel_proj.shape[1]

    # kv head of each query head: h // group (repeat_interleave keeps that order)
    kf = k.float().repeat_interleave(hq // hkv, dim=1)  # [Tk, Hq, Dh]
    vf = v.float().repeat_interleave(hq // hkv, dim=1)
    tau = log_scale_factor(q_positions, log_scaling)  # [Tq]

    dist = q_positions.long()[:, None] - k_positions.long()[None, :]  # [Tq, Tk]
    rel = torch.einsum("thc,ce->the", r.float(), rel_proj.float())  # [Tq, Hq, E]
    in_extent = (dist >= 0) & (dist < extent)
    index = dist.clamp(0, extent - 1)[:, None, :].expand(-1, hq, -1)
    bias = torch.where(in_extent[:, None, :], rel.gather(2, index), 0.0)

    scaled_q = q.float() * tau[:, None, None]
    logits = torch.einsum("thd,jhd->thj", scaled_q, kf) * scale + tau[:, None, None] * bias

    seen = dist >= 0
    if window is not None:
        seen = seen & (dist < window)
    logits = logits.masked_fill(~seen[:, None, :], float("-inf"))
    any_seen = seen.any(dim=1)  # [Tq]
    # a row with nothing seen would softmax to NaN: give it a finite row, zero it below
    logits = torch.where(any_seen[:, None, None], logits, 0.0)
    probs = torch.softmax(logits, dim=-1)
    out = torch.einsum("thj,jhd->thd", probs, vf)
    out = torch.where(any_seen[:, None, None], out, 0.0)
    return out.to(q.dtype)
