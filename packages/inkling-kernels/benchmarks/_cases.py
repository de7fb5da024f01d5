"""The benchmark cases of ``run.py``: inputs, launches (ours and the peer's) and checks.

Every case builds ``sets`` independent input sets (so a graph launching the op once per
set works on more bytes than the L2 holds), the launches of our op on each set (public
entry points, default configuration), the peer's launches where the peer has the op
(vLLM 0.33.0's in-tree Triton kernels, loaded by ``run.load_peer``; the unfused torch
sequence it would run otherwise), the minimum bytes one launch moves, and a check of
our output on set 0 against the fp32 reference (raising ``AssertionError``).

Shapes are the Inkling 975B ones (``FULL``) or tiny ones for the CPU (``SMOKE``: the
Triton interpreter, fp32).
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from inkling_cache import ConvStateLayout, Stream
from inkling_kernels import (
    SconvBatch,
    fused_sconv,
    fused_sconv_add,
    fused_sconv_add_rmsnorm,
    fused_sconv_add_rmsnorm_ref,
    fused_sconv_kv,
    fused_sconv_kv_ref,
    fused_sconv_ref,
    gathered_rms_norm,
    gathered_rms_norm_ref,
    prefill_token_count,
    sconv_seq_metadata,
    sconv_seq_metadata_ref,
    sconv_tap_map,
)
from inkling_kernels.rel_attention import paged_rel_attention, paged_rel_attention_triton
from inkling_kernels.sconv_add_rmsnorm import rms_norm_ref

W = N = 4  # conv kernel size and block size of the conv state
EPS = 1e-5
WORKING_SET = 256e6  # bytes the input sets of a case add up to (>> the H200's 60 MB L2)
GROUP_LAYERS = 11  # layers sharing a tap map (the 975B model's smallest KV-cache group)

Launches = list[Callable[[], Any]]


@dataclass(frozen=True)
class Sizes:
    """One size set: the shapes every case group uses."""

    smoke: bool
    dtype: torch.dtype
    # (heads per rank, D, stream offset, stream width) of the fused_sconv streams
    streams: dict[str, tuple[int, int, int, int]]
    steps: list[tuple[str, list[tuple[int, int]]]]  # (name, [(history, new tokens)]) in batch order
    sconv_steps: list[tuple[str, str, list[tuple[int, int]]]]  # (name, stream, requests)
    metadata_steps: list[tuple[str, list[int], int]]  # (name, query lengths, pad rows)
    hidden: int
    head_dim: int
    q_heads: int
    kv_heads: dict[str, int]  # per layer kind, tp 1
    tp_shard: int
    attention: dict[str, int]  # hq, dh, d_rel, extent, n
    attention_steps: list[tuple[str, list[tuple[int, int]], dict[str, Any]]]
    gathered_tp: tuple[int, ...]

    @property
    def tol(self) -> float:
        """Tolerance of a check, in rounding steps of the dtype (``_steps``)."""
        return 4.01 if self.dtype == torch.bfloat16 else 64.0


def _hist(i: int) -> int:
    return 700 + (i * 7919) % 6000  # long, varied histories


def _small_hist(i: int) -> int:
    return 5 + (i * 7) % 30


_STEPS_FULL = [
    ("decode 1", [(_hist(0), 1)]),
    ("decode 64", [(_hist(i), 1) for i in range(64)]),
    ("decode 256", [(_hist(i), 1) for i in range(256)]),
    ("spec 64x4", [(_hist(i), 4) for i in range(64)]),
    ("prefill 8192", [(0, 8192)]),
    ("mixed 2048+255", [(0, 2048)] + [(_hist(i), 1) for i in range(255)]),
]

FULL = Sizes(
    smoke=False,
    dtype=torch.bfloat16,
    streams={"ATTN": (8, 2048, 256, 768), "ATTN tp8": (1, 2048, 256, 768), "K": (8, 2048, 0, 128),
             "K sliding": (16, 1024, 0, 128)},
    steps=_STEPS_FULL,
    sconv_steps=[
        ("decode 1, ATTN", "ATTN", [(_hist(0), 1)]),
        ("decode 64, ATTN", "ATTN", [(_hist(i), 1) for i in range(64)]),
        ("decode 256, K", "K", [(_hist(i), 1) for i in range(256)]),
        ("one-step decode 256, K", "K", [(_hist(i), 1) for i in range(256)]),
        ("decode 256, ATTN", "ATTN", [(_hist(i), 1) for i in range(256)]),
        ("decode 256, ATTN tp8", "ATTN tp8", [(_hist(i), 1) for i in range(256)]),
        ("spec 64x4, ATTN", "ATTN", [(_hist(i), 4) for i in range(64)]),
        ("prefill 8192, ATTN", "ATTN", [(0, 8192)]),
        ("chunked 8192 after 8190, ATTN", "ATTN", [(8190, 8192)]),
        ("prefill 8192, K", "K", [(0, 8192)]),
        ("prefill 16384, K sliding", "K sliding", [(0, 16384)]),
        ("mixed 2048+255, ATTN", "ATTN", [(0, 2048)] + [(_hist(i), 1) for i in range(255)]),
        # the order vLLM gives the batch to the plugin (decode requests first)
        ("mixed 255+2048, ATTN", "ATTN", [(_hist(i), 1) for i in range(255)] + [(0, 2048)]),
    ],
    metadata_steps=[("decode 256", [1] * 256, 0), ("spec 64x4", [4] * 64, 0),
                    ("mixed 2048+255", [2048] + [1] * 255, 0), ("prefill 8192", [8192], 0),
                    ("decode 200 padded to 256", [1] * 200, 56)],
    hidden=6144, head_dim=128, q_heads=64, kv_heads={"global": 8, "sliding": 16}, tp_shard=8,
    attention=dict(hq=64, dh=128, d_rel=16, extent=1024, n=64),
    attention_steps=[
        ("decode 1 x 32k", [(32767, 1)], {}),
        ("decode 64 x 32k", [(32767, 1)] * 64, {}),
        ("decode 256 x 8k", [(8191, 1)] * 256, {}),
        ("decode 64 x 32k, N=16, Hkv=16", [(32767, 1)] * 64, dict(hkv=16, n=16)),
        ("spec 64x4 @ 8k", [(8188, 4)] * 64, {}),
        ("prefill 2k", [(0, 2048)], {}),
        ("prefill 4 x 2k", [(0, 2048)] * 4, {}),
        ("prefill 4k", [(0, 4096)], {}),
        ("prefill 8k", [(0, 8192)], {}),
        ("prefill 16k", [(0, 16384)], {}),
        ("chunked 512 after 8k", [(8192, 512)], {}),
        ("chunked 1k after 8k", [(8192, 1024)], {}),
        ("chunked 8k after 8k", [(8192, 8192)], {}),
        ("mixed 2048 after 2048 + 255 @ 4k", [(2048, 2048)] + [(4095, 1)] * 255, dict(pad=9)),
        ("sliding prefill 8k, Hkv=16", [(0, 8192)], dict(hkv=16, window=512)),
        ("sliding decode 256 x 8k, Hkv=16", [(8191, 1)] * 256, dict(hkv=16, window=512)),
    ],
    gathered_tp=(2, 8),
)

_STEPS_SMOKE = [
    ("decode 3", [(_small_hist(i), 1) for i in range(3)]),
    ("mixed 10+3", [(0, 10)] + [(_small_hist(i), 1) for i in range(3)]),
]

SMOKE = Sizes(
    smoke=True,
    dtype=torch.float32,
    streams={"ATTN": (2, 64, 16, 32), "K": (2, 64, 0, 16)},
    steps=_STEPS_SMOKE,
    sconv_steps=[
        ("decode 3, ATTN", "ATTN", [(_small_hist(i), 1) for i in range(3)]),
        ("one-step decode 3, K", "K", [(_small_hist(i), 1) for i in range(3)]),
        ("chunked 12 after 9, K", "K", [(9, 12)]),
        ("mixed 3+10, ATTN", "ATTN", [(_small_hist(i), 1) for i in range(3)] + [(0, 10)]),
    ],
    metadata_steps=[("mixed 10+3 padded", [10, 1, 1, 1], 2)],
    hidden=64, head_dim=16, q_heads=4, kv_heads={"global": 2}, tp_shard=2,
    attention=dict(hq=4, dh=16, d_rel=4, extent=32, n=16),
    attention_steps=[("decode 2 x 40", [(40, 1)] * 2, {}),
                     ("mixed 12 after 8 + 1 decode", [(8, 12), (30, 1)], dict(pad=1)),
                     ("sliding prefill 24", [(0, 24)], dict(window=8)),
                     ("sliding decode 3 x 40", [(39, 1)] * 3, dict(window=8))],
    gathered_tp=(2,),
)


@dataclass
class Prepared:
    """A case ready to time: launches on every input set, set 0 checked."""

    ours: Launches
    nbytes: int  # minimum bytes one of our launches moves (reads + writes)
    peer: dict[str, Launches] = field(default_factory=dict)  # alternatives: the fastest is reported
    # other ways of running our side (e.g. which torch RMSNorm follows our op): the fastest
    # of ``ours`` and these is reported
    ours_alt: dict[str, Launches] = field(default_factory=dict)
    # launches whose time is added to ours divided by ``amortise_over`` (a step's tap map)
    amortised: Optional[Launches] = None
    amortise_over: int = 1


@dataclass(frozen=True)
class Case:
    name: str  # "<group> <step>"
    group: str
    peer_label: str
    prepare: Callable[["Env"], Prepared]


@dataclass
class Env:
    sizes: Sizes
    device: torch.device
    peer: Any  # the peer module or None
    gen: torch.Generator  # block placement
    compile_norm: bool  # whether the peer's add + norm also tries a torch.compile'd one
    # tilings (RelAttentionConfig) the attention cases also time, each checked first
    attention_configs: dict[str, Any] = field(default_factory=dict)

    def num_sets(self, nbytes: int) -> int:
        return 1 if self.sizes.smoke else max(2, min(16, math.ceil(WORKING_SET / nbytes)))

    def randn(self, *shape: int, dtype: Optional[torch.dtype] = None, scale: float = 1.0) -> torch.Tensor:
        # drawn in the target dtype and scaled in place: no fp32 temporaries (the 17 GB
        # sliding-decode cache would need 64 GB of them, and an allocation under such
        # pressure can land where random page reads run 15 % slower)
        return torch.randn(*shape, device=self.device, dtype=dtype or self.sizes.dtype).mul_(scale)


def _weight(t: torch.Tensor) -> torch.Tensor:
    """A weight as a model holds it: an ``nn.Parameter`` (no gradient) over ``t``'s
    storage and strides (the layer cases time the calls a model makes)."""
    return torch.nn.Parameter(t, requires_grad=False)


# ----------------------------------------------------------------------------- checks


def _steps(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max |got - want| in rounding steps of want's dtype at ``|want| + mean |want|``
    (the mean keeps elements that cancel to near zero from inflating it)."""
    w = want.float()
    unit = torch.finfo(want.dtype).eps * (w.abs() + w.abs().mean() + 1e-30)
    return float(((got.float() - w).abs() / unit).max())


def _close(env: Env, what: str, got: torch.Tensor, want: torch.Tensor, tol: Optional[float] = None) -> None:
    tol = env.sizes.tol if tol is None else tol
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
    if bool(torch.isnan(got).any()):
        raise AssertionError(f"{what}: NaN in the output")
    err = _steps(got, want)
    if not err <= tol:
        raise AssertionError(f"{what}: {err:.3g} rounding steps from the reference (tolerance {tol})")


def _same(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.equal(got, want):
        raise AssertionError(f"{what}: differs from the reference")


# ----------------------------------------------------------------------------- the step's metadata


@dataclass
class Step:
    """One step's conv metadata over one layer's cache blocks (random placement)."""

    positions: torch.Tensor
    table: torch.Tensor
    seq: torch.Tensor
    slots: torch.Tensor
    qs: torch.Tensor
    tap_map: torch.Tensor
    prefill: Optional[int]

    @property
    def loose(self) -> tuple[torch.Tensor, ...]:
        return (self.positions, self.table, self.seq, self.slots, self.qs)

    @functools.cached_property
    def batch(self) -> SconvBatch:
        return SconvBatch(*self.loose, block_size=N, kernel_size=W, num_prefill_tokens=self.prefill)

    @functools.cached_property
    def mapped(self) -> SconvBatch:
        """The batch carrying its tap map (the path the model and the vLLM plugin take)."""
        return self.batch.with_tap_map(self.tap_map)

    @property
    def rows(self) -> int:
        return int(self.positions.shape[0])


def build_steps(env: Env, requests: list[tuple[int, int]], num_sets: int) -> tuple[int, list[Step]]:
    """``num_sets`` steps of ``requests`` over disjoint blocks of one cache: (cache blocks, steps)."""
    spans = [(max(0, hist - (W - 1)) // N, (hist + n - 1) // N) for hist, n in requests]
    per_set = sum(last - first + 1 for first, last in spans)
    num_blocks = 1 + num_sets * per_set  # block 0: the null block
    perm = (torch.randperm(num_blocks - 1, generator=env.gen) + 1).tolist()
    max_blocks = max(last for _, last in spans) + 1
    dev = env.device
    steps, cursor = [], 0
    for _ in range(num_sets):
        table = torch.zeros(len(requests), max_blocks, dtype=torch.int32)
        pos, seq, slots, qs = [], [], [], []
        row0 = 0
        for r, ((hist, n), (first, last)) in enumerate(zip(requests, spans)):
            table[r, first:last + 1] = torch.tensor(perm[cursor:cursor + last - first + 1], dtype=torch.int32)
            cursor += last - first + 1
            p = torch.arange(hist, hist + n)
            pos.append(p)
            seq.append(torch.full((n,), r, dtype=torch.int32))
            slots.append(table[r, p // N].long() * N + p % N)
            qs.append(torch.full((n,), row0, dtype=torch.int32))
            row0 += n
        news = [n for _, n in requests]
        step = Step(torch.cat(pos).to(dev), table.to(dev), torch.cat(seq).to(dev), torch.cat(slots).to(dev),
                    torch.cat(qs).to(dev), torch.empty(row0, W - 1, dtype=torch.int64, device=dev),
                    prefill_token_count(news))
        sconv_tap_map(step.batch, step.tap_map)
        steps.append(step)
    return num_blocks, steps


def _taps(requests: list[tuple[int, int]]) -> int:
    return sum(min(W - 1, hist) for hist, _ in requests)


def _rows(requests: list[tuple[int, int]]) -> int:
    return sum(n for _, n in requests)


def _peer_conv(env: Env, x: torch.Tensor, w: torch.Tensor, cache: torch.Tensor, s: Step, off: int,
               width: int) -> torch.Tensor:
    """vLLM 0.33.0's fused_sconv on the loose metadata its model passes (x contiguous,
    as ``InklingShortConv.forward`` makes it)."""
    return env.peer.fused_sconv(x.contiguous(), w, cache, *s.loose, off, width, N)


# ----------------------------------------------------------------------------- fused_sconv


def _sconv(stream: str, requests: list[tuple[int, int]], one_step: bool = False) -> Callable[[Env], Prepared]:
    """``one_step``: every input set is another layer of the same step (its own cache and
    x, one metadata shared by all), as a step's launches share its metadata in L2."""

    def prepare(env: Env) -> Prepared:
        heads, d, off, width = env.sizes.streams[stream]
        c, e = heads * width, env.sizes.dtype.itemsize
        t = _rows(requests)
        nbytes = 3 * t * c * e + c * W * 4 + _taps(requests) * c * e  # x, slot, out, weights, taps
        sets = env.num_sets(nbytes)
        num_blocks, steps = build_steps(env, requests, 1 if one_step else sets)
        if one_step:
            steps = steps * sets
            caches = [env.randn(num_blocks, heads, N, d) for _ in steps]
        else:
            caches = [env.randn(num_blocks, heads, N, d)] * sets
        weight = env.randn(c, W, dtype=torch.float32, scale=0.5)
        xs = [env.randn(t, c) for _ in steps]
        c_ref, c_ours = caches[0].clone(), caches[0].clone()
        want = fused_sconv_ref(xs[0], weight, c_ref, steps[0].batch, off, width)
        got = fused_sconv(xs[0], weight, c_ours, steps[0].mapped, off, width)
        _close(env, "out", got, want)
        _same("cache", c_ours, c_ref)
        launch_sets = list(zip(xs, steps, caches))
        prep = Prepared([lambda x=x, s=s, k=k: fused_sconv(x, weight, k, s.mapped, off, width)
                         for x, s, k in launch_sets], nbytes)
        if env.peer is not None:
            prep.peer["vLLM fused_sconv"] = [lambda x=x, s=s, k=k: _peer_conv(env, x, weight, k, s, off, width)
                                             for x, s, k in launch_sets]
        return prep

    return prepare


def _metadata(lens: list[int], pad: int) -> Callable[[Env], Prepared]:
    def prepare(env: Env) -> Prepared:
        dev = env.device
        qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
        num_actual, total = sum(lens), sum(lens) + pad
        seq, qs = torch.empty(total, dtype=torch.int32, device=dev), torch.empty(total, dtype=torch.int32, device=dev)
        sconv_seq_metadata(qsl, len(lens), num_actual, seq, qs, total)
        w_seq, w_qs = torch.empty_like(seq), torch.empty_like(qs)
        sconv_seq_metadata_ref(qsl, len(lens), num_actual, w_seq, w_qs, total)
        _same("seq_idx", seq[:num_actual], w_seq[:num_actual])
        _same("query_start", qs[:num_actual], w_qs[:num_actual])
        # a tiny launch: many in one graph, the same buffers (L2-resident either way)
        reps = 1 if env.sizes.smoke else 20
        prep = Prepared([lambda: sconv_seq_metadata(qsl, len(lens), num_actual, seq, qs, total)] * reps,
                        (len(lens) + 1) * 4 + 2 * total * 4)
        if env.peer is not None:
            ps, pq = torch.empty_like(seq), torch.empty_like(qs)
            prep.peer["vLLM sconv_seq_metadata"] = [
                lambda: env.peer.sconv_seq_metadata(qsl, len(lens), num_actual, ps, pq, total)] * reps
        return prep

    return prepare


# ----------------------------------------------------------------------------- one decoder layer


@dataclass
class LayerWorld:
    """One decoder layer's conv inputs on one rank: K/V slices of qkv, ATTN and MLP rows."""

    layout: ConvStateLayout
    cache: torch.Tensor
    steps: list[Step]
    qkv: list[torch.Tensor]
    d_attn: list[torch.Tensor]
    d_mlp: list[torch.Tensor]
    hidden: list[torch.Tensor]  # [T, shard]
    gathered: list[torch.Tensor]  # tp > 1: stand-in of the all-gathered full rows [T, hidden]
    full: list[torch.Tensor]  # tp > 1: the peer's full residual rows [T, hidden]
    wk: torch.Tensor
    wv: torch.Tensor
    w_attn: torch.Tensor  # (C, 1, W) channel-contiguous, as InklingShortConvAddRMSNorm keeps it
    w_mlp: torch.Tensor
    nw_attn: torch.Tensor
    nw_mlp: torch.Tensor
    q_cols: int

    @functools.cached_property
    def peer_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The ATTN and MLP weights as the peer takes them: (C, W) contiguous."""
        return self.w_attn[:, 0, :].contiguous(), self.w_mlp[:, 0, :].contiguous()

    def kv(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.layout.num_heads * self.layout.head_dim
        _, k, v = self.qkv[i].split([self.q_cols, c, c], dim=-1)
        return k, v

    def stream(self, s: Stream) -> tuple[int, int]:
        return self.layout.stream_range(s)


def _layout(env: Env, kind: str, tp: int) -> ConvStateLayout:
    sz = env.sizes
    return ConvStateLayout.build(num_kv_heads=sz.kv_heads[kind], head_dim=sz.head_dim, hidden_size=sz.hidden,
                                 kernel_size=W, tp_size=tp, block_size=N)


def _layer_world(env: Env, kind: str, tp: int, requests: list[tuple[int, int]], nbytes: int) -> LayerWorld:
    sz = env.sizes
    layout = _layout(env, kind, tp)
    num_blocks, steps = build_steps(env, requests, env.num_sets(nbytes))
    t, c = _rows(requests), int(layout.hidden_shard)
    kv_c = layout.num_heads * layout.head_dim
    q_cols = sz.q_heads // tp * sz.head_dim
    return LayerWorld(
        layout=layout, cache=env.randn(num_blocks, layout.num_heads, N, layout.head_size), steps=steps,
        qkv=[env.randn(t, q_cols + 2 * kv_c) for _ in steps], d_attn=[env.randn(t, c) for _ in steps],
        d_mlp=[env.randn(t, c) for _ in steps], hidden=[env.randn(t, c) for _ in steps],
        gathered=[env.randn(t, sz.hidden) for _ in steps] if tp > 1 else [],
        full=[env.randn(t, sz.hidden) for _ in steps] if tp > 1 else [],
        wk=_weight(env.randn(kv_c, W, dtype=torch.float32, scale=0.5)),
        wv=_weight(env.randn(kv_c, W, dtype=torch.float32, scale=0.5)),
        w_attn=_weight(env.randn(W, c, dtype=torch.float32, scale=0.5).t().unsqueeze(1)),
        w_mlp=_weight(env.randn(W, c, dtype=torch.float32, scale=0.5).t().unsqueeze(1)),
        nw_attn=_weight((1 + 0.2 * torch.randn(sz.hidden, device=env.device)).to(sz.dtype)),
        nw_mlp=_weight((1 + 0.2 * torch.randn(sz.hidden, device=env.device)).to(sz.dtype)), q_cols=q_cols)


def _add_norm_eager(hidden: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    new_h = hidden + y
    return new_h, F.rms_norm(new_h, (new_h.shape[-1],), w, EPS)


def _add_norm_fp32(hidden: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' add + InklingRMSNorm in torch ops (what torch.compile fuses)."""
    new_h = hidden + y
    x = new_h.float()
    return new_h, w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)).to(new_h.dtype)


@functools.cache
def _compiled_add_norm() -> Callable[..., Any]:
    return torch.compile(_add_norm_fp32, dynamic=True)


def _add_norms(env: Env) -> dict[str, Callable[..., Any]]:
    """The peer's unfused add + RMSNorm: F.rms_norm and, on CUDA, a torch.compile'd one."""
    out: dict[str, Callable[..., Any]] = {"F.rms_norm": _add_norm_eager}
    if env.compile_norm:
        out["compiled"] = _compiled_add_norm()
    return out


def _layer_bytes(env: Env, kind: str, tp: int, requests: list[tuple[int, int]], parts: str) -> int:
    """Minimum bytes of ours: K+V (``k``), the ATTN/MLP sublayers (``s``, each)."""
    sz, e = env.sizes, env.sizes.dtype.itemsize
    t, taps = _rows(requests), _taps(requests)
    layout = _layout(env, kind, tp)
    kv_c = layout.num_heads * layout.head_dim
    c, hidden = int(layout.hidden_shard), sz.hidden
    kv = 2 * (3 * t * kv_c * e + kv_c * W * 4 + taps * kv_c * e)
    if tp == 1:  # read h, d; write new h, normed, slot
        sub = (5 * t * c + taps * c + hidden) * e + c * W * 4
    else:  # conv + add (read h, d; write new h, slot) + the norm of the gathered row (read, write)
        sub = (4 * t * c + taps * c + 2 * t * hidden + hidden) * e + c * W * 4
    return {"kv": kv, "sub": sub, "layer": kv + 2 * sub}[parts]


def _peer_kv(env: Env, lw: LayerWorld, i: int, cache: torch.Tensor) -> list[torch.Tensor]:
    """The peer's K and V of set ``i``: two launches of its fused_sconv (after the copies
    of the slices of qkv)."""
    s = lw.steps[i]
    (k_off, hd), (v_off, _) = lw.stream(Stream.K), lw.stream(Stream.V)
    k, v = lw.kv(i)
    return [_peer_conv(env, k, lw.wk, cache, s, k_off, hd), _peer_conv(env, v, lw.wv, cache, s, v_off, hd)]


def _kv(kind: str, tp: int, requests: list[tuple[int, int]]) -> Callable[[Env], Prepared]:
    """fused_sconv_kv on the slices of qkv; the peer: two launches on .contiguous() copies."""

    def prepare(env: Env) -> Prepared:
        nbytes = _layer_bytes(env, kind, tp, requests, "kv")
        lw = _layer_world(env, kind, tp, requests, nbytes)
        k_off, hd = lw.stream(Stream.K)
        v_off, _ = lw.stream(Stream.V)
        s0 = lw.steps[0]
        c_ref, c_ours = lw.cache.clone(), lw.cache.clone()
        want = fused_sconv_kv_ref(*lw.kv(0), lw.wk, lw.wv, c_ref, s0.batch, k_off, v_off, hd)
        got = fused_sconv_kv(*lw.kv(0), lw.wk, lw.wv, c_ours, s0.mapped, k_off, v_off, hd)
        _close(env, "k", got[0], want[0])
        _close(env, "v", got[1], want[1])
        _same("cache", c_ours, c_ref)
        cache = lw.cache
        prep = Prepared([lambda i=i, s=s: fused_sconv_kv(*lw.kv(i), lw.wk, lw.wv, cache, s.mapped, k_off, v_off, hd)
                         for i, s in enumerate(lw.steps)], nbytes)
        if env.peer is not None:
            prep.peer["vLLM fused_sconv x2 + copies"] = [lambda i=i: _peer_kv(env, lw, i, cache)
                                                         for i in range(len(lw.steps))]
        return prep

    return prepare


def _sub(lw: LayerWorld, i: int, s: SconvBatch, hidden: torch.Tensor, mlp: bool, cache: torch.Tensor,
         norm: Callable[..., Any] = rms_norm_ref) -> tuple[torch.Tensor, torch.Tensor]:
    """Ours: ATTN (or MLP) conv + residual add + RMSNorm, ``(new_hidden, normed)``."""
    d, w, nw = (lw.d_mlp[i], lw.w_mlp, lw.nw_mlp) if mlp else (lw.d_attn[i], lw.w_attn, lw.nw_attn)
    off, width = lw.stream(Stream.MLP if mlp else Stream.ATTN)
    if lw.layout.tp_size == 1:
        return fused_sconv_add_rmsnorm(hidden, d, w, cache, s, off, width, nw, EPS)
    new_h = fused_sconv_add(hidden, d, w, cache, s, off, width)
    return new_h, norm(lw.gathered[i], nw, EPS)  # the row all-gathered from new_h (collective excluded)


def _peer_sub(env: Env, lw: LayerWorld, i: int, hidden: torch.Tensor, mlp: bool, cache: torch.Tensor,
              add_norm: Callable[..., Any], pieces: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The peer: its fused_sconv, then the unfused add + RMSNorm (of the full row at tp > 1;
    ``pieces``: the all-gathered conv outputs as the collective leaves them, which vLLM's
    ``all_gather(dim=-1)`` copies into rows first)."""
    d, nw = (lw.d_mlp[i], lw.nw_mlp) if mlp else (lw.d_attn[i], lw.nw_attn)
    w = lw.peer_weights[1 if mlp else 0]
    off, width = lw.stream(Stream.MLP if mlp else Stream.ATTN)
    y = _peer_conv(env, d, w, cache, lw.steps[i], off, width)
    if lw.layout.tp_size == 1:
        return add_norm(hidden, y, nw)
    # the full residual row + the all-gathered conv output (stand-ins; collectives excluded)
    return add_norm(hidden, lw.gathered[i] if pieces is None else _gathered_rows(pieces), nw)


def _add_rmsnorm(requests: list[tuple[int, int]]) -> Callable[[Env], Prepared]:
    """fused_sconv_add_rmsnorm on the ATTN stream of a global layer at tp 1."""

    def prepare(env: Env) -> Prepared:
        nbytes = _layer_bytes(env, "global", 1, requests, "sub")
        lw = _layer_world(env, "global", 1, requests, nbytes)
        off, width = lw.stream(Stream.ATTN)
        s0 = lw.steps[0]
        c_ref, c_ours = lw.cache.clone(), lw.cache.clone()
        want = fused_sconv_add_rmsnorm_ref(lw.hidden[0], lw.d_attn[0], lw.w_attn, c_ref, s0.batch, off, width,
                                           lw.nw_attn, EPS)
        got = _sub(lw, 0, s0.mapped, lw.hidden[0], False, c_ours)
        _close(env, "new_hidden", got[0], want[0])
        _close(env, "normed", got[1], want[1])
        _same("cache", c_ours, c_ref)
        cache = lw.cache
        prep = Prepared([lambda i=i, s=s: _sub(lw, i, s.mapped, lw.hidden[i], False, cache)
                         for i, s in enumerate(lw.steps)], nbytes)
        if env.peer is not None:
            for name, fn in _add_norms(env).items():
                prep.peer[f"vLLM fused_sconv + add + {name}"] = [
                    lambda i=i, fn=fn: _peer_sub(env, lw, i, lw.hidden[i], False, cache, fn) for i in range(len(lw.steps))]
        return prep

    return prepare


def _layer(kind: str, tp: int, requests: list[tuple[int, int]], gather: bool = False) -> Callable[[Env], Prepared]:
    """One decoder layer's conv work: K+V, ATTN + add + norm, MLP + add + norm; the step's
    tap map build amortised over the KV-cache group's layers.

    At tp > 1 both sides' collectives are left out. By default both norms read stand-in
    gathered rows. ``gather``: each side's all-gather as its model runs it, less the
    transfer (the same bytes on both sides). Ours, the served model's path: the norm
    reads the ``[tp, T, S]`` pieces an all-gather along dim 0 leaves
    (:func:`gathered_rms_norm`). The peer: vLLM's ``all_gather(dim=-1)`` copies those
    pieces into rows (:func:`_gathered_rows`) before its add + RMSNorm, in either
    arrangement. A compiled model cannot fold that copy into the norm: vLLM's all-gather
    is an opaque custom op that returns the copied rows."""
    if gather and tp == 1:
        raise ValueError("gather: a layer at tp > 1")

    def prepare(env: Env) -> Prepared:
        nbytes = _layer_bytes(env, kind, tp, requests, "layer")
        lw = _layer_world(env, kind, tp, requests, nbytes)
        k_off, hd = lw.stream(Stream.K)
        v_off, _ = lw.stream(Stream.V)
        a_off, width = lw.stream(Stream.ATTN)
        m_off, _ = lw.stream(Stream.MLP)

        def ours(i: int, b: SconvBatch, cache: torch.Tensor,
                 norm: Callable[..., Any] = gathered_rms_norm_rows) -> list[torch.Tensor]:
            k, v = fused_sconv_kv(*lw.kv(i), lw.wk, lw.wv, cache, b, k_off, v_off, hd)
            h1, n1 = _sub(lw, i, b, lw.hidden[i], False, cache, norm)
            h2, n2 = _sub(lw, i, b, h1, True, cache, norm)
            return [k, v, h1, n1, h2, n2]

        # check: the chain of references on set 0
        s0 = lw.steps[0]
        c_ref, c_ours = lw.cache.clone(), lw.cache.clone()
        got = ours(0, s0.mapped, c_ours)
        k, v = fused_sconv_kv_ref(*lw.kv(0), lw.wk, lw.wv, c_ref, s0.batch, k_off, v_off, hd)
        _close(env, "k", got[0], k)
        _close(env, "v", got[1], v)
        h = lw.hidden[0]
        for j, (d, w, off, nw) in enumerate(((lw.d_attn[0], lw.w_attn, a_off, lw.nw_attn),
                                              (lw.d_mlp[0], lw.w_mlp, m_off, lw.nw_mlp))):
            if tp == 1:
                h, normed = fused_sconv_add_rmsnorm_ref(got[2] if j else h, d, w, c_ref, s0.batch, off, width,
                                                        nw, EPS)
            else:
                conv = fused_sconv_ref(d, w, c_ref, s0.batch, off, width)
                h = ((got[2] if j else h).float() + conv.float()).to(env.sizes.dtype)
                normed = rms_norm_ref(lw.gathered[0], nw, EPS)
            _close(env, f"sublayer {j} new_hidden", got[2 + 2 * j], h)
            _close(env, f"sublayer {j} normed", got[3 + 2 * j], normed)
        _same("cache", c_ours, c_ref)
        cache = lw.cache
        stand_in = [lambda i=i, s=s: ours(i, s.mapped, cache) for i, s in enumerate(lw.steps)]
        pieces: list[Optional[torch.Tensor]] = [None] * len(lw.steps)
        served = stand_in
        if tp > 1:  # the model's path: the norm reads the pieces an all-gather along dim 0 leaves
            pieces = [env.randn(tp, _rows(requests), int(lw.layout.hidden_shard)) for _ in lw.steps]
            _close(env, "normed (pieces)", gathered_rms_norm(pieces[0], lw.nw_attn, EPS),
                   gathered_rms_norm_ref(pieces[0], lw.nw_attn, EPS))

            def of_pieces(i: int) -> Callable[..., Any]:
                return lambda _rows, nw, eps: gathered_rms_norm(pieces[i], nw, eps)

            served = [lambda i=i, s=s: ours(i, s.mapped, cache, of_pieces(i)) for i, s in enumerate(lw.steps)]
        if gather:  # the peer's rows are those pieces, copied: the same norm input
            _close(env, "normed (the peer's copied rows)",
                   gathered_rms_norm_rows(_gathered_rows(pieces[0]), lw.nw_attn, EPS),
                   gathered_rms_norm_ref(pieces[0], lw.nw_attn, EPS))
        prep = Prepared(served if gather else stand_in, nbytes,
                        amortised=[lambda s=s: sconv_tap_map(s.batch, s.tap_map) for s in lw.steps],
                        amortise_over=GROUP_LAYERS)
        if tp > 1 and not gather:
            if env.compile_norm:  # the norm of the gathered rows: torch.compile'd
                prep.ours_alt["compiled norm"] = [lambda i=i, s=s: ours(i, s.mapped, cache, _compiled_rms())
                                                  for i, s in enumerate(lw.steps)]
            prep.ours_alt["gathered_rms_norm"] = served
        # what the peer's norms read: stand-in rows, or (gather) the pieces its all-gather copies
        peer_pieces = pieces if gather else [None] * len(lw.steps)
        if env.peer is not None:
            def peer(i: int, fn: Callable[..., Any]) -> Any:
                out = _peer_kv(env, lw, i, cache)
                at = peer_pieces[i]
                h1, n1 = _peer_sub(env, lw, i, lw.hidden[i] if tp == 1 else lw.full[i], False, cache, fn, at)
                return out + [h1, n1, *_peer_sub(env, lw, i, h1, True, cache, fn, at)]
            copy = " + all-gather copy" if gather else ""
            for name, fn in _add_norms(env).items():
                prep.peer[f"vLLM fused_sconv x4{copy} + add + {name}"] = [
                    lambda i=i, fn=fn: peer(i, fn) for i in range(len(lw.steps))]
            if tp > 1:  # the other arrangement: the add on the shard, then the norm of the gathered row
                for name, norm in _row_norms(env).items():
                    prep.peer[f"vLLM fused_sconv x4 + add on the shard{copy} + {name} of the row"] = [
                        lambda i=i, norm=norm: _peer_layer_shard_add(env, lw, i, cache, norm, peer_pieces[i])
                        for i in range(len(lw.steps))]
        return prep

    return prepare


def _peer_layer_shard_add(env: Env, lw: LayerWorld, i: int, cache: torch.Tensor,
                          norm: Callable[..., Any], pieces: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
    """The peer's layer at tp > 1 arranged as ours is: its fused_sconv for K, V and
    each sublayer's shard, the residual add on the shard, the RMSNorm of the row
    all-gathered from it (collective excluded; ``pieces``: as in :func:`_peer_sub`)."""
    s = lw.steps[i]
    out = _peer_kv(env, lw, i, cache)
    h = lw.hidden[i]
    for mlp in (False, True):
        d, nw = (lw.d_mlp[i], lw.nw_mlp) if mlp else (lw.d_attn[i], lw.nw_attn)
        off, width = lw.stream(Stream.MLP if mlp else Stream.ATTN)
        h = h + _peer_conv(env, d, lw.peer_weights[1 if mlp else 0], cache, s, off, width)
        out += [h, norm(lw.gathered[i] if pieces is None else _gathered_rows(pieces), nw, EPS)]
    return out


def _gathered_rows(pieces: torch.Tensor) -> torch.Tensor:
    """The rows vLLM's ``all_gather(dim=-1)`` returns: the ``[tp, T, S]`` buffer its
    collective fills, moved and reshaped into ``[T, tp * S]`` (a copy on the GPU)."""
    tp, t, s = pieces.shape
    return pieces.movedim(0, 1).reshape(t, tp * s)


def _row_norms(env: Env) -> dict[str, Callable[..., Any]]:
    """RMSNorms of gathered rows: F.rms_norm and, on CUDA, a torch.compile'd one."""
    out: dict[str, Callable[..., Any]] = {"F.rms_norm": gathered_rms_norm_rows}
    if env.compile_norm:
        out["compiled"] = _compiled_rms()
    return out


def gathered_rms_norm_rows(rows: torch.Tensor, nw: torch.Tensor, eps: float) -> torch.Tensor:
    """The RMSNorm of all-gathered rows at tp > 1: torch's rms_norm kernel."""
    return F.rms_norm(rows, (rows.shape[-1],), nw, eps)


def _rms_fp32(rows: torch.Tensor, nw: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' InklingRMSNorm in torch ops (what torch.compile fuses)."""
    x = rows.float()
    return nw * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(rows.dtype)


@functools.cache
def _compiled_rms() -> Callable[..., Any]:
    return torch.compile(_rms_fp32, dynamic=True)


# ----------------------------------------------------------------------------- gathered_rms_norm


def _gathered(tp: int, requests: list[tuple[int, int]]) -> Callable[[Env], Prepared]:
    """gathered_rms_norm on [tp, T, hidden / tp] pieces; the peer: the layout copy of an
    all-gather along the last dim, then F.rms_norm of the rows."""

    def prepare(env: Env) -> Prepared:
        hidden, t = env.sizes.hidden, _rows(requests)
        nbytes = 2 * t * hidden * env.sizes.dtype.itemsize
        xs = [env.randn(tp, t, hidden // tp, scale=2.0) for _ in range(env.num_sets(nbytes))]
        nw = (1 + 0.2 * torch.randn(hidden, device=env.device)).to(env.sizes.dtype)
        _close(env, "normed", gathered_rms_norm(xs[0], nw, EPS), gathered_rms_norm_ref(xs[0], nw, EPS))
        prep = Prepared([lambda x=x: gathered_rms_norm(x, nw, EPS) for x in xs], nbytes)
        prep.peer["copy + F.rms_norm"] = [
            lambda x=x: F.rms_norm(x.movedim(0, 1).reshape(t, hidden), (hidden,), nw, EPS) for x in xs]
        return prep

    return prepare


# ----------------------------------------------------------------------------- relative-logit attention


def _attention(mix: list[tuple[int, int]], opts: dict[str, Any]) -> Callable[[Env], Prepared]:
    """paged_rel_attention_triton (default tiling) on Inkling's page layout; the peer
    column is torch's flash SDPA without the bias on the same keys gathered dense (the
    speed floor: vLLM has no relative-logit attention)."""

    def prepare(env: Env) -> Prepared:
        a, dt, dev = env.sizes.attention, env.sizes.dtype, env.device
        hq, dh, d_rel = a["hq"], a["dh"], a["d_rel"]
        hkv, n, window, pad = opts.get("hkv", 8 if not env.sizes.smoke else 2), opts.get("n", a["n"]), \
            opts.get("window"), opts.get("pad", 0)
        lens = [c + t for c, t in mix]
        per_req = [-(-length // n) for length in lens]
        nb = sum(per_req) + 1
        page = env.randn(nb, hkv, n, 2 * dh)
        kv = page.unflatten(-1, (2, dh)).transpose(1, 2)  # [nb, N, Hkv, 2, Dh] views
        kc, vc = kv[..., 0, :], kv[..., 1, :]
        perm = torch.randperm(nb, generator=env.gen).to(torch.int32)
        table = torch.zeros(len(lens), max(per_req), dtype=torch.int32)
        at = 0
        for i, cnt in enumerate(per_req):
            table[i, :cnt] = perm[at:at + cnt]
            at += cnt
        rows = _rows(mix)
        q = torch.randn(rows + pad, hq, dh, device=dev)
        q = (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dt)
        r = env.randn(rows + pad, hq, d_rel)
        rel_proj = env.randn(d_rel, window or a["extent"], scale=0.5)
        pos = torch.cat([torch.arange(c, c + t) for c, t in mix] + [torch.zeros(pad, dtype=torch.int64)]).to(dev)
        qsl = torch.tensor([0] + torch.tensor([t for _, t in mix]).cumsum(0).tolist(), dtype=torch.int32)
        sl = torch.tensor(lens, dtype=torch.int32)
        kw = dict(scale=1.0 / dh, window=window, log_scaling=None if window else (4096, 0.1))
        out = torch.empty_like(q)
        args = (q, r, rel_proj, kc, vc, pos, table.to(dev), qsl.to(dev), sl.to(dev))
        tol = 3e-2 if dt == torch.bfloat16 else 1e-3
        got = paged_rel_attention_triton(*args, **kw, out=out, max_seq_len=max(lens)).clone()
        want = paged_rel_attention(q, r, rel_proj, kc, vc, pos, table.to(dev), qsl, sl, **kw)
        err = float((got[:rows].float() - want[:rows].float()).abs().max())
        if not err <= tol:
            raise AssertionError(f"out: max abs error {err:.3g} against the PyTorch path")
        keys = sum(c + t - (0 if window is None else max(0, c - window + 1)) for c, t in mix)
        nbytes = keys * hkv * dh * 2 * dt.itemsize  # the K and V the queries must read
        prep = Prepared([lambda: paged_rel_attention_triton(*args, **kw, out=out, max_seq_len=max(lens))], nbytes)
        for label, config in env.attention_configs.items():
            tiled = paged_rel_attention_triton(*args, **kw, out=out, max_seq_len=max(lens), config=config)
            err = float((tiled[:rows].float() - want[:rows].float()).abs().max())
            if not err <= tol:
                raise AssertionError(f"tiling {label}: max abs error {err:.3g} against the PyTorch path")
            prep.ours_alt[f"tiling {label}"] = [
                lambda config=config: paged_rel_attention_triton(*args, **kw, out=out, max_seq_len=max(lens),
                                                                 config=config)]
        if not env.sizes.smoke:
            prep.peer["SDPA flash, no bias"] = [_sdpa(page, table, q, mix, hkv, dh, qsl.tolist())]
        if window is not None and all(t == 1 and c + 1 >= window for c, t in mix):
            flex, flex_out = _flex_window_decode(page, table, q, r, rel_proj, lens, window)
            if env.device.type == "cuda":  # (the CPU's Flex runs unfused: checked, not timed)
                prep.peer["FlexAttention, bias as score_mod, window gathered dense"] = [flex]
            err = float((flex_out()[:rows].float() - got[:rows].float()).abs().max())
            if not err <= tol:
                raise AssertionError(f"FlexAttention: max abs error {err:.3g} against ours")
        return prep

    return prepare


def _request_kv(page: torch.Tensor, table: torch.Tensor, b: int, length: int, device: torch.device) -> torch.Tensor:
    """Request ``b``'s first ``length`` keys and values, ``[Hkv, length, 2 * Dh]``, gathered
    from its pages (``[blocks, Hkv, N, 2 * Dh]``) in position order."""
    n, hkv, width = page.shape[2], page.shape[1], page.shape[3]
    cnt = -(-length // n)
    return page[table[b, :cnt].long().to(device)].permute(1, 0, 2, 3).reshape(hkv, cnt * n, width)[:, :length]


@functools.cache
def _compiled_flex() -> Callable[..., Any]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex_window_decode(page: torch.Tensor, table: torch.Tensor, q: torch.Tensor, r: torch.Tensor,
                        rel_proj: torch.Tensor, lens: list[int], window: int
                        ) -> tuple[Callable[[], Any], Callable[[], torch.Tensor]]:
    """FlexAttention for a decode batch of a sliding-window layer (one row a request,
    every request at least ``window`` keys long): each request's window of keys and
    values gathered dense (``[R, Hkv, window, Dh]``, outside the timing: Flex reads no
    page table), the relative bias ``r @ rel_proj`` recomputed in the timed call and
    added by a ``score_mod`` (key ``i`` of the window lies ``window - 1 - i`` before
    the query). Compiled on CUDA, unfused elsewhere. Returns (timed call, output as
    ``[R, Hq, Dh]``)."""
    from torch.nn.attention.flex_attention import flex_attention

    reqs, hq, dh = len(lens), q.shape[1], q.shape[2]
    hkv, extent = page.shape[1], rel_proj.shape[1]
    kd = torch.empty(reqs, hkv, window, dh, dtype=q.dtype, device=q.device)
    vd = torch.empty_like(kd)
    for b, length in enumerate(lens):
        seq = _request_kv(page, table, b, length, q.device)[:, length - window:]
        kd[b], vd[b] = seq[..., :dh], seq[..., dh:]
    qd = q[:reqs].unsqueeze(2)  # [R, Hq, 1, Dh]
    r32, p32 = r[:reqs].float(), rel_proj.float()
    rl = torch.empty(reqs, hq, extent, dtype=torch.float32, device=q.device)

    def score_mod(score: Any, b: Any, h: Any, q_idx: Any, kv: Any) -> Any:
        d = window - 1 - kv
        return score + torch.where(d < extent, rl[b, h, torch.clamp(d, max=extent - 1)], 0.0)

    attend = _compiled_flex() if q.is_cuda else flex_attention
    state: dict[str, torch.Tensor] = {}

    def run() -> None:
        torch.matmul(r32, p32, out=rl)
        with warnings.catch_warnings():  # the CPU's unfused Flex says so on every call
            warnings.simplefilter("ignore", UserWarning)
            state["o"] = attend(qd, kd, vd, score_mod=score_mod, scale=1.0 / dh, enable_gqa=True)

    def result() -> torch.Tensor:
        run()
        return state["o"][:, :, 0]

    return run, result


def _sdpa(page: torch.Tensor, table: torch.Tensor, q: torch.Tensor, mix: list[tuple[int, int]], hkv: int,
          dh: int, starts: list[int]) -> Callable[[], Any]:
    """torch's flash SDPA, no bias, K/V gathered dense per request (outside the timing);
    requests of equal (context, rows) batched, lower-right causal when rows < keys."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    groups: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(mix):
        groups.setdefault(key, []).append(i)
    calls = []
    for (ctx, qlen), idx in groups.items():
        length = ctx + qlen
        kd = torch.empty(len(idx), hkv, length, dh, dtype=q.dtype, device=q.device)
        vd, qd = torch.empty_like(kd), torch.empty(len(idx), q.shape[1], qlen, dh, dtype=q.dtype, device=q.device)
        for j, b in enumerate(idx):
            seq = _request_kv(page, table, b, length, q.device)
            kd[j], vd[j] = seq[..., :dh], seq[..., dh:]
            qd[j] = q[starts[b]:starts[b] + qlen].transpose(0, 1)
        mask = None if qlen in (1, length) else causal_lower_right(qlen, length)
        calls.append((qd, kd, vd, mask, qlen == length and qlen > 1))

    def run() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for qd, kd, vd, mask, causal in calls:
                F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, is_causal=causal, scale=1.0 / dh,
                                               enable_gqa=True)

    return run


# ----------------------------------------------------------------------------- the registry


def registry(sizes: Sizes) -> list[Case]:
    """Every case of a size set, in the order they run."""
    cases = [Case(f"sconv {name}", "sconv", "vLLM fused_sconv", _sconv(stream, reqs, name.startswith("one-step")))
             for name, stream, reqs in sizes.sconv_steps]
    cases += [Case(f"sconv_seq_metadata {name}", "sconv_seq_metadata", "vLLM sconv_seq_metadata",
                   _metadata(lens, pad)) for name, lens, pad in sizes.metadata_steps]
    tps = (1, sizes.tp_shard)
    for kind in sizes.kv_heads:
        for tp in tps:
            cases += [Case(f"sconv_kv {kind} tp{tp} {step}", "sconv_kv", "vLLM fused_sconv x2 + copies",
                           _kv(kind, tp, reqs)) for step, reqs in sizes.steps]
    chunked = [("chunked 8192 after 8190", [(8190, 8192)])] if not sizes.smoke else []
    cases += [Case(f"sconv_add_rmsnorm {step}", "sconv_add_rmsnorm", "vLLM fused_sconv + add + RMSNorm",
                   _add_rmsnorm(reqs)) for step, reqs in sizes.steps + chunked]
    for kind in sizes.kv_heads:
        for tp in tps:
            cases += [Case(f"layer {kind} tp{tp} {step}", "layer", "vLLM fused_sconv x4 + add + RMSNorm x2",
                           _layer(kind, tp, reqs)) for step, reqs in sizes.steps]
    cases += [Case(f"layer+gather {kind} tp{sizes.tp_shard} {step}", "layer+gather",
                   "vLLM fused_sconv x4 + all-gather copy + add + RMSNorm x2", _layer(kind, sizes.tp_shard, reqs, True))
              for kind in sizes.kv_heads for step, reqs in sizes.steps]
    cases += [Case(f"gathered_rms_norm tp{tp} {step}", "gathered_rms_norm", "copy + F.rms_norm",
                   _gathered(tp, reqs)) for tp in sizes.gathered_tp for step, reqs in sizes.steps]
    cases += [Case(f"rel_attention {name}", "rel_attention", "SDPA flash, no bias", _attention(mix, opts))
              for name, mix, opts in sizes.attention_steps]
    return cases
