"""fused_sconv_add_rmsnorm: the Triton kernel (TRITON_INTERPRET=1 on CPU), its fp32
reference and the unfused sequence (fused_sconv_ref + add + RMSNorm) agree on
random scheduling traces; the cache is written exactly where it must be."""

from __future__ import annotations

# conftest.py sets TRITON_INTERPRET=1 (before any kernel module loads) where there is
# no GPU; with one, the kernel runs compiled on CUDA copies of the inputs.
import random
from dataclasses import dataclass

import pytest
import torch

from inkling_kernels import SconvBatch, fused_sconv_ref, sconv_tap_map_ref
from inkling_kernels.sconv_add_rmsnorm import (
    fused_sconv_add_rmsnorm,
    fused_sconv_add_rmsnorm_ref,
    rms_norm_ref,
)
from inkling_kernels.sconv_add_rmsnorm.kernel import NormConfig, fused_sconv_add_rmsnorm_triton

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
EPS = 1e-6

# The Triton interpreter rounds float32 -> bfloat16 towards zero (the GPU rounds to
# nearest), so bf16 results may sit a couple of ulps away from the reference.
TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=4e-3, atol=4e-3),
    torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
}


@dataclass
class Trace:
    hidden: torch.Tensor
    d: torch.Tensor
    weight: torch.Tensor
    cache: torch.Tensor
    positions: torch.Tensor
    block_table: torch.Tensor
    seq_idx: torch.Tensor
    slot_mapping: torch.Tensor
    query_start: torch.Tensor
    stream_offset: int
    stream_width: int
    block_size: int
    norm_weight: torch.Tensor

    def batch(self, tap_map: torch.Tensor | None = None) -> SconvBatch:
        return SconvBatch(
            self.positions, self.block_table, self.seq_idx, self.slot_mapping, self.query_start,
            self.block_size, kernel_size=self.weight.shape[-1], tap_map=tap_map,
        )

    def args(self, cache: torch.Tensor, tap_map: torch.Tensor | None = None) -> tuple:
        """The public function's arguments."""
        return (
            self.hidden, self.d, self.weight, cache, self.batch(tap_map), self.stream_offset,
            self.stream_width, self.norm_weight, EPS,
        )

    def op_args(self, cache: torch.Tensor, tap_map: torch.Tensor | None = None) -> tuple:
        """The custom op's arguments (the batch unpacked)."""
        return (
            self.hidden, self.d, self.weight, cache, *self.batch(tap_map).op_args(),
            self.stream_offset, self.stream_width, self.norm_weight, EPS,
            torch.empty_like(self.d), torch.empty_like(self.d),
        )


def make_trace(
    rng: random.Random,
    dtype: torch.dtype,
    requests: list[tuple[int, int]],
    *,
    block_size: int = 4,
    kernel_size: int = 4,
    heads: int = 2,
    width: int = 24,
    head_size: int = 80,
    stream_offset: int = 40,
    pad_rows: int = 0,
    page_stride: bool = False,
    null_old_blocks: bool = True,
) -> Trace:
    """A batch of requests given as (history length, new tokens), in batch order.

    Each request gets its own random physical blocks; the cache holds random values
    (the history's conv inputs); entries that fell out of the window point at the
    null block 0. ``page_stride`` makes the cache a view into larger pages."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    n = block_size
    need = [-(-(h + k) // n) for h, k in requests]
    max_blocks = max(need)
    num_blocks = 1 + sum(need) + 3
    physical = list(range(1, num_blocks))
    rng.shuffle(physical)
    table = torch.zeros(len(requests), max_blocks + 1, dtype=torch.int32)
    pos, seq, slots, qs = [], [], [], []
    for r, (hist, new) in enumerate(requests):
        for b in range(need[r]):
            table[r, b] = physical.pop()
        first_read = hist - (kernel_size - 1)
        if null_old_blocks:
            for b in range(need[r]):
                if (b + 1) * n <= first_read:
                    table[r, b] = 0  # slid out of the window
        start = len(pos)
        for p in range(hist, hist + new):
            pos.append(p)
            seq.append(r)
            qs.append(start)
            slots.append(int(table[r, p // n]) * n + p % n)
    for _ in range(pad_rows):
        pos.append(0)
        seq.append(0)
        qs.append(0)
        slots.append(-1)
    channels = heads * width
    shape = (num_blocks, heads, n, head_size)
    if page_stride:
        storage = torch.randn(num_blocks, heads * n * head_size + 24, generator=gen).to(dtype)
        cache = storage[:, : heads * n * head_size].view(shape)
    else:
        cache = torch.randn(shape, generator=gen).to(dtype)
    num_tokens = len(pos)
    return Trace(
        hidden=(2 * torch.randn(num_tokens, channels, generator=gen)).to(dtype),
        d=torch.randn(num_tokens, channels, generator=gen).to(dtype),
        weight=(0.5 * torch.randn(channels, 1, kernel_size, generator=gen)),
        cache=cache,
        positions=torch.tensor(pos, dtype=torch.int64),
        block_table=table,
        seq_idx=torch.tensor(seq, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start=torch.tensor(qs, dtype=torch.int32),
        stream_offset=stream_offset,
        stream_width=width,
        block_size=n,
        norm_weight=(1 + 0.3 * torch.randn(channels, generator=gen)).to(dtype),
    )


def random_requests(rng: random.Random) -> list[tuple[int, int]]:
    """A mixed batch: prefill from 0, decodes with long histories, chunked prefill,
    speculative verification (k tokens), in random order."""
    reqs = [
        (0, rng.randint(1, 9)),  # prefill
        (rng.randint(3, 40), 1),  # decode
        (rng.randint(3, 40), 1),
        (rng.randint(1, 30), rng.randint(2, 8)),  # chunked prefill
        (rng.randint(1, 30), 3),  # speculative verify
        (rng.randint(0, 2), 1),  # decode at the very start
    ]
    rng.shuffle(reqs)
    return reqs


def clone_cache(cache: torch.Tensor) -> torch.Tensor:
    """A copy keeping the (possibly page-strided) strides."""
    out = torch.empty_strided(cache.shape, cache.stride(), dtype=cache.dtype)
    out.copy_(cache)
    return out


def run_reference(tr: Trace, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return fused_sconv_add_rmsnorm_ref(*tr.args(cache))


def run_unfused(tr: Trace, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = fused_sconv_ref(tr.d, tr.weight, cache, tr.batch(), tr.stream_offset, tr.stream_width)
    new_hidden = tr.hidden + s  # dtype arithmetic, as the decoder layer does it
    return new_hidden, rms_norm_ref(new_hidden, tr.norm_weight, EPS)


KERNEL_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def trace_tap_map(tr: Trace) -> torch.Tensor:
    """The step's tap map of the trace's metadata (the reference builder)."""
    kernel_size = tr.weight.shape[-1]
    out = torch.empty(tr.positions.shape[0], kernel_size - 1, dtype=torch.int64)
    sconv_tap_map_ref(tr.batch(), out)
    return out


def run_kernel(tr: Trace, cache: torch.Tensor, config: NormConfig | None, mapped: bool = False):
    """The Triton kernel on KERNEL_DEVICE, NaN-poisoned outputs; ``cache`` is updated.
    ``mapped``: with the step's tap map instead of the in-kernel tap resolution."""
    dev = KERNEL_DEVICE
    tap_map = trace_tap_map(tr) if mapped else None
    args = list(tr.args(cache, tap_map))
    if dev.type != "cpu":
        args = [a.to(dev) if isinstance(a, torch.Tensor) else a for a in args]
        b = args[4]
        args[4] = SconvBatch(
            b.positions.to(dev), b.block_table.to(dev), b.seq_idx.to(dev), b.slot_mapping.to(dev),
            b.query_start.to(dev), b.block_size, b.kernel_size,
            None if b.tap_map is None else b.tap_map.to(dev),
        )
        args[3] = torch.empty_strided(cache.shape, cache.stride(), dtype=cache.dtype, device=dev)
        args[3].copy_(cache)
    poison = (torch.full_like(args[1], float("nan")), torch.full_like(args[1], float("nan")))
    out = fused_sconv_add_rmsnorm_triton(*args, config=config, outputs=poison)
    if dev.type != "cpu":
        cache.copy_(args[3])
    return tuple(o.cpu() for o in out)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(actual).any(), "an output element was not written"
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype])


def assert_cache_writes(tr: Trace, before: torch.Tensor, after: torch.Tensor) -> None:
    """Valid slots hold their row of d in the stream range; every other element is
    bit-identical to before (pad rows write nothing)."""
    expected = clone_cache(before)
    n, lo, hi = tr.block_size, tr.stream_offset, tr.stream_offset + tr.stream_width
    heads = tr.cache.shape[1]
    for t, slot in enumerate(tr.slot_mapping.tolist()):
        if slot >= 0:
            expected[slot // n, :, slot % n, lo:hi] = tr.d[t].view(heads, tr.stream_width)
    assert torch.equal(after.view(torch.uint8) if after.dtype != torch.float32 else after.view(torch.int32),
                       expected.view(torch.uint8) if expected.dtype != torch.float32 else expected.view(torch.int32))


CONFIGS = (
    None,  # the heuristic
    NormConfig(block_t=4, block_h=1, block_j=16, num_warps=2, scan=4),  # 2 j-chunks a head, tiny scan
    NormConfig(block_t=2, block_h=2, block_j=32, num_warps=1, scan=8),  # the whole row, masked j
    NormConfig(block_t=1, block_h=4, block_j=8, num_warps=1, scan=256),  # masked heads
    NormConfig(block_t=2, block_h=1, block_j=16, num_warps=2, scan=4, row_loop=True),  # the row loop, 2 j-tiles
    NormConfig(block_t=1, block_h=1, block_j=16, num_warps=2, rows=True),  # row-register kernel, 3 chunks a row
    NormConfig(block_t=8, block_h=1, block_j=8, num_warps=1, rows=True),  # 6 chunks, 8 rows
)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seed", range(3))
def test_kernel_matches_reference_and_unfused_sequence(dtype: torch.dtype, seed: int) -> None:
    rng = random.Random(1000 * seed + DTYPES.index(dtype))
    tr = make_trace(
        rng, dtype, random_requests(rng), block_size=rng.choice([1, 4, 8]),
        pad_rows=rng.randint(0, 3), page_stride=seed == 1,
    )
    ref_cache = clone_cache(tr.cache)
    ref = run_reference(tr, ref_cache)
    unf_cache = clone_cache(tr.cache)
    unf = run_unfused(tr, unf_cache)
    assert torch.equal(ref_cache, unf_cache)
    for got, want in zip(ref, unf):
        torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    for cfg in CONFIGS:
        check_kernel_both_ways(tr, cfg, dtype, ref)


def check_kernel_both_ways(tr: Trace, config: NormConfig | None, dtype: torch.dtype,
                           ref: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """The kernel on ``tr``, map-less and mapped: both outputs against the reference
    (``ref``, else computed here) within the dtype's tolerance, the cache writes exact."""
    if ref is None:
        ref = run_reference(tr, clone_cache(tr.cache))
    for mapped in (False, True):
        cache = clone_cache(tr.cache)
        out = run_kernel(tr, cache, config, mapped)
        for got, want in zip(out, ref):
            assert_close(got, want, dtype)
        assert_cache_writes(tr, tr.cache, cache)


@pytest.mark.parametrize("kernel_size", [2, 3, 5])
def test_other_kernel_sizes(kernel_size: int) -> None:
    rng = random.Random(7 + kernel_size)
    tr = make_trace(rng, torch.float32, random_requests(rng), kernel_size=kernel_size)
    ref = run_reference(tr, clone_cache(tr.cache))
    for mapped in (False, True):
        cache = clone_cache(tr.cache)
        out = run_kernel(tr, cache, NormConfig(block_t=2, block_h=1, block_j=32, num_warps=1, scan=8), mapped)
        for got, want in zip(out, ref):
            assert_close(got, want, torch.float32)
        assert_cache_writes(tr, tr.cache, cache)


@pytest.mark.parametrize("hit_first", [True, False])
def test_same_step_prefix_hit(hit_first: bool) -> None:
    """Request A computes a prompt; B, the same prompt with a prefix hit on A's
    blocks, reads as pre-forward taps slots A writes in this very launch. Those
    slots hold NaN before the call: any stale read poisons B's rows."""
    dtype = torch.bfloat16
    rng = random.Random(11)
    n, prompt, hit = 4, 14, 8
    tr = make_trace(rng, dtype, [(0, prompt), (hit, prompt - hit)], block_size=n,
                    null_old_blocks=False)
    # B shares A's blocks for the hit prefix; both compute the same prompt.
    tr.block_table[1, : hit // n] = tr.block_table[0, : hit // n]
    a_rows, b_rows = slice(0, prompt), slice(prompt, 2 * prompt - hit)
    tr.d[b_rows] = tr.d[hit:prompt]
    tr.hidden[b_rows] = tr.hidden[hit:prompt]
    for p in range(hit - 3, hit):
        blk = int(tr.block_table[0, p // n])
        tr.cache[blk, :, p % n, :] = float("nan")
    if hit_first:  # put B's rows first in the batch
        order = torch.cat([torch.arange(prompt, 2 * prompt - hit), torch.arange(prompt)])
        for name in ("hidden", "d", "positions", "slot_mapping"):
            setattr(tr, name, getattr(tr, name)[order].contiguous())
        tr.seq_idx = tr.seq_idx[order].contiguous()
        b_len = prompt - hit
        tr.query_start = torch.tensor([0] * b_len + [b_len] * prompt, dtype=torch.int32)
        b_rows = slice(0, b_len)
        a_rows = slice(b_len, b_len + prompt)
    ref = run_reference(tr, clone_cache(tr.cache))
    for cfg, mapped in [(None, False), (NormConfig(block_t=2, block_h=2, block_j=16, num_warps=1, scan=4), False),
                        (None, True), (NormConfig(block_t=2, block_h=2, block_j=16, num_warps=1, scan=4), True),
                        (NormConfig(block_t=1, block_h=1, block_j=8, num_warps=1, scan=4, split=6), False),
                        (NormConfig(block_t=1, block_h=1, block_j=8, num_warps=1, scan=4, split=6), True)]:
        cache = clone_cache(tr.cache)
        out = run_kernel(tr, cache, cfg, mapped)
        for got, want in zip(out, ref):
            assert_close(got, want, dtype)
        # B's rows equal A's rows at the same positions: the prompt is the same.
        for o in out:
            assert torch.equal(o[b_rows], o[a_rows][hit:])
    assert not torch.isnan(ref[1]).any()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_public_op_on_cpu_is_the_reference(dtype: torch.dtype) -> None:
    rng = random.Random(5)
    tr = make_trace(rng, dtype, random_requests(rng), pad_rows=2)
    ref_cache = clone_cache(tr.cache)
    ref = run_reference(tr, ref_cache)
    cache = clone_cache(tr.cache)
    out = fused_sconv_add_rmsnorm(*tr.args(cache))
    for got, want in zip(out, ref):
        assert torch.equal(got, want)
    assert torch.equal(cache, ref_cache)
    # Rounded where transformers rounds: new_hidden is hidden + dt(d + conv(d)).
    s = fused_sconv_ref(tr.d, tr.weight, clone_cache(tr.cache), tr.batch(), tr.stream_offset, tr.stream_width)
    torch.testing.assert_close(out[0].float(), (tr.hidden + s).float(), **TOL[dtype])


def test_empty_batch() -> None:
    rng = random.Random(3)
    tr = make_trace(rng, torch.float32, [(4, 1)])
    for name in ("hidden", "d"):
        setattr(tr, name, getattr(tr, name)[:0])
    for name in ("positions", "seq_idx", "slot_mapping", "query_start"):
        setattr(tr, name, getattr(tr, name)[:0])
    cache = clone_cache(tr.cache)
    for out in (run_kernel(tr, cache, None), fused_sconv_add_rmsnorm(*tr.args(cache))):
        assert out[0].shape == (0, tr.d.shape[1]) and out[1].shape == (0, tr.d.shape[1])
    assert torch.equal(cache, tr.cache)


def test_custom_op_registration_and_fake_impl() -> None:
    rng = random.Random(9)
    tr = make_trace(rng, torch.float32, [(5, 2), (0, 3)])
    torch.library.opcheck(
        torch.ops.inkling.fused_sconv_add_rmsnorm.default,
        tr.op_args(clone_cache(tr.cache)),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_compiles_with_the_op() -> None:
    rng = random.Random(4)
    tr = make_trace(rng, torch.float32, [(6, 1), (0, 4)])

    def step(hidden: torch.Tensor, d: torch.Tensor, cache: torch.Tensor):
        args = list(tr.args(cache))
        args[0], args[1] = hidden, d
        new_h, normed = fused_sconv_add_rmsnorm(*args)
        return new_h * 2, normed + 1

    eager_cache, compiled_cache = clone_cache(tr.cache), clone_cache(tr.cache)
    want = step(tr.hidden, tr.d, eager_cache)
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(tr.hidden, tr.d, compiled_cache)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(compiled_cache, eager_cache)


def _bad(tr: Trace, **changes: object) -> tuple:
    """The public arguments with ``changes``; a batch field changes the batch (built
    here: a bad field raises when the batch is built, before any launch)."""
    batch_fields = ("block_size",)
    for name in batch_fields:
        if name in changes:
            setattr(tr, name, changes.pop(name))
    names = ["hidden", "d", "weight", "cache", "batch", "stream_offset", "stream_width",
             "norm_weight", "eps"]
    args = dict(zip(names, tr.args(tr.cache)))
    args.update(changes)
    return tuple(args[k] for k in names)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda tr: {"hidden": tr.hidden[:, :-1].contiguous()}, ValueError, "hidden has shape"),
        (lambda tr: {"hidden": tr.hidden.double()}, TypeError, "hidden dtype"),
        (lambda tr: {"hidden": tr.hidden.t().contiguous().t()}, ValueError, "contiguous"),
        (lambda tr: {"hidden": tr.hidden.tolist()}, TypeError, "hidden must be a torch.Tensor"),
        (lambda tr: {"norm_weight": tr.norm_weight[:-1]}, ValueError, "norm_weight must have shape"),
        (lambda tr: {"norm_weight": tr.norm_weight.long()}, TypeError, "float tensor"),
        (lambda tr: {"norm_weight": tr.norm_weight[None]}, ValueError, "norm_weight must have shape"),
        (lambda tr: {"eps": -1.0}, ValueError, "eps must be a finite"),
        (lambda tr: {"eps": float("nan")}, ValueError, "eps must be a finite"),
        (lambda tr: {"eps": "1e-6"}, TypeError, "eps must be a float"),
        (lambda tr: {"block_size": tr.block_size * 2}, ValueError, "block_size"),
        (lambda tr: {"batch": tr.positions}, TypeError, "SconvBatch"),
        (lambda tr: {"weight": tr.weight[..., :3]}, ValueError, "kernel_size"),
        (lambda tr: {"d": tr.d[:, :-1].contiguous()}, ValueError, "channels"),
        (lambda tr: {"stream_offset": 70}, ValueError, "outside"),
    ],
)
def test_validation_errors(change, error, match) -> None:
    rng = random.Random(2)
    tr = make_trace(rng, torch.float32, [(3, 2)])
    args = _bad(tr, **change(tr))
    with pytest.raises(error, match=match):
        fused_sconv_add_rmsnorm(*args)
    with pytest.raises(error, match=match):
        fused_sconv_add_rmsnorm_triton(*args)


@pytest.mark.parametrize(
    "config",
    [
        NormConfig(block_t=2, block_h=2, block_j=8, num_warps=1, scan=8),  # a half head group, masked j
        NormConfig(block_t=1, block_h=1, block_j=32, num_warps=1, scan=4),  # one head a tile
        NormConfig(block_t=2, block_h=2, block_j=8, num_warps=1, scan=8, row_loop=True),  # the row loop, masked
    ],
)
def test_odd_head_count_and_width(config: NormConfig) -> None:
    """3 heads of a 20-channel stream at offset 12 of D = 56: head groups and j chunks
    that do not divide the row, cache rows that are not 16-element aligned."""
    rng = random.Random(21)
    tr = make_trace(rng, torch.float16, random_requests(rng), heads=3, width=20, head_size=56,
                    stream_offset=12, pad_rows=2)
    ref = run_reference(tr, clone_cache(tr.cache))
    cache = clone_cache(tr.cache)
    out = run_kernel(tr, cache, config)
    for got, want in zip(out, ref):
        assert_close(got, want, torch.float16)
    assert_cache_writes(tr, tr.cache, cache)


def test_tap_map_argument() -> None:
    """The public op takes a batch carrying the step's tap map (checked when the batch
    is built; the CPU reference ignores it) and the op passes opcheck with it."""
    rng = random.Random(21)
    tr = make_trace(rng, torch.float32, random_requests(rng), pad_rows=1)
    tap_map = trace_tap_map(tr)
    ref = run_reference(tr, clone_cache(tr.cache))
    out = fused_sconv_add_rmsnorm(*tr.args(clone_cache(tr.cache), tap_map))
    for got, want in zip(out, ref):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="tap_map"):
        tr.args(clone_cache(tr.cache), tap_map[:, :2].contiguous())
    with pytest.raises(ValueError, match="tap_map"):
        tr.args(clone_cache(tr.cache), tap_map[:-1])
    torch.library.opcheck(torch.ops.inkling.fused_sconv_add_rmsnorm.default,
                          tr.op_args(clone_cache(tr.cache), tap_map))


# (each config in one dtype, both dtypes over the three: CI time under the interpreter)
@pytest.mark.parametrize(
    "config,dtype",
    [
        # 2 chunks each, last masked
        (NormConfig(block_t=1, block_h=1, block_j=8, num_warps=2, scan=4, split=4), torch.float32),
        # masked j, uneven heads
        (NormConfig(block_t=1, block_h=2, block_j=16, num_warps=1, scan=8, split=3), torch.bfloat16),
        # one head a chunk
        (NormConfig(block_t=1, block_h=1, block_j=32, num_warps=1, scan=8, split=3), torch.float32),
    ],
    ids=["split4-float32", "masked-bfloat16", "head-float32"],
)
def test_split_rows_over_programs(config: NormConfig, dtype: torch.dtype) -> None:
    """Each row's chunks over several programs (partial sums of squares, the last
    program's ticket normalises): 3 heads x 20 channels, random mixed batches with
    pad rows, with and without the tap map, twice on the same scratch (the counters
    reset themselves: a stale counter would leave normed rows NaN)."""
    from inkling_kernels.sconv_add_rmsnorm import kernel as kmod

    rng = random.Random(77 + config.split)
    for launch in range(2):
        tr = make_trace(rng, dtype, random_requests(rng), heads=3, width=20, head_size=56,
                        stream_offset=12, pad_rows=launch + 1)
        check_kernel_both_ways(tr, config, dtype)
    for cnt, _, _ in kmod._SCRATCH.values():
        assert int(cnt.abs().sum()) == 0


def test_split_config_checks() -> None:
    rng = random.Random(3)
    tr = make_trace(rng, torch.float32, [(5, 2)])
    for bad in (NormConfig(2, 1, 8, 1, split=2), NormConfig(1, 2, 32, 1, split=2), NormConfig(1, 1, 8, 1, split=0),
                NormConfig(1, 1, 8, 1, split=2, row_loop=True)):
        with pytest.raises(ValueError, match="split"):
            run_kernel(tr, clone_cache(tr.cache), bad)


def test_interpreter_config_takes_many_rows_a_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter the default tiles hold INTERPRETER_ROWS rows above 16 rows
    (the GPU's one row a program would make the interpreted e2e engines much slower), and the
    GPU's split rows up to 16; the launcher picks them only under the interpreter."""
    from inkling_kernels._triton_common import INTERPRETER_ROWS, is_interpreter
    from inkling_kernels.sconv_add_rmsnorm.kernel import choose_norm_config, interpreter_norm_config

    for t in (17, 333, 8192):
        cfg = interpreter_norm_config(t, 2, 64)
        assert cfg.block_t == INTERPRETER_ROWS > 1 and cfg.split == 1 and not cfg.row_loop
    for t in (1, 16):
        assert interpreter_norm_config(t, 8, 768) == choose_norm_config(t, 8, 768)
    if is_interpreter():  # a launch of 40 rows runs cdiv(40, INTERPRETER_ROWS) programs
        from _sconv_world import count_launches
        from inkling_kernels.sconv_add_rmsnorm import kernel as kmod
        from inkling_kernels.sconv_add_rmsnorm import rows_kernel as rmod

        grids = count_launches(monkeypatch, kmod, "_sconv_add_rmsnorm_kernel")
        row_grids = count_launches(monkeypatch, rmod, "_rows_add_norm_kernel")
        check_kernel_both_ways(make_trace(random.Random(5), torch.float32, [(0, 40)]), None, torch.float32)
        # map-less: the tile kernel; mapped (one prompt): the row-register kernel
        assert grids == [(-(-40 // INTERPRETER_ROWS), 1)]
        assert row_grids == [(1, -(-40 // INTERPRETER_ROWS))]


def test_default_config_splits_small_batches() -> None:
    from inkling_kernels.sconv_add_rmsnorm.kernel import choose_norm_config

    assert choose_norm_config(1, 8, 768).split > 1
    assert choose_norm_config(8192, 8, 768).split == 1


@pytest.mark.parametrize("heads,width", [(8, 512), (8, 768), (3, 20)])
def test_default_config_per_size_class(heads: int, width: int) -> None:
    """Default per size: split rows up to T = 16, the row loop (one row a program, its
    tiles in a loop, re-read) for 16 < T < 8192, the whole row in registers from 8192."""
    from inkling_kernels.sconv_add_rmsnorm.kernel import choose_norm_config, row_loop_config

    block_j = min(1 << (width - 1).bit_length(), 1024)  # row_loop_config, written out
    block_h = max(1, min(1 << (heads - 1).bit_length(), 4096 // block_j))
    elems = block_h * block_j
    loop_cfg = NormConfig(block_t=1, block_h=block_h, block_j=block_j,
                          num_warps=4 if elems >= 2048 else 2 if elems >= 512 else 1, row_loop=True)
    assert row_loop_config(heads, width) == loop_cfg
    for t in (17, 64, 256, 1024, 2048, 2303, 8191):
        assert choose_norm_config(t, heads, width) == loop_cfg
    for t in (1, 16):
        cfg = choose_norm_config(t, heads, width)
        assert not cfg.row_loop and cfg.num_warps == 2 and (cfg.split > 1 or heads * width <= 256)
    for t in (8192, 16384):
        cfg = choose_norm_config(t, heads, width)
        assert not cfg.row_loop and cfg.split == 1 and cfg.num_warps == 4


def tile_paths(tap_map: torch.Tensor, rows: int) -> tuple[int, int]:
    """How many ``rows``-row tiles of a launch take the row-register kernel's register
    path (every tap the x row ``t - dist`` or absent) and how many its load path,
    decoded from the step's tap map as the kernel decodes it (codes <= -2: x row
    ``-code - 2``; -1: none; else a cache slot, or a same-step writer in bits 32..)."""
    t = torch.arange(tap_map.shape[0])[:, None]
    dist = torch.arange(1, tap_map.shape[1] + 1)[None, :]
    own = (tap_map <= -2) & (-tap_map - 2 == t - dist)
    fine = (own | (tap_map == -1)).all(dim=1)
    register = sum(bool(fine[i:i + rows].all()) for i in range(0, tap_map.shape[0], rows))
    return register, -(-tap_map.shape[0] // rows) - register


@pytest.mark.parametrize("block_t", [1, 2, 8])
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_row_kernel_register_and_load_paths(block_t: int, dtype: torch.dtype) -> None:
    """The row-register kernel (``NormConfig.rows``) on batches whose tiles take both of
    its paths: prompt rows whose taps are the rows before them (register vectors), and
    decodes, a chunk's first rows and pad rows (the load path, taps from the cache);
    both outputs against the reference and the cache writes exact, with the batch's
    own map and with the map the launch builds."""
    rng = random.Random(90 + block_t + 7 * DTYPES.index(dtype))
    cfg = NormConfig(block_t=block_t, block_h=1, block_j=16, num_warps=2, rows=True)
    for launch in range(2):
        reqs = [(0, 37), (rng.randint(4, 30), 1), (rng.randint(5, 20), 29), (0, 3), (rng.randint(3, 9), 1)]
        rng.shuffle(reqs)
        tr = make_trace(rng, dtype, reqs, block_size=rng.choice([1, 4]), pad_rows=launch)
        register, load = tile_paths(trace_tap_map(tr), block_t)
        assert register > 0 and load > 0, (register, load)
        check_kernel_both_ways(tr, cfg, dtype)


def test_row_kernel_same_step_prefix_hit() -> None:
    """A same-step prefix hit on the row-register kernel: B reads taps from blocks that
    A writes in this launch (the map names A's rows), in both batch orders."""
    for hit_first in (False, True):
        rng = random.Random(77 + hit_first)
        tr = make_trace(rng, torch.float32, [(0, 24), (0, 24)], block_size=4)
        # B (request 1) shares A's first 3 blocks and starts at position 12: its taps
        # 9..11 are A's rows of this very launch (written by A now, read by B now).
        share, start = 3, 12
        tr.block_table[1, :share] = tr.block_table[0, :share]
        n = tr.block_size
        pos = list(range(24)) + list(range(start, 24))
        seq = [0] * 24 + [1] * (24 - start)
        if hit_first:
            pos = pos[24:] + pos[:24]
            seq = seq[24:] + seq[:24]
        qs, slots, first = [], [], {}
        for i, (p_, r) in enumerate(zip(pos, seq)):
            first.setdefault(r, i)
            qs.append(first[r])
            slots.append(int(tr.block_table[r, p_ // n]) * n + p_ % n)
        t = len(pos)
        tr.positions = torch.tensor(pos, dtype=torch.int64)
        tr.seq_idx = torch.tensor(seq, dtype=torch.int32)
        tr.query_start = torch.tensor(qs, dtype=torch.int32)
        tr.slot_mapping = torch.tensor(slots, dtype=torch.int64)
        tr.d, tr.hidden = tr.d[:t], tr.hidden[:t]
        assert (trace_tap_map(tr) >= 1 << 32).any()  # taps from a same-step writer's row
        ref = run_reference(tr, clone_cache(tr.cache))
        for block_t in (1, 4):
            cache = clone_cache(tr.cache)
            out = run_kernel(tr, cache, NormConfig(block_t=block_t, block_h=1, block_j=16, num_warps=2, rows=True))
            for got, want in zip(out, ref):
                assert_close(got, want, torch.float32)


@pytest.mark.parametrize(
    "config,match",
    [
        (NormConfig(block_t=2, block_h=1, block_j=32, num_warps=2, rows=True), "not a multiple"),  # C = 48
        (NormConfig(block_t=2, block_h=2, block_j=16, num_warps=2, rows=True), "block_h 1"),
        (NormConfig(block_t=32, block_h=1, block_j=16, num_warps=2, rows=True), "64-bit tap mask"),
        (NormConfig(block_t=3, block_h=1, block_j=16, num_warps=2, rows=True), "powers of two"),
    ],
)
def test_row_kernel_config_errors(config: NormConfig, match: str) -> None:
    """A rows config that cannot take the launch says why, before any launch."""
    rng = random.Random(3)
    tr = make_trace(rng, torch.float32, [(0, 9), (4, 1)])
    with pytest.raises(ValueError, match=match):
        run_kernel(tr, clone_cache(tr.cache), config, mapped=True)


def test_default_config_takes_the_row_kernel_for_prompts() -> None:
    """The heuristic's row-register tiles: mapped launches of >= 1024 rows and >= 8 rows
    a request, or (with the batch's ``num_prefill_tokens`` hint) at least half their rows
    in prompts; prompts only (>= 32 rows a request): 2 rows x 512 channels, 4 warps;
    mixed: 1 row x 256, 2 warps; decode-heavy, map-less or unknown request counts: the
    tile kernel. Without the norm
    (``fused_sconv_add``): 4 rows x 256 on prompts only, else 2 rows x 256."""
    from inkling_kernels.sconv_add_rmsnorm.kernel import choose_add_config, choose_norm_config

    # (T, requests, prompt rows or None)
    rows = [(8192, 1, None), (8192, 256, None), (2303, 256, None), (2048, 4, None), (1024, 1, None),
            (1024, 128, None), (1024, 128, 0), (1279, 256, 1024), (1279, 256, 640), (8192, 8192, 8192)]
    tiles = [(8192, 8192, None), (256, 256, None), (256, 64, 0), (2303, 256 + 64, None), (1000, 1, 1000),
             (4096, 1024, None), (1279, 256, None), (1279, 256, 639), (1024, 256, 0)]
    for t, r, p in rows:
        cfg = choose_norm_config(t, 8, 768, True, r, p)
        assert cfg.rows and cfg.block_h == 1 and cfg.split == 1, (t, r, p)
        assert (cfg.block_t, cfg.block_j, cfg.num_warps) == ((2, 512, 4) if t >= 32 * r else (1, 256, 2))
        add = choose_add_config(t, 1, 768, True, 4, r, p)
        assert add.rows and (add.block_t, add.block_j, add.num_warps) == (4 if t >= 32 * r else 2, 256, 2)
    for t, r, p in tiles:
        assert not choose_norm_config(t, 8, 768, True, r, p).rows, (t, r, p)
        assert not choose_add_config(t, 1, 768, True, 4, r, p).rows
    assert not choose_norm_config(8192, 8, 768, False, 1).rows  # no map
    assert not choose_norm_config(8192, 8, 768, True, None).rows  # request count unknown
    assert not choose_norm_config(8192, 3, 20, True, 1).rows  # 60 channels: no 256-channel chunks
