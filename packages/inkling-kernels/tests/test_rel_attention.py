"""Paged relative-logit attention against its dense reference, and the reference
against a naive per-(query, key) loop.

Every random world uses a fixed seed, printed in the assertion messages. The dense
reference receives each sequence's full K/V as generated (never read back through
the block table); the cache holds only what the op may read, everything else is NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch

from inkling_kernels import paged_rel_attention, rel_attention_ref, write_kv

# (tokens already in the cache, query rows this step)
MIX = [
    (40, 1),   # decode, long context
    (0, 17),   # prefill from empty
    (25, 4),   # speculative verify
    (9, 1),    # decode, short context
    (33, 12),  # chunked prefill after context
    (0, 1),    # first token
    (50, 3),   # speculative verify, longest context
    (12, 0),   # request with no rows this step
    (6, 5),    # speculative verify, short context
]

# name -> (window, extent, log_scaling); the mix has contexts up to 53 tokens
LAYERS: dict[str, tuple[int | None, int, tuple[int, float] | None]] = {
    "sliding_small": (8, 8, None),        # window well inside the context
    "sliding_large": (64, 64, None),      # window longer than any context
    "global_log": (None, 6, (4, 0.5)),    # extent < context, tau matters from p = 4
    "global_plain": (None, 16, None),
}


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@dataclass
class World:
    seed: int
    q: torch.Tensor
    r: torch.Tensor
    rel_proj: torch.Tensor
    key: torch.Tensor  # [T, Hkv, Dh] this step's keys (pad rows random)
    value: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    storage: torch.Tensor  # the tensor both caches are views of
    positions: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    slot_mapping: torch.Tensor
    full_k: list[torch.Tensor]  # per request [L, Hkv, Dh]
    full_v: list[torch.Tensor]
    window: int | None
    log_scaling: tuple[int, float] | None
    scale: float
    num_rows: int  # real rows (the rest are pad)

    def kwargs(self) -> dict[str, Any]:
        return dict(scale=self.scale, window=self.window, log_scaling=self.log_scaling)

    def args(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.r, self.rel_proj, self.key_cache, self.value_cache, self.positions,
                self.block_table, self.query_start_loc, self.seq_lens)

    def reference(self, **override: Any) -> torch.Tensor:
        """Dense reference of every real row (pad rows zeros), [T, Hq, Dh]."""
        kw = self.kwargs()
        rel_proj = override.pop("rel_proj", self.rel_proj)
        kw.update(override)
        out = torch.zeros_like(self.q)
        starts = self.query_start_loc.tolist()
        for i, length in enumerate(self.seq_lens.tolist()):
            s, e = starts[i], starts[i + 1]
            if s == e:
                continue
            out[s:e] = rel_attention_ref(
                self.q[s:e], self.full_k[i], self.full_v[i], self.r[s:e], rel_proj,
                torch.arange(length - (e - s), length), torch.arange(length), **kw,
            )
        return out


def build_world(
    *,
    seed: int,
    mix: list[tuple[int, int]] = MIX,
    hkv: int = 2,
    group: int = 2,
    dh: int = 16,
    d_rel: int = 4,
    n: int = 16,
    layer: str = "global_plain",
    dtype: torch.dtype = torch.float32,
    layout: str = "split0",
    num_pad: int = 2,
    spare_blocks: int = 5,
    table_dtype: torch.dtype = torch.int32,
) -> World:
    """A batch over a paged cache: each request's context is stored directly in its
    (shuffled) blocks, only for the positions its queries may see; blocks wholly
    below the window point at a shared NaN null block (id 0); every other slot of
    the cache is NaN. This step's K/V are written with ``write_kv``."""
    window, extent, log_scaling = LAYERS[layer]
    g = torch.Generator().manual_seed(seed)
    hq = hkv * group

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    full_k = [_rms(randn(c + t, hkv, dh)).to(dtype) for c, t in mix]
    full_v = [randn(c + t, hkv, dh).to(dtype) for c, t in mix]
    num_rows = sum(t for _, t in mix)
    total = num_rows + num_pad
    q = _rms(randn(total, hq, dh)).to(dtype)
    r = randn(total, hq, d_rel).to(dtype)
    rel_proj = (0.5 * randn(d_rel, extent)).to(dtype)

    blocks_per_req = [max(1, -(-(c + t) // n)) for c, t in mix]
    num_blocks = 1 + sum(blocks_per_req) + spare_blocks
    pool = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    max_blocks = max(blocks_per_req) + 1
    table = torch.zeros(len(mix), max_blocks, dtype=torch.int64)
    if layout == "split0":
        storage = torch.full((2, num_blocks, n, hkv, dh), float("nan"), dtype=dtype)
        kc, vc = storage[0], storage[1]
    else:
        storage = torch.full((num_blocks, 2, n, hkv, dh), float("nan"), dtype=dtype)
        kc, vc = storage[:, 0], storage[:, 1]

    key = randn(total, hkv, dh).to(dtype)
    value = randn(total, hkv, dh).to(dtype)
    slots = torch.full((total,), -1, dtype=torch.int64)
    positions = torch.zeros(total, dtype=torch.int64)
    starts = [0]
    for i, (ctx, qlen) in enumerate(mix):
        length = ctx + qlen
        lo = 0 if window is None or qlen == 0 else max(0, ctx - window + 1)
        for b in range(blocks_per_req[i]):
            if (b + 1) * n - 1 >= lo:  # block holds a position the queries may see
                table[i, b] = pool.pop()
        if qlen > 0:
            for j in range(lo, ctx):  # the context, stored directly
                kc[table[i, j // n], j % n] = full_k[i][j]
                vc[table[i, j // n], j % n] = full_v[i][j]
        row0 = starts[-1]
        for t in range(qlen):
            j = ctx + t
            positions[row0 + t] = j
            slots[row0 + t] = int(table[i, j // n]) * n + j % n
            key[row0 + t] = full_k[i][j]
            value[row0 + t] = full_v[i][j]
        starts.append(row0 + qlen)
    world = World(
        seed=seed, q=q, r=r, rel_proj=rel_proj, key=key, value=value, key_cache=kc,
        value_cache=vc, storage=storage, positions=positions, block_table=table.to(table_dtype),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor([c + t for c, t in mix], dtype=torch.int32), slot_mapping=slots,
        full_k=full_k, full_v=full_v, window=window, log_scaling=log_scaling,
        scale=1.0 / dh, num_rows=num_rows,
    )
    write_kv(key, value, kc, vc, slots)
    return world


def _tol(dtype: torch.dtype) -> dict[str, Any]:
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)


def _check_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert not torch.isnan(got).any(), f"{what}: NaN in the output (a poisoned slot was read)"
    err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
    torch.testing.assert_close(got, want, **_tol(dtype), msg=lambda m: f"{what}: max err {err}\n{m}")


# --- the reference against a naive loop ------------------------------------------


def _naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor, rel_proj: torch.Tensor,
    qpos: list[int], kpos: list[int], scale: float, window: int | None,
    log_scaling: tuple[int, float] | None,
) -> torch.Tensor:
    """float64 scalar loops over (row, head, key), straight from the definition."""
    tq, hq, dh = q.shape
    group = hq // k.shape[1]
    extent = rel_proj.shape[1]
    out = torch.zeros(tq, hq, dh, dtype=torch.float64)
    for t in range(tq):
        p = qpos[t]
        tau = 1.0
        if log_scaling is not None:
            tau = 1.0 + log_scaling[1] * math.log(max((p + 1) / log_scaling[0], 1.0))
        for h in range(hq):
            kvh = h // group
            logits: list[tuple[float, int]] = []
            for jj, j in enumerate(kpos):
                d = p - j
                if d < 0 or (window is not None and d >= window):
                    continue
                dot = sum(tau * float(q[t, h, x]) * float(k[jj, kvh, x]) for x in range(dh))
                bias = 0.0
                if d < extent:
                    bias = sum(float(r[t, h, c]) * float(rel_proj[c, d]) for c in range(rel_proj.shape[0]))
                logits.append((dot * scale + tau * bias, jj))
            if not logits:
                continue
            top = max(x for x, _ in logits)
            weights = [(math.exp(x - top), jj) for x, jj in logits]
            total = sum(w for w, _ in weights)
            for w, jj in weights:
                out[t, h] += (w / total) * v[jj, kvh].double()
    return out


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("log_scaling", [None, (2, 0.7)])
def test_reference_matches_naive_loop(window: int | None, log_scaling: tuple[int, float] | None) -> None:
    seed = 11
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, 4, 3, generator=g)
    k = torch.randn(7, 2, 3, generator=g)
    v = torch.randn(7, 2, 3, generator=g)
    r = torch.randn(3, 4, 2, generator=g)
    rel_proj = torch.randn(2, 3, generator=g)
    qpos, kpos = [4, 5, 6], list(range(7))
    got = rel_attention_ref(
        q, k, v, r, rel_proj, torch.tensor(qpos), torch.tensor(kpos),
        scale=0.4, window=window, log_scaling=log_scaling,
    )
    want = _naive(q, k, v, r, rel_proj, qpos, kpos, 0.4, window, log_scaling)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5, msg=lambda m: f"seed {seed}: {m}")


def test_reference_row_without_keys_is_zero() -> None:
    g = torch.Generator().manual_seed(5)
    q, r = torch.randn(2, 2, 4, generator=g), torch.randn(2, 2, 3, generator=g)
    k, v = torch.randn(3, 1, 4, generator=g), torch.randn(3, 1, 4, generator=g)
    # row 0 (position 1) sees nothing: keys are at positions 5..7
    out = rel_attention_ref(q, k, v, r, torch.randn(3, 4, generator=g), torch.tensor([1, 6]),
                            torch.tensor([5, 6, 7]), scale=0.25)
    assert torch.equal(out[0], torch.zeros(2, 4)), "seed 5: a row without keys must be zeros"
    assert not torch.isnan(out).any() and out[1].abs().sum() > 0, "seed 5"


# --- the paged op against the reference ------------------------------------------


def _writer(name: str) -> Callable[..., None]:
    if name == "torch":
        return write_kv
    from inkling_kernels.rel_attention import write_kv_triton  # imports Triton

    return write_kv_triton


def _kv_views(storage: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    if layout == "split0":  # [2, nb, N, Hkv, Dh]
        return storage[0], storage[1]
    if layout == "split1":  # [nb, 2, N, Hkv, Dh]
        return storage[:, 0], storage[:, 1]
    # inkling: [nb, Hkv, N, 2, Dh] (head-major pages, K then V per token)
    return storage[..., 0, :].transpose(1, 2), storage[..., 1, :].transpose(1, 2)


@pytest.mark.parametrize("writer", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 3, 16])
@pytest.mark.parametrize("layout", ["split0", "split1", "inkling"])
def test_write_kv_writes_exactly_the_named_slots(layout: str, n: int, dtype: torch.dtype, writer: str) -> None:
    seed = 300 + n + ("split0", "split1", "inkling").index(layout) * 7 + (50 if dtype != torch.float32 else 0)
    g = torch.Generator().manual_seed(seed)
    nb, hkv, dh, t = 11, 2, 8, 9
    shape = {"split0": (2, nb, n, hkv, dh), "split1": (nb, 2, n, hkv, dh), "inkling": (nb, hkv, n, 2, dh)}[layout]
    storage = torch.randn(*shape, generator=g).to(dtype)
    storage.view(-1)[::11] = float("nan")  # NaN bits must survive untouched too
    chosen = torch.randperm(nb * n, generator=g)[:t]
    slots = chosen.clone()
    slots[torch.tensor([1, 4])] = -1
    key = torch.randn(t, hkv, dh, generator=g).to(dtype)
    value = torch.randn(t, hkv, dh, generator=g).to(dtype)

    expected = storage.clone()
    ek, ev = _kv_views(expected, layout)
    for row, slot in enumerate(slots.tolist()):
        if slot >= 0:
            ek[slot // n, slot % n] = key[row]
            ev[slot // n, slot % n] = value[row]
    dev = torch.device("cuda") if writer == "triton" and torch.cuda.is_available() else torch.device("cpu")
    storage = storage.to(dev)
    kc, vc = _kv_views(storage, layout)
    _writer(writer)(key.to(dev), value.to(dev), kc, vc, slots.to(dev))
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(storage.cpu().view(bits), expected.view(bits)), f"seed {seed}: wrong bytes after {writer}"


@pytest.mark.parametrize("writer", ["torch", "triton"])
def test_write_kv_all_pad_is_a_no_op(writer: str) -> None:
    dev = torch.device("cuda") if writer == "triton" and torch.cuda.is_available() else torch.device("cpu")
    storage = torch.randn(2, 3, 4, 1, 2, generator=torch.Generator().manual_seed(301)).to(dev)
    before = storage.clone()
    ones = torch.ones(2, 1, 2, device=dev)
    _writer(writer)(ones, ones, storage[0], storage[1], torch.tensor([-1, -1], device=dev))
    assert torch.equal(storage, before), "seed 301"


# --- validation -------------------------------------------------------------------


def _small() -> tuple[World, dict[str, Any]]:
    w = build_world(seed=5, mix=[(5, 2), (0, 3)], n=4, group=2, num_pad=1)
    kw: dict[str, Any] = dict(
        q=w.q, r=w.r, rel_proj=w.rel_proj, key_cache=w.key_cache, value_cache=w.value_cache,
        positions=w.positions, block_table=w.block_table, query_start_loc=w.query_start_loc,
        seq_lens=w.seq_lens, scale=w.scale, window=None, log_scaling=None, out=None,
        max_chunk_elements=1 << 24,
    )
    return w, kw


Mut = Callable[[dict[str, Any]], Any]


def _table_entry(k: dict[str, Any], row: int, col: int, value: int) -> torch.Tensor:
    table = k["block_table"].clone()
    table[row, col] = value
    return table


# Metadata values the Triton path reads on the device: both paths check them on the
# host (the small world: request 0 reads block-table columns 0 and 1, request 1 column 0).
METADATA_BAD: list[tuple[str, str, Mut, type[Exception], str]] = [
    ("block_table capacity", "block_table", lambda k: k["block_table"][:, :1], ValueError, "holds only"),
    ("qsl start", "query_start_loc", lambda k: k["query_start_loc"] + 1, ValueError, r"\[0\] must be 0"),
    ("qsl decreasing", "query_start_loc", lambda k: torch.tensor([0, 3, 2]), ValueError, "non-decreasing"),
    ("qsl beyond T", "", lambda k: dict(query_start_loc=torch.tensor([0, 2, 9]), seq_lens=torch.tensor([7, 7])),
     ValueError, "exceeds"),
    ("seq_lens short", "seq_lens", lambda k: torch.tensor([1, 3]), ValueError, "must be >= the query length"),
    ("block_table entry beyond cache", "block_table", lambda k: _table_entry(k, 0, 1, 999), ValueError,
     r"block_table\[0, 1\] = 999 but the caches have \d+ blocks"),
    ("block_table entry negative", "block_table", lambda k: _table_entry(k, 1, 0, -1), ValueError,
     r"block_table\[1, 0\] = -1"),
]
BAD: list[tuple[str, str, Mut, type[Exception], str]] = [
    ("q 2-D", "q", lambda k: k["q"][0], ValueError, "3-D"),
    ("q int", "q", lambda k: k["q"].to(torch.int32), TypeError, "bfloat16, float16 or float32"),
    ("r rows", "r", lambda k: k["r"][:-1], ValueError, r"r must be \[T, Hq, d_rel\]"),
    ("r device", "r", lambda k: k["r"].to("meta"), ValueError, "move it to q's device"),
    ("d_rel", "rel_proj", lambda k: k["rel_proj"][:-1], ValueError, "d_rel"),
    ("rel_proj 1-D", "rel_proj", lambda k: k["rel_proj"][0], ValueError, "2-D"),
    ("cache dtype", "key_cache", lambda k: k["key_cache"].double(), TypeError, "bfloat16"),
    ("cache vs q dtype", "value_cache", lambda k: k["value_cache"].bfloat16(), TypeError, "differs from value_cache"),
    ("cache shapes", "value_cache", lambda k: k["value_cache"][:-1], ValueError, "same shape"),
    ("cache 3-D", "key_cache", lambda k: k["key_cache"][0], ValueError, "4-D"),
    ("head_dim", "q", lambda k: k["q"][..., :-1], ValueError, "head_dim"),
    ("GQA", "", lambda k: dict(q=k["q"][:, :3], r=k["r"][:, :3]), ValueError, "multiple of"),
    ("cache vs q", "", lambda k: dict(q=k["q"].bfloat16(), out=None), TypeError, "differs from q dtype"),
    ("positions length", "positions", lambda k: k["positions"][:-1], ValueError, "one per query row"),
    ("positions float", "positions", lambda k: k["positions"].float(), TypeError, "int64"),
    ("positions contract", "positions", lambda k: k["positions"] + 1, ValueError, "must be 5"),
    ("block_table 1-D", "block_table", lambda k: k["block_table"][0], ValueError, "2-D"),
    ("block_table float", "block_table", lambda k: k["block_table"].float(), TypeError, "int32 or int64"),
    ("block_table rows", "block_table", lambda k: k["block_table"][:1], ValueError, "2 requests"),
    ("qsl device", "query_start_loc", lambda k: k["query_start_loc"].to("meta"), ValueError, "host"),
    ("seq_lens device", "seq_lens", lambda k: k["seq_lens"].to("meta"), ValueError, "host"),
    ("qsl float", "query_start_loc", lambda k: k["query_start_loc"].float(), TypeError, "int32 or int64"),
    ("qsl length", "query_start_loc", lambda k: k["query_start_loc"][:-1], ValueError, "one more"),
    ("window 0", "window", lambda k: 0, ValueError, ">= 1"),
    ("window float", "window", lambda k: 4.0, TypeError, "window must be None"),
    ("n_floor 0", "log_scaling", lambda k: (0, 0.1), ValueError, "n_floor must be >= 1"),
    ("log_scaling list", "log_scaling", lambda k: [4, 0.1], TypeError, "tuple"),
    ("alpha nan", "log_scaling", lambda k: (4, float("nan")), ValueError, "finite"),
    ("scale str", "scale", lambda k: "0.1", TypeError, "scale must be a float"),
    ("scale inf", "scale", lambda k: float("inf"), ValueError, "finite"),
    ("chunk < Hq", "max_chunk_elements", lambda k: 3, ValueError, ">= Hq"),
    ("out shape", "out", lambda k: torch.empty(1, 2, 3), ValueError, "out must have"),
    ("out dtype", "out", lambda k: torch.empty_like(k["q"], dtype=torch.float16), TypeError, "out dtype"),
    *METADATA_BAD,
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_paged_validation(case: tuple[str, str, Mut, type[Exception], str]) -> None:
    _, key, mutate, exc, match = case
    _, kw = _small()
    if key:
        kw[key] = mutate(kw)
    else:  # the mutation changes several arguments consistently
        kw.update(mutate(kw))
    with pytest.raises(exc, match=match):
        paged_rel_attention(
            kw.pop("q"), kw.pop("r"), kw.pop("rel_proj"), kw.pop("key_cache"), kw.pop("value_cache"),
            kw.pop("positions"), kw.pop("block_table"), kw.pop("query_start_loc"), kw.pop("seq_lens"), **kw,
        )


def test_small_validation_base_is_valid() -> None:
    w, kw = _small()
    got = paged_rel_attention(
        kw.pop("q"), kw.pop("r"), kw.pop("rel_proj"), kw.pop("key_cache"), kw.pop("value_cache"),
        kw.pop("positions"), kw.pop("block_table"), kw.pop("query_start_loc"), kw.pop("seq_lens"), **kw,
    )
    _check_close(got, w.reference(), torch.float32, "seed 5 validation base")


def test_unread_block_table_entries_are_not_checked() -> None:
    """Only the entries a request reads must name cache blocks: the table's spare
    column and the rows of requests without queries may hold anything (-1 padding)."""
    w, kw = _small()
    table = kw["block_table"].clone()
    table[:, 2] = -1  # no request reads column 2
    table[1, 1] = 10**6  # request 1 (3 positions) reads column 0 only
    kw["block_table"] = table
    got = paged_rel_attention(
        kw.pop("q"), kw.pop("r"), kw.pop("rel_proj"), kw.pop("key_cache"), kw.pop("value_cache"),
        kw.pop("positions"), kw.pop("block_table"), kw.pop("query_start_loc"), kw.pop("seq_lens"), **kw,
    )
    _check_close(got, w.reference(), torch.float32, "seed 5 padded table")


WRITE_BAD: list[tuple[str, int, Callable[[list[Any]], Any], type[Exception], str]] = [
    ("key 2-D", 0, lambda a: a[0][:, 0], ValueError, "3-D"),
    ("key/value shapes", 1, lambda a: a[1][:-1], ValueError, "same shape"),
    ("row shape", -1, lambda a: {0: a[0][..., :-1], 1: a[1][..., :-1]}, ValueError, r"\[Hkv, Dh\]"),
    ("dtype", 0, lambda a: a[0].bfloat16(), TypeError, "cache dtype"),
    ("slots length", 4, lambda a: a[4][:-1], ValueError, "one per key row"),
    ("slots float", 4, lambda a: a[4].float(), TypeError, "int64"),
    ("slot too big", 4, lambda a: torch.tensor([0, 1, 999]), ValueError, "only 3 blocks"),
    ("caches differ", 3, lambda a: a[3][:-1], ValueError, "same shape"),
]


@pytest.mark.parametrize("case", WRITE_BAD, ids=[c[0] for c in WRITE_BAD])
def test_write_kv_validation(case: tuple[str, int, Callable[[list[Any]], Any], type[Exception], str]) -> None:
    _, idx, mutate, exc, match = case
    storage = torch.zeros(2, 3, 4, 2, 5)
    args: list[Any] = [torch.ones(3, 2, 5), torch.ones(3, 2, 5), storage[0], storage[1], torch.tensor([0, -1, 7])]
    if idx >= 0:
        args[idx] = mutate(args)
    else:  # several arguments at once
        for i, value in mutate(args).items():
            args[i] = value
    with pytest.raises(exc, match=match):
        write_kv(*args)
    assert torch.equal(storage, torch.zeros_like(storage)), "a rejected call must not write"


def test_reference_validation() -> None:
    q, k = torch.zeros(2, 4, 8), torch.zeros(3, 2, 8)
    r, proj, qp, kp = torch.zeros(2, 4, 3), torch.zeros(3, 5), torch.arange(2), torch.arange(3)
    with pytest.raises(ValueError, match="multiple of"):
        rel_attention_ref(q, k[:, :1].expand(3, 3, 8), k[:, :1].expand(3, 3, 8), r, proj, qp, kp, scale=1.0)
    with pytest.raises(ValueError, match="rel_proj"):
        rel_attention_ref(q, k, k, r, proj[:2], qp, kp, scale=1.0)
    with pytest.raises(ValueError, match=">= 1"):
        rel_attention_ref(q, k, k, r, proj, qp, kp, scale=1.0, window=0)
    with pytest.raises(ValueError, match="n_floor"):
        rel_attention_ref(q, k, k, r, proj, qp, kp, scale=1.0, log_scaling=(0, 0.1))
    for i, name in ((4, "rel_proj"), (5, "q_positions"), (6, "k_positions")):
        args: list[Any] = [q, k, k, r, proj, qp, kp]
        args[i] = args[i].tolist()
        with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor, got list"):
            rel_attention_ref(*args, scale=1.0)
