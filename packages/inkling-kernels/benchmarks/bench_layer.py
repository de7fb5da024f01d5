"""Per-layer benchmark: one Inkling decoder layer's conv work against vLLM 0.33.0's kernel.

One decoder layer runs four short convs per step: K and V (on the column slices of the
fused QKV projection), ATTN (the attention output after o_proj) followed by the
residual add and the post-attention RMSNorm, and MLP followed by the residual add and
the next layer's input RMSNorm. This script times that work as two sequences, per
step size and tensor-parallel shard shape, in one run:

* **ours** -- TP 1: ``fused_sconv_kv`` (K and V in one launch, on the strided slices
  of ``qkv``) + ``fused_sconv_add_rmsnorm`` (ATTN) + ``fused_sconv_add_rmsnorm`` (MLP),
  on the step's batch carrying its tap map (``sconv_tap_map``, built once per step and
  KV-cache group: reported apart, amortised over the group's layers, and charged in
  full to the layer). TP > 1: ``fused_sconv_kv`` on the rank's KV heads +
  ``fused_sconv_add`` (conv + residual add on the ``hidden/tp`` shard) + the RMSNorm
  of the full (all-gathered) row, for ATTN and for MLP; the norm is the faster of a
  torch.compile'd RMSNorm and ``F.rms_norm`` (both timed, the choice recorded).
* **peer** -- vLLM 0.33.0's in-tree ``fused_sconv`` (imported from ``--peer-dir``,
  written by fetch_peer.py; never committed) for K, for V, for ATTN and for MLP, each
  followed for ATTN/MLP by one fused residual add + RMSNorm: the faster of a
  torch.compile'd (inductor) ``h + y`` then RMSNorm (bench_sconv_add_rmsnorm's
  ``_add_norm``) and ``h + y`` then ``F.rms_norm`` (both timed, the choice recorded).
  The peer asserts a contiguous ``x``, and vLLM's ``InklingShortConv.forward`` calls
  ``x.contiguous()`` before it: the K and V copies out of ``qkv`` are part of the
  peer's sequence (the "peer KV" column without them is reported too). The peer reads
  the same loose metadata tensors its model passes (positions, block table, seq_idx,
  slot mapping, query start); ``seq_idx``/``query_start`` are built once per step for
  every layer by each side's own ``sconv_seq_metadata`` and are not counted on either.
  At TP > 1 the peer's convs run on the same shards and its add + RMSNorm on the full
  row, twice.

Collectives are excluded at TP > 1: both sequences do the same reduce-scatter before
and all-gather after each sublayer's conv, so the full-row tensors the norms read are
stand-ins (random rows) for the all-gathered ones.

Shapes: the 975B model (hidden 6144, head_dim 128, 64 query heads, W = N = 4, bf16,
conv weights fp32), a **global** layer (8 KV heads, D 2048: the layer kind
bench_sconv.py times ATTN on) by default, ``--layers global,sliding`` adds a sliding
layer (16 KV heads, D 1024); each at TP 1 and at the TP 8 shard (one rank's kernel
work). Steps (bench_sconv_kv.STEPS, bench_sconv's batch construction: long varied
histories, random blocks): decode 1 / 64 / 256, spec-verify 64 x 4, prefill 8192,
mixed 2048 + 255 decodes.

Timing: bench_sconv.time_graph -- several independent input sets per case (the working
set well beyond L2), one CUDA graph launching the whole sequence once per set, the
median of ``--reps`` replays divided by the number of sets; every sequence and every
per-sublayer piece is timed that way in the same run. The copy baseline
(bench_sconv.copy_baseline: CUDA events around plain copy_ loops) is measured in the
same run; "of copy" = the layer's minimum bytes per second over it.

Correctness first: per case, on the first input set and copies of the cache, every
output of ours (with the map and without) and of the peer -- k, v, new hidden and
normed of both sublayers -- is compared with the fp32 references
(``fused_sconv_kv_ref``, ``fused_sconv_add_rmsnorm_ref``, ``fused_sconv_ref`` + add,
``rms_norm_ref``) within bf16 tolerance (bench_sconv_add_rmsnorm.ulp_stats: at most 2
rounding steps, 4 for the normed rows) and the caches must equal the reference's
exactly. A case whose own check fails is timed but marked FAIL, and the script exits 1.

    PYTHONPATH=packages/inkling-kernels/src:packages/inkling-cache/src \\
        python3 packages/inkling-kernels/benchmarks/bench_layer.py --peer-dir .peer \\
        --json layer.json --md layer.md
    ... --dry-run   # CPU, TRITON_INTERPRET=1, tiny shapes, every code path, no timing
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional

DRY = "--dry-run" in sys.argv
if DRY:  # before Triton is imported: our ops and the peer run their kernels interpreted
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["INKLING_KERNELS_CPU_BACKEND"] = "triton"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_sconv import DTYPE, N, W, copy_baseline, load_peer, time_graph  # noqa: E402
from bench_sconv_add_rmsnorm import EPS, _add_norm, ulp_stats  # noqa: E402
from bench_sconv_kv import STEPS, KVSet  # noqa: E402
from bench_sconv_kv import Shape as KVShape  # noqa: E402
from bench_sconv_kv import min_bytes as kv_min_bytes  # noqa: E402
from bench_sconv_kv import setup as kv_setup  # noqa: E402

from inkling_cache import ConvStateLayout, Stream  # noqa: E402
from inkling_kernels import (  # noqa: E402
    SconvBatch,
    fused_sconv_add_rmsnorm,
    fused_sconv_add_rmsnorm_ref,
    fused_sconv_kv,
    fused_sconv_kv_ref,
    fused_sconv_ref,
    sconv_tap_map,
)
from inkling_kernels.sconv_add_rmsnorm import rms_norm_ref  # noqa: E402

try:  # conv + residual add without the norm, for TP > 1 shards (branch sconv-add)
    from inkling_kernels import fused_sconv_add
except ImportError:
    fused_sconv_add = None

DEVICE = "cpu" if DRY else "cuda"
HIDDEN, HEAD_DIM, Q_HEADS = 6144, 128, 64  # the 975B text model (docs/design.md §1)
KV_HEADS = {"global": 8, "sliding": 16}
TP_SHARD = 8  # the shard shape timed besides TP 1
GROUP_LAYERS = 11  # layers sharing one tap map (the smallest KV-cache group: 11 global layers)
# bf16 tolerance, in rounding steps (bench_sconv_add_rmsnorm.ulp_stats' unit). Triton's
# interpreter converts fp32 to bf16 by truncation (up to a whole step, where the GPU
# rounds to nearest: half a step), so the dry run allows twice as much.
TOL_ULP, TOL_ULP_NORMED = (4.01, 8.01) if DRY else (2.01, 4.01)

# Dry run: 2 KV heads of 128 (hph 128, D 512), "TP 2" as the shard shape, tiny steps.
DRY_HIDDEN, DRY_KV_HEADS, DRY_TP = 256, 2, 2
DRY_STEPS: list[tuple[str, list[tuple[int, int]]]] = [
    ("decode 1", [(30, 1)]),
    ("decode 3", [(5 + 7 * i, 1) for i in range(3)]),
    ("spec 2x3", [(9 + 5 * i, 3) for i in range(2)]),
    ("prefill 20", [(0, 20)]),
    ("mixed 10+3", [(0, 10)] + [(3 + 6 * i, 1) for i in range(3)]),
]


@dataclass(frozen=True)
class LayerShape:
    """One rank's shapes of one decoder layer: the packed cache layout (K, V, ATTN, MLP
    ranges inside D) and the KV projection's per-rank shape."""

    kind: str  # "global" or "sliding"
    layout: ConvStateLayout
    q_heads: int  # query heads per rank (the q columns of qkv)

    @property
    def tp(self) -> int:
        return int(self.layout.tp_size)

    @property
    def name(self) -> str:
        return f"{self.kind} tp{self.tp}"

    @property
    def kv(self) -> KVShape:
        return KVShape(self.name, self.layout.num_heads, self.layout.head_size, self.q_heads)

    @property
    def shard(self) -> int:
        """ATTN/MLP channels on this rank (hidden / tp)."""
        return int(self.layout.hidden_shard)

    @property
    def hidden(self) -> int:
        return int(self.layout.hidden_size)

    def stream(self, s: Stream) -> tuple[int, int]:
        return self.layout.stream_range(s)


def layer_shapes(kinds: list[str]) -> list[LayerShape]:
    out = []
    for kind in kinds:
        for tp in ((1, DRY_TP) if DRY else (1, TP_SHARD)):
            kv_heads, hidden = (DRY_KV_HEADS, DRY_HIDDEN) if DRY else (KV_HEADS[kind], HIDDEN)
            q_heads = kv_heads if DRY else Q_HEADS
            layout = ConvStateLayout.build(num_kv_heads=kv_heads, head_dim=HEAD_DIM, hidden_size=hidden,
                                           kernel_size=W, tp_size=tp, block_size=N)
            out.append(LayerShape(kind, layout, q_heads // tp))
    return out


def min_bytes(shape: LayerShape, requests: list[tuple[int, int]]) -> dict[str, int]:
    """Minimum bytes of each sublayer of ours (reads, writes, slot stores, pre-forward
    taps, weights); at TP > 1 the norm reads and writes the full row."""
    e = DTYPE.itemsize
    t = sum(n for _, n in requests)
    c, hidden = shape.shard, shape.hidden
    taps = sum(min(W - 1, hist) for hist, _ in requests)
    if shape.tp == 1:  # read h, d; write new h, normed, slot
        sub = (5 * t * c + taps * c + hidden) * e + c * W * 4
    else:  # conv + add (read h, d; write new h, slot) + norm (read row, write normed)
        sub = (4 * t * c + taps * c + 2 * t * hidden + hidden) * e + c * W * 4
    return {"kv": kv_min_bytes(shape.kv, requests), "attn": sub, "mlp": sub}


@dataclass
class LayerSet:
    """One step's inputs of one layer on one rank (besides the metadata and qkv of ``kv``)."""

    kv: KVSet  # metadata (kv.inputs: batch, mapped batch, loose tensors) and qkv
    d_attn: torch.Tensor  # [T, shard] o_proj output (after the reduce-scatter at TP > 1)
    d_mlp: torch.Tensor  # [T, shard] MLP output
    hidden: torch.Tensor  # [T, shard] residual stream on this rank (the full row at TP 1)
    # TP > 1 only: stand-ins for the all-gathered full rows (collectives excluded)
    hidden_full: Optional[torch.Tensor] = None  # the peer's residual row [T, hidden]
    gathered_attn: Optional[torch.Tensor] = None  # ours: new hidden, peer: conv out, gathered
    gathered_mlp: Optional[torch.Tensor] = None

    @property
    def batch(self) -> SconvBatch:
        return self.kv.inputs.batch

    @property
    def full_hidden(self) -> torch.Tensor:
        assert self.hidden_full is not None, "TP > 1 only"
        return self.hidden_full

    def gathered(self, mlp: bool) -> torch.Tensor:
        """TP > 1: the all-gathered full row stand-in of the ATTN (or MLP) sublayer."""
        out = self.gathered_mlp if mlp else self.gathered_attn
        assert out is not None, "TP > 1 only"
        return out

    @property
    def mapped(self) -> SconvBatch:
        return self.kv.inputs.mapped


def _add_frms(hidden: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused add + RMSNorm with torch's own rms_norm kernel."""
    new_h = hidden + y
    return new_h, F.rms_norm(new_h, (new_h.shape[-1],), w, EPS)


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """transformers' InklingRMSNorm (rounding as rms_norm_ref), to be torch.compile'd."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def _frms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def norm_impls(compile_: bool) -> tuple[dict[str, Callable[..., Any]], dict[str, Callable[..., Any]], list[str]]:
    """(add + RMSNorm impls for the peer, RMSNorm impls for ours at TP > 1, notes)."""
    notes = []
    add_norm: dict[str, Callable[..., Any]] = {"F.rms_norm": _add_frms}
    norm: dict[str, Callable[..., Any]] = {"F.rms_norm": _frms}
    if compile_:
        try:
            add_norm["compiled"] = torch.compile(_add_norm, dynamic=True)
            norm["compiled"] = torch.compile(_rms, dynamic=True)
        except Exception as exc:  # reported, the F.rms_norm variants remain
            notes.append(f"torch.compile failed: {exc!r}"[:300])
    else:
        add_norm["eager"] = _add_norm  # dry run: the compiled function's code, uncompiled
        norm["eager"] = _rms
    return add_norm, norm, notes


class Layer:
    """One case: a layer shape, a step, its input sets, weights and both sequences."""

    def __init__(self, shape: LayerShape, requests: list[tuple[int, int]], num_sets: int, gen: torch.Generator,
                 peer: Any) -> None:
        self.shape, self.requests, self.peer = shape, requests, peer
        self.cache, self.wk, self.wv, kv_sets = kv_setup(shape.kv, requests, num_sets, gen, DEVICE)
        assert self.cache.shape[-1] == shape.layout.head_size
        c, hidden = shape.shard, shape.hidden
        dev = self.cache.device
        # ATTN/MLP conv weights: ours channel-contiguous as InklingShortConvAddRMSNorm
        # keeps them; the peer's (C, W) contiguous as vLLM's weight.squeeze(1) is.
        self.w_attn = (0.5 * torch.randn(W, c, device=dev)).t().unsqueeze(1)
        self.w_mlp = (0.5 * torch.randn(W, c, device=dev)).t().unsqueeze(1)
        self.pw_attn, self.pw_mlp = self.w_attn[:, 0, :].contiguous(), self.w_mlp[:, 0, :].contiguous()
        self.nw_attn = (1 + 0.2 * torch.randn(hidden, device=dev)).to(DTYPE)
        self.nw_mlp = (1 + 0.2 * torch.randn(hidden, device=dev)).to(DTYPE)
        self.sets = []
        for kv in kv_sets:
            t = kv.qkv.shape[0]

            def rows(width: int) -> torch.Tensor:
                return torch.randn(t, width, device=dev, dtype=DTYPE)

            s = LayerSet(kv, rows(c), rows(c), rows(c))
            if shape.tp > 1:
                s.hidden_full, s.gathered_attn, s.gathered_mlp = rows(hidden), rows(hidden), rows(hidden)
            self.sets.append(s)
        self.k_off, hd = shape.stream(Stream.K)
        self.v_off, _ = shape.stream(Stream.V)
        self.a_off, self.hph = shape.stream(Stream.ATTN)
        self.m_off, _ = shape.stream(Stream.MLP)
        assert hd == HEAD_DIM

    @property
    def num_tokens(self) -> int:
        return int(self.sets[0].kv.qkv.shape[0])

    # ------------------------------------------------------------------ ours
    def ours_kv(self, s: LayerSet, cache: torch.Tensor, b: SconvBatch) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = s.kv.slices(self.shape.kv)
        return fused_sconv_kv(k, v, self.wk, self.wv, cache, b, self.k_off, self.v_off, HEAD_DIM)

    def ours_sub(self, s: LayerSet, cache: torch.Tensor, b: SconvBatch, mlp: bool, hidden: torch.Tensor,
                 norm: Optional[Callable[..., Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        """ATTN (or MLP) conv + residual add + RMSNorm: ``(new_hidden, normed)``."""
        d, w, off, nw = ((s.d_mlp, self.w_mlp, self.m_off, self.nw_mlp) if mlp
                         else (s.d_attn, self.w_attn, self.a_off, self.nw_attn))
        if self.shape.tp == 1:
            return fused_sconv_add_rmsnorm(hidden, d, w, cache, b, off, self.hph, nw, EPS)
        assert fused_sconv_add is not None and norm is not None
        new_h = fused_sconv_add(hidden, d, w, cache, b, off, self.hph)
        return new_h, norm(s.gathered(mlp), nw)  # the row all-gathered from new_h (excluded)

    def ours(self, s: LayerSet, cache: torch.Tensor, b: SconvBatch,
             norm: Optional[Callable[..., Any]]) -> list[torch.Tensor]:
        k, v = self.ours_kv(s, cache, b)
        h1, n1 = self.ours_sub(s, cache, b, False, s.hidden, norm)
        h2, n2 = self.ours_sub(s, cache, b, True, h1, norm)
        return [k, v, h1, n1, h2, n2]

    # ------------------------------------------------------------------ peer
    def peer_conv(self, x: torch.Tensor, w: torch.Tensor, cache: torch.Tensor, s: LayerSet, off: int,
                  width: int) -> torch.Tensor:
        i = s.kv.inputs
        return self.peer.fused_sconv(x, w, cache, i.positions, i.table, i.seq, i.slots, i.qs, off, width, N)

    def peer_kv(self, s: LayerSet, cache: torch.Tensor, copies: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = s.kv.slices(self.shape.kv)
        if copies:  # vLLM's InklingShortConv.forward: x = x.contiguous()
            k, v = k.contiguous(), v.contiguous()
        else:  # (the copies made beforehand: their cost alone is the difference)
            k, v = s.kv.k_dense, s.kv.v_dense
        return (self.peer_conv(k, self.wk, cache, s, self.k_off, HEAD_DIM),
                self.peer_conv(v, self.wv, cache, s, self.v_off, HEAD_DIM))

    def peer_sub(self, s: LayerSet, cache: torch.Tensor, mlp: bool, hidden: torch.Tensor,
                 add_norm: Callable[..., Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(conv out, new_hidden, normed)``; at TP > 1 the add + norm read the full
        rows (the gathered conv output stand-in and the full residual row)."""
        d, w, off, nw = ((s.d_mlp, self.pw_mlp, self.m_off, self.nw_mlp) if mlp
                         else (s.d_attn, self.pw_attn, self.a_off, self.nw_attn))
        y = self.peer_conv(d, w, cache, s, off, self.hph)
        if self.shape.tp == 1:
            return (y, *add_norm(hidden, y, nw))
        return (y, *add_norm(hidden, s.gathered(mlp), nw))

    def peer_seq(self, s: LayerSet, cache: torch.Tensor, add_norm: Callable[..., Any]) -> list[torch.Tensor]:
        k, v = self.peer_kv(s, cache)
        h0 = s.hidden if self.shape.tp == 1 else s.full_hidden
        y1, h1, n1 = self.peer_sub(s, cache, False, h0, add_norm)
        y2, h2, n2 = self.peer_sub(s, cache, True, h1, add_norm)
        return [k, v, y1, h1, n1, y2, h2, n2]

    # ------------------------------------------------------------------ check
    def reference(self, s: LayerSet) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        """The fp32 references of the layer's chain on set 0: the wanted outputs and the
        cache after K+V, after ATTN and at the end."""
        cache = self.cache.clone()
        k, v = s.kv.slices(self.shape.kv)
        out: dict[str, torch.Tensor] = {}
        out["k"], out["v"] = fused_sconv_kv_ref(k, v, self.wk, self.wv, cache, s.batch, self.k_off, self.v_off,
                                                HEAD_DIM)
        caches = [cache.clone()]
        h, full_h = s.hidden, s.hidden_full if self.shape.tp > 1 else None
        for name, d, w, off, nw in (("attn", s.d_attn, self.w_attn, self.a_off, self.nw_attn),
                                    ("mlp", s.d_mlp, self.w_mlp, self.m_off, self.nw_mlp)):
            if self.shape.tp == 1:
                h, out[f"{name} normed"] = fused_sconv_add_rmsnorm_ref(h, d, w, cache, s.batch, off, self.hph, nw,
                                                                      EPS)
            else:
                out[f"{name} conv"] = conv = fused_sconv_ref(d, w, cache, s.batch, off, self.hph)
                h = (h.float() + conv.float()).to(DTYPE)
                gathered = s.gathered(name == "mlp")
                out[f"{name} normed"] = rms_norm_ref(gathered, nw, EPS)
                assert full_h is not None
                out.update(self.full_row_ref(name, full_h, gathered, nw))
                full_h = out[f"{name} full new hidden"]
            out[f"{name} new hidden"] = h
            caches.append(cache.clone() if name == "attn" else cache)
        return out, caches

    @staticmethod
    def full_row_ref(name: str, hidden: torch.Tensor, y: torch.Tensor, nw: torch.Tensor) -> dict[str, torch.Tensor]:
        """TP > 1, the peer: the add + RMSNorm of the full row."""
        new_h = (hidden.float() + y.float()).to(DTYPE)
        return {f"{name} full new hidden": new_h, f"{name} full normed": rms_norm_ref(new_h, nw, EPS)}

    def mlp_ref_from(self, s: LayerSet, want: dict[str, torch.Tensor], after_attn: torch.Tensor,
                     h1: torch.Tensor, full: bool) -> dict[str, torch.Tensor]:
        """The MLP sublayer's wanted outputs from a sequence's own ATTN new hidden ``h1``
        (so each sublayer is held to its own tolerance, not the chain's)."""
        if self.shape.tp == 1:
            h2, n2 = fused_sconv_add_rmsnorm_ref(h1, s.d_mlp, self.w_mlp, after_attn.clone(), s.batch, self.m_off,
                                                 self.hph, self.nw_mlp, EPS)
            return {"mlp new hidden": h2, "mlp normed": n2}
        if full:
            return self.full_row_ref("mlp", h1, s.gathered(True), self.nw_mlp)
        return {"mlp new hidden": (h1.float() + want["mlp conv"].float()).to(DTYPE)}

    def check(self, add_norm: dict[str, Callable[..., Any]], norm: dict[str, Callable[..., Any]]) -> dict[str, Any]:
        """Ours (with and without the map, each norm impl at TP > 1) and the peer (each
        add + norm impl) on set 0 vs the fp32 references within bf16 tolerance; the
        caches must equal the reference's exactly."""
        s = self.sets[0]
        want, (after_kv, after_attn, want_cache) = self.reference(s)
        res: dict[str, Any] = {}
        tp1 = self.shape.tp == 1

        def compare(label: str, got: dict[str, torch.Tensor], cache: torch.Tensor, cache_want: torch.Tensor,
                    wanted: dict[str, torch.Tensor]) -> bool:
            worst: dict[str, float] = {}
            exact = torch.equal(cache, cache_want)
            ok = exact
            for key, g in got.items():
                ulp = ulp_stats(g, wanted[key])[1]
                worst[key] = round(ulp, 3)
                ok &= ulp <= (TOL_ULP_NORMED if "normed" in key else TOL_ULP) and not bool(torch.isnan(g).any())
            res[label] = dict(ok=bool(ok), cache_exact=bool(exact), max_ulp=worst)
            return bool(ok)

        ours_ok, ours_out = True, None
        if tp1 or fused_sconv_add is not None:
            for mapped in (True, False):
                for nname, nfn in ({"fused": None} if tp1 else norm).items():
                    cache = self.cache.clone()
                    got = dict(zip(("k", "v", "attn new hidden", "attn normed", "mlp new hidden", "mlp normed"),
                                   self.ours(s, cache, s.mapped if mapped else s.batch, nfn)))
                    wanted = {**want, **self.mlp_ref_from(s, want, after_attn, got["attn new hidden"], False)}
                    label = f"ours{'' if mapped else ', no map'}{'' if tp1 else ', ' + nname}"
                    ours_ok &= compare(label, got, cache, want_cache, wanted)
                    ours_out = ours_out or got
        else:  # the K+V op alone
            cache = self.cache.clone()
            got = dict(zip(("k", "v"), self.ours_kv(s, cache, s.mapped)))
            ours_ok = compare("ours KV only (no fused_sconv_add in this tree)", got, cache, after_kv, want)
            ours_out = got
        peer_ok = True
        if self.peer is not None:
            for aname, afn in add_norm.items():
                cache = self.cache.clone()
                out = self.peer_seq(s, cache, afn)
                names = (("k", "v", "attn conv", "attn new hidden", "attn normed", "mlp conv", "mlp new hidden",
                          "mlp normed") if tp1 else
                         ("k", "v", "attn conv", "attn full new hidden", "attn full normed", "mlp conv",
                          "mlp full new hidden", "mlp full normed"))
                got = dict(zip(names, out))
                if tp1:  # the peer's conv outputs feed its add + norm: checked through them
                    del got["attn conv"], got["mlp conv"]
                wanted = {**want, **self.mlp_ref_from(s, want, after_attn, out[3], not tp1)}
                peer_ok &= compare(f"peer, {aname}", got, cache, want_cache, wanted)
                if ours_out is not None:  # ours vs the peer, where both give the same tensor
                    res.setdefault("ours_vs_peer_max_abs", {}).update(
                        {k: float((ours_out[k].float() - g.float()).abs().max()) for k, g in got.items()
                         if k in ours_out and k in ("k", "v", "attn new hidden", "attn normed")})
        res["ours_ok"], res["peer_ok"] = bool(ours_ok), bool(peer_ok)
        return res


def dry_time(launches: list[Callable[[], Any]], reps: int) -> float:
    """Dry run: every launch once (the code path runs), no timing."""
    for f in launches:
        f()
    return float("nan")


def fastest(times: dict[str, float]) -> str:
    """The key of the smallest time (NaN-safe: the first key when nothing compares)."""
    finite = {k: v for k, v in times.items() if v == v}
    return min(finite, key=finite.__getitem__) if finite else next(iter(times))


def bench_case(shape: LayerShape, step: str, requests: list[tuple[int, int]], peer: Any, reps: int,
               gen: torch.Generator, add_norm: dict[str, Callable[..., Any]], norm: dict[str, Callable[..., Any]],
               group_layers: int) -> dict[str, Any]:
    timer = dry_time if DRY else time_graph
    nbytes = min_bytes(shape, requests)
    total = sum(nbytes.values())
    num_sets = 1 if DRY else max(2, min(16, math.ceil(256e6 / total)))
    lay = Layer(shape, requests, num_sets, gen, peer)
    t = lay.num_tokens
    res: dict[str, Any] = dict(layer=shape.kind, tp=shape.tp, step=step, T=t, shard=shape.shard,
                               kv_heads=shape.layout.num_heads, D=shape.layout.head_size, sets=num_sets,
                               min_bytes=nbytes, min_bytes_total=total)
    # 1. correctness on set 0 (before any timing)
    res["check"] = lay.check(add_norm, norm)
    sets, cache = lay.sets, lay.cache
    tp1 = shape.tp == 1
    have_ours = tp1 or fused_sconv_add is not None

    def each(f: Callable[[LayerSet], Any]) -> list[Callable[[], Any]]:
        return [lambda s=s: f(s) for s in sets]

    # 2. the step's tap map (two launches), built once per step and KV-cache group
    res["map_build_us"] = timer(each(lambda s: sconv_tap_map(s.batch, s.kv.inputs.tap_map)), reps)
    # 3. the sequences
    if have_ours:
        impls = {"fused": None} if tp1 else norm
        ours_t = {n: timer(each(lambda s, fn=fn: lay.ours(s, cache, s.mapped, fn)), reps) for n, fn in impls.items()}
        res["ours_norm_us"] = ours_t
        res["ours_norm"] = best = fastest(ours_t)
        res["ours_us"] = ours_t[best]
        res["ours_nomap_us"] = timer(each(lambda s: lay.ours(s, cache, s.batch, impls[best])), reps)
        res["ours_map_amortised_us"] = res["ours_us"] + res["map_build_us"] / group_layers
        res["ours_map_full_us"] = res["ours_us"] + res["map_build_us"]
        # per-sublayer pieces, same method
        res.update(_time_sublayers(lay, impls[best], timer, each, reps))
    else:
        res["ours_kv_us"] = timer(each(lambda s: lay.ours_kv(s, cache, s.mapped)), reps)
        res["ours_missing"] = "fused_sconv_add is not in this tree: ours' TP > 1 sequence not timed"
    if peer is not None:
        peer_t = {n: timer(each(lambda s, fn=fn: lay.peer_seq(s, cache, fn)), reps) for n, fn in add_norm.items()}
        res["peer_add_norm_us"] = peer_t
        res["peer_add_norm"] = pbest = fastest(peer_t)
        res["peer_us"] = peer_t[pbest]
        res["peer_kv_us"] = timer(each(lambda s: lay.peer_kv(s, cache)), reps)
        res["peer_kv_nocopy_us"] = timer(each(lambda s: lay.peer_kv(s, cache, copies=False)), reps)
        for name, mlp in (("attn", False), ("mlp", True)):
            res[f"peer_{name}_us"] = timer(
                each(lambda s, m=mlp: lay.peer_sub(s, cache, m, s.hidden if tp1 else s.full_hidden,
                                                   add_norm[pbest])), reps)
    if have_ours and peer is not None:
        p = res["peer_us"]
        res["ratio_map_amortised"] = p / res["ours_map_amortised_us"]
        res["ratio_map_excluded"] = p / res["ours_us"]
        res["ratio_map_full"] = p / res["ours_map_full_us"]
        res["ratio_nomap"] = p / res["ours_nomap_us"]
    for name in ("kv", "attn", "mlp"):
        if f"peer_{name}_us" in res and f"ours_{name}_us" in res:
            res[f"ratio_{name}"] = res[f"peer_{name}_us"] / res[f"ours_{name}_us"]
    if have_ours:
        res["ours_GBps"] = total / (res["ours_map_amortised_us"] * 1e-6) / 1e9
    del lay, sets, cache
    if not DRY:
        torch.cuda.empty_cache()
    return res


def _time_sublayers(lay: Layer, norm_fn: Any, timer: Callable[..., float], each: Callable[..., Any],
                    reps: int) -> dict[str, float]:
    """Ours' three sublayers (K+V, ATTN + norm, MLP + norm) on the mapped batch, each
    timed alone."""
    cache = lay.cache
    out = {"ours_kv_us": timer(each(lambda s: lay.ours_kv(s, cache, s.mapped)), reps)}
    for name, mlp in (("attn", False), ("mlp", True)):
        out[f"ours_{name}_us"] = timer(
            each(lambda s, m=mlp: lay.ours_sub(s, cache, s.mapped, m, s.hidden, norm_fn)), reps)
    return out


def _f(v: Any, nd: int = 2, suffix: str = "") -> str:
    return "—" if v is None or (isinstance(v, float) and v != v) else f"{v:.{nd}f}{suffix}"


def markdown(results: dict[str, Any]) -> str:
    copy = results["copy_GBps"]
    g = results["group_layers"]
    lines = [
        f"Device {results['device']} (driver {results['driver']}); torch {results['torch']}, triton "
        f"{results['triton']}, CUDA {results['cuda']}, "
        f"Python {results['python']}; {results['date']}; commit {results['commit']}; peer: {results['peer']}.",
        f"Command: `{results['command']}`.",
        f"Copy baseline (same run, read + write): **{_f(copy, 0)} GB/s** ({results['copy_baseline']['method']}).",
        "",
        "One decoder layer's conv work per step and rank, µs (CUDA-graph replay, median of "
        f"{results['reps']} replays over several input sets). ours = fused_sconv_kv + ATTN and MLP "
        "(TP 1: fused_sconv_add_rmsnorm; TP > 1: fused_sconv_add on the hidden/tp shard + RMSNorm of the "
        "full row) on the step's batch with its tap map; peer = vLLM 0.33.0 fused_sconv for K, V (with the "
        "x.contiguous() copies vLLM makes), ATTN and MLP + the faster unfused add + RMSNorm (torch.compile'd "
        "or F.rms_norm) twice. Collectives excluded at TP > 1 (the same on both sides).",
        f"`ours` excludes the map build; `+map/{g}` adds the build amortised over the {g} layers of the KV-cache "
        "group that share it; `+map` charges the whole build to this one layer; `no map` runs ours without a "
        "tap map (each launch resolves its taps, large ones build a map per launch). Ratios are peer / ours "
        "(> 1: ours faster). `of copy` = the layer's minimum bytes at `+map/g` over the copy baseline. "
        "Breakdown: the sublayers timed alone (same method); peer KV includes the two copies, `KV no copy` "
        "is without them.",
        "",
        f"| layer | step | T | ours µs | map build µs | ours +map/{g} µs | ours +map µs | ours no map µs | peer µs "
        f"| **peer/ours +map/{g}** | peer/ours | peer/ours +map | peer/ours no map | of copy | norms ours; peer "
        "| ours KV / ATTN / MLP µs | peer KV / ATTN / MLP µs (KV no copy) | peer/ours KV / ATTN / MLP | check |",
        "|" + "---|" * 19,
    ]
    for r in results["cases"]:
        chk = r.get("check", {})
        check = ("ok" if chk.get("ours_ok") else "**ours FAIL**") + ("" if chk.get("peer_ok", True) else
                                                                     ", peer off")
        lines.append(
            f"| {r['layer']} tp{r['tp']} | {r['step']} | {r['T']} | {_f(r.get('ours_us'))} | "
            f"{_f(r.get('map_build_us'))} | {_f(r.get('ours_map_amortised_us'))} | {_f(r.get('ours_map_full_us'))} | "
            f"{_f(r.get('ours_nomap_us'))} | {_f(r.get('peer_us'))} | **{_f(r.get('ratio_map_amortised'), 2, 'x')}** | "
            f"{_f(r.get('ratio_map_excluded'), 2, 'x')} | {_f(r.get('ratio_map_full'), 2, 'x')} | "
            f"{_f(r.get('ratio_nomap'), 2, 'x')} | "
            f"{_f(r['ours_GBps'] / copy if r.get('ours_GBps') and copy else None)} | "
            f"{r.get('ours_norm', '—')}; {r.get('peer_add_norm', '—')} | "
            f"{_f(r.get('ours_kv_us'))} / {_f(r.get('ours_attn_us'))} / {_f(r.get('ours_mlp_us'))} | "
            f"{_f(r.get('peer_kv_us'))} / {_f(r.get('peer_attn_us'))} / {_f(r.get('peer_mlp_us'))} "
            f"({_f(r.get('peer_kv_nocopy_us'))}) | {_f(r.get('ratio_kv'), 2, 'x')} / "
            f"{_f(r.get('ratio_attn'), 2, 'x')} / {_f(r.get('ratio_mlp'), 2, 'x')} | {check} |")
    if any(r.get("ours_missing") for r in results["cases"]):
        lines += ["", "TP > 1: `fused_sconv_add` was not in the tree, so ours' sequence there was not timed "
                  "(KV only)."]
    def lowest(key: str) -> Optional[tuple[float, str]]:
        vals = [(r[key], f"{r['layer']} tp{r['tp']} {r['step']}") for r in results["cases"]
                if isinstance(r.get(key), float) and r[key] == r[key]]
        return min(vals) if vals else None

    summary = []
    for key, label in (("ratio_map_amortised", f"layer, map amortised over {g} layers"),
                       ("ratio_map_excluded", "layer, map build excluded"), ("ratio_map_full", "layer, whole map build"),
                       ("ratio_nomap", "layer, no map"), ("ratio_kv", "KV"), ("ratio_attn", "ATTN + norm"),
                       ("ratio_mlp", "MLP + norm")):
        low = lowest(key)
        if low is not None:
            summary.append(f"{label} {low[0]:.2f}x ({low[1]})")
    if summary:
        low = lowest("ratio_map_amortised")
        lines += ["", "Lowest peer/ours over the cases: " + "; ".join(summary) + "."]
        if low is not None:
            lines.append(f"Target (the layer >= 1.5x the peer's sequence at every size, map amortised): "
                         f"{'met' if low[0] >= 1.5 else 'NOT met'} in this run.")
    if results.get("notes"):
        lines += ["", "Notes: " + "; ".join(results["notes"])]
    return "\n".join(lines)


def _driver() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"


def _commit() -> str:
    try:
        root = pathlib.Path(__file__).resolve().parents[3]
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or os.environ.get("INKLING_COMMIT", "unknown")
    except Exception:
        return os.environ.get("INKLING_COMMIT", "unknown")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-dir", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[3] / ".peer",
                    help="folder of vllm_sconv_peer.py, written by fetch_peer.py (default: the repository's .peer)")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    ap.add_argument("--md", type=pathlib.Path, default=None)
    ap.add_argument("--reps", type=int, default=50, help="graph replays per timing (median)")
    ap.add_argument("--layers", default="global", help="comma-separated layer kinds: global, sliding")
    ap.add_argument("--group-layers", type=int, default=GROUP_LAYERS,
                    help="layers sharing one tap map (the map build is amortised over them)")
    ap.add_argument("--only", default=None, help="substring filter on '<layer> tp<k> <step>' ('|'-separated alternatives)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd norms")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, TRITON_INTERPRET=1, tiny shapes: every code path once, no timing")
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    peer = load_peer(args.peer_dir)
    provenance = None
    if peer is not None and (args.peer_dir / "PROVENANCE.txt").exists():
        provenance = "; ".join((args.peer_dir / "PROVENANCE.txt").read_text().split("\n")).strip("; ")
    kinds = [k.strip() for k in args.layers.split(",") if k.strip()]
    for k in kinds:
        if k not in KV_HEADS:
            ap.error(f"--layers: unknown kind {k!r} (global, sliding)")
    add_norm, norm, notes = norm_impls(compile_=not (DRY or args.no_compile))
    results: dict[str, Any] = dict(
        device="cpu (dry run, Triton interpreter)" if DRY else torch.cuda.get_device_name(),
        torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
        python=platform.python_version(), driver="none" if DRY else _driver(), commit=_commit(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join([os.path.basename(sys.executable)] + sys.argv),
        peer=provenance or ("vllm_sconv_peer.py" if peer is not None else "none"),
        fused_sconv_add=fused_sconv_add is not None, reps=args.reps, group_layers=args.group_layers,
        dtype=str(DTYPE), W=W, N=N, eps=EPS, notes=notes,
    )
    if DRY:
        results["copy_baseline"] = dict(GBps=float("nan"), method="not measured (dry run)")
    else:
        results["copy_baseline"] = copy_baseline()
        print(f"copy baseline {results['copy_baseline']}", flush=True)
    results["copy_GBps"] = results["copy_baseline"]["GBps"]
    results["cases"] = []
    failed = False
    t0 = time.time()
    for shape in layer_shapes(kinds):
        for step, requests in (DRY_STEPS if DRY else STEPS):
            if args.only and not any(part in f"{shape.name} {step}" for part in args.only.split("|")):
                continue
            try:
                r = bench_case(shape, step, requests, peer, args.reps, gen, add_norm, norm, args.group_layers)
            except Exception:
                traceback.print_exc()
                r = dict(layer=shape.kind, tp=shape.tp, step=step, T=sum(n for _, n in requests),
                         error=traceback.format_exc()[-800:])
                failed = True
            failed |= not r.get("check", {}).get("ours_ok", False)
            results["cases"].append(r)
            print(f"[{time.time() - t0:6.1f} s] " + json.dumps({k: v for k, v in r.items() if k != "check"}),
                  flush=True)
            print(f"    check: {json.dumps(r.get('check'))}", flush=True)
            if args.json:  # keep what is done if the run is cut short
                args.json.write_text(json.dumps(results, indent=1))
    if not DRY:
        results["copy_baseline_end"] = copy_baseline()
    results["elapsed_s"] = round(time.time() - t0, 1)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    md = markdown(results)
    if args.md:
        args.md.write_text(md + "\n")
    print(md)
    if DRY:
        print(f"dry run: {len(results['cases'])} cases, every check {'passed' if not failed else 'FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
