"""Test helpers: a small paged world that schedules requests into fused_sconv calls.

The world keeps, per request and stream, the true sequence of conv inputs; every call
is checked against the full-sequence causal conv of that sequence (an oracle that
knows nothing of pages), against the reference op on a copy of the cache, and for
bit-identity of every cache element it must not touch.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field

import pytest
import torch

from inkling_kernels import SconvBatch, causal_conv_ref, fused_sconv, fused_sconv_ref, sconv_tap_map_ref

TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: The world's tensors live on the CPU: the Triton kernels take them only under the
#: interpreter (conftest.py turns it on where there is no GPU). On a CUDA machine the
#: compiled kernels are tested by test_gpu.py; there these cases are skipped, saying so.
needs_interpreter = pytest.mark.skipif(
    torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="CPU tensors through Triton need TRITON_INTERPRET=1 (compiled kernels: test_gpu.py)",
)
#: ``impl`` values of the world's runs: the reference op, then the Triton kernel
#: without and with the step's tap map.
IMPLS = ("reference", pytest.param("triton", marks=needs_interpreter), pytest.param("triton_map", marks=needs_interpreter))


def count_launches(monkeypatch: pytest.MonkeyPatch, module: object, kernel: str,
                   keyword: str | None = None) -> list[tuple]:
    """Record the grid of every launch of ``module.kernel`` (a ``@triton.jit`` function,
    launched as ``kernel[grid](...)``) while the test runs, or with ``keyword`` the pair
    (grid, the launch's argument of that name); the launches still run."""
    grids: list[tuple] = []
    real = getattr(module, kernel)

    class Counting:
        def __getitem__(self, grid: tuple) -> object:
            if keyword is None:
                grids.append(grid)
                return real[grid]

            def launch(*args: object, **kwargs: object) -> object:
                grids.append((grid, kwargs.get(keyword)))
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(module, kernel, Counting())
    return grids


def bits(t: torch.Tensor) -> torch.Tensor:
    """Same-size integer view: compares NaNs and signed zeros exactly."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@dataclass
class Request:
    values: dict[int, torch.Tensor]  # stream index -> [L_committed, C_s] true inputs
    table: list[int] = field(default_factory=list)  # logical block -> physical

    @property
    def length(self) -> int:
        return next(iter(self.values.values())).shape[0]


@dataclass
class Batch:
    rows: list[tuple[int, int, int]]  # (rid, first position, n tokens) in batch order
    num_pad: int
    x: dict[int, torch.Tensor]  # stream -> [T, C_s]
    positions: torch.Tensor
    block_table: torch.Tensor
    seq_idx: torch.Tensor
    slot_mapping: torch.Tensor
    query_start: torch.Tensor
    block_size: int = 4
    kernel_size: int = 4
    num_prefill_tokens: int | None = None  # the batch's prompt-row hint (kernel choice only)

    def sconv(self, *, tap_map: torch.Tensor | None = None) -> SconvBatch:
        """The step's :class:`SconvBatch` (validated), optionally with a tap map."""
        return SconvBatch(
            positions=self.positions, block_table=self.block_table, seq_idx=self.seq_idx,
            slot_mapping=self.slot_mapping, query_start=self.query_start,
            block_size=self.block_size, kernel_size=self.kernel_size, tap_map=tap_map,
            num_prefill_tokens=self.num_prefill_tokens,
        )


class PagedWorld:
    """A packed paged cache [num_blocks, H, N, D] shared by several streams."""

    def __init__(
        self,
        *,
        num_heads: int = 2,
        head_size: int = 32,
        block_size: int = 4,
        kernel_size: int = 4,
        streams: tuple[tuple[int, int], ...] = ((0, 8), (8, 8), (16, 10), (26, 6)),
        dtype: torch.dtype = torch.float32,
        num_blocks: int = 64,
        page_pad: int = 0,
        weight_dtype: torch.dtype = torch.float32,
        weight_3d: bool = True,
        seed: int = 0,
    ) -> None:
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.H, self.D, self.N, self.W = num_heads, head_size, block_size, kernel_size
        self.streams = streams
        self.dtype = dtype
        page = num_heads * block_size * head_size
        # Random (not NaN) contents: untouched elements must stay bit-identical.
        self.storage = self.randn(num_blocks, page + page_pad).to(dtype)
        self.cache = self.storage[:, :page].view(num_blocks, num_heads, block_size, head_size)
        self.free = list(range(1, num_blocks))  # block 0 is the null block
        self.rng.shuffle(self.free)
        self.reqs: dict[int, Request] = {}
        self.weights: dict[int, torch.Tensor] = {}
        for s, (_, width) in enumerate(streams):
            w = self.randn(num_heads * width, kernel_size) * 0.5
            w = w.to(weight_dtype)
            self.weights[s] = w.unsqueeze(1) if weight_3d else w

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen)

    def channels(self, s: int) -> int:
        return self.H * self.streams[s][1]

    # -- requests -----------------------------------------------------------
    def _block(self) -> int:
        if not self.free:
            raise RuntimeError("test world ran out of blocks")
        return self.free.pop()

    def _ensure_blocks(self, req: Request, last_position: int) -> None:
        while len(req.table) <= last_position // self.N:
            req.table.append(self._block())

    def slot(self, req: Request, position: int) -> int:
        return req.table[position // self.N] * self.N + position % self.N

    def add_request(self, rid: int, history: int = 0) -> None:
        """A request whose first `history` positions already sit in the cache
        (only the last W-1 of them in live blocks; older entries are null blocks)."""
        vals = {s: self.randn(history, self.channels(s)).to(self.dtype) for s in range(len(self.streams))}
        req = Request(values=vals)
        self.reqs[rid] = req
        live_from = max(0, history - (self.W - 1))
        req.table = [0] * (live_from // self.N)
        if history:
            self._ensure_blocks(req, history - 1)
            for p in range(live_from, history):
                slot = self.slot(req, p)
                for s, (off, width) in enumerate(self.streams):
                    row = vals[s][p].view(self.H, width)
                    self.cache[slot // self.N, :, slot % self.N, off : off + width] = row

    def free_out_of_window(self, rid: int) -> None:
        """Sliding-window freeing: blocks wholly before the window go back to the
        free list (and will be reused, overwritten, by others); the entry becomes the
        null block."""
        req = self.reqs[rid]
        first_needed = max(0, req.length - (self.W - 1))
        for b in range(min(first_needed // self.N, len(req.table))):
            if req.table[b] != 0:
                self.free.append(req.table[b])
                req.table[b] = 0

    def commit(self, batch: Batch, accepted: dict[int, int] | None = None) -> None:
        """Append each request's first `accepted[rid]` fed tokens (all by default) to
        its committed inputs; the rest were rejected drafts."""
        row = 0
        for rid, _, n in batch.rows:
            keep = n if accepted is None else accepted.get(rid, n)
            req = self.reqs[rid]
            for s in req.values:
                req.values[s] = torch.cat([req.values[s], batch.x[s][row : row + keep]])
            row += n

    # -- batches ------------------------------------------------------------
    def make_batch(
        self,
        items: list[tuple[int, int]],
        num_pad: int = 0,
        extra_cols: int = 0,
        values: dict[int, dict[int, torch.Tensor]] | None = None,
    ) -> Batch:
        """items: (rid, n_new_tokens) in batch order; values: optional given inputs
        per rid and stream (else random)."""
        rows: list[tuple[int, int, int]] = []
        positions, seq_idx, slots, qstart = [], [], [], []
        xs: dict[int, list[torch.Tensor]] = {s: [] for s in range(len(self.streams))}
        for i, (rid, n) in enumerate(items):
            req = self.reqs[rid]
            start = req.length
            self._ensure_blocks(req, start + n - 1)
            row0 = len(positions)
            rows.append((rid, start, n))
            for p in range(start, start + n):
                positions.append(p)
                seq_idx.append(i)
                slots.append(self.slot(req, p))
                qstart.append(row0)
            for s in xs:
                if values is not None and rid in values:
                    xs[s].append(values[rid][s][:n].to(self.dtype))
                else:
                    xs[s].append(self.randn(n, self.channels(s)).to(self.dtype))
        for _ in range(num_pad):  # pad rows as engines pad CUDA-graph batches
            positions.append(0)
            seq_idx.append(0)
            slots.append(-1)
            qstart.append(0)
        for s in xs:
            xs[s].append(self.randn(num_pad, self.channels(s)).to(self.dtype))
        width = max([len(self.reqs[rid].table) for rid, _ in items] + [1]) + extra_cols
        table = torch.zeros(max(len(items), 1), width, dtype=torch.int32)
        for i, (rid, _) in enumerate(items):
            t = self.reqs[rid].table
            table[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
        return Batch(
            rows=rows,
            num_pad=num_pad,
            x={s: torch.cat(v).contiguous() for s, v in xs.items()},
            positions=torch.tensor(positions, dtype=torch.int64),
            block_table=table,
            seq_idx=torch.tensor(seq_idx, dtype=torch.int32),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start=torch.tensor(qstart, dtype=torch.int32),
            block_size=self.N,
            kernel_size=self.W,
        )

    def expected(self, batch: Batch, s: int, activation: str | None, residual: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of real tokens and the oracle's output for them (full-sequence conv)."""
        x = batch.x[s]
        idx, outs = [], []
        row = 0
        for rid, start, n in batch.rows:
            # The conv of the whole sequence; only its last W-1+n inputs matter for
            # the n new outputs (older inputs fall outside every window).
            lo = max(0, start - (self.W - 1))
            seq = torch.cat([self.reqs[rid].values[s][lo:], x[row : row + n]])
            full = causal_conv_ref(seq, self.weights[s], activation=activation, residual=residual)
            outs.append(full[start - lo :])
            idx.extend(range(row, row + n))
            row += n
        cols = self.channels(s)
        if not outs:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, cols, dtype=x.dtype)
        return torch.tensor(idx, dtype=torch.long), torch.cat(outs)

    def tap_map(self, batch: Batch) -> torch.Tensor:
        """The step's tap map from the Triton kernels (interpreted), checked entry by
        entry against the reference map; the buffer has a spare poisoned row."""
        from inkling_kernels.tap_map.kernel import sconv_tap_map_triton

        rows = batch.positions.shape[0]
        got = torch.full((rows + 1, self.W - 1), 12345, dtype=torch.int64)
        want = got.clone()
        sconv_tap_map_triton(batch.sconv(), got)
        sconv_tap_map_ref(batch.sconv(), want)
        assert torch.equal(got, want), "tap map differs from the reference map"
        assert bool((got[rows:] == 12345).all()), "tap map wrote beyond its rows"
        return got

    def prefix_hit_batch(self, hit: int, hit_first: bool, prompt_len: int = 22) -> Batch:
        """docs/design.md §3.2: request A computes a prompt; request B, the same prompt,
        hits A's first blocks (registered as cached when allocated) and computes the
        rest in the same call, B's rows first (``hit_first``) or A's. B's pre-forward
        taps name slots that A writes in this call; they are NaN before it, in every
        stream. Needs a world with no requests yet."""
        prompt = {s: self.randn(prompt_len, self.channels(s)).to(self.dtype) for s in range(len(self.streams))}
        self.add_request(0, 0)  # A
        a = self.reqs[0]
        self._ensure_blocks(a, prompt_len - 1)
        self.add_request(1, 0)  # B: prefix hit on A's first blocks
        b = self.reqs[1]
        b.table = list(a.table[: -(-hit // self.N)])
        b.values = {s: prompt[s][:hit].clone() for s in prompt}
        values = {0: prompt, 1: {s: prompt[s][hit:] for s in prompt}}
        items = [(1, prompt_len - hit), (0, prompt_len)] if hit_first else [(0, prompt_len), (1, prompt_len - hit)]
        batch = self.make_batch(items, num_pad=1, values=values)
        for off, width in self.streams:
            for p in range(hit - (self.W - 1), hit):
                slot = self.slot(b, p)
                self.cache[slot // self.N, :, slot % self.N, off : off + width] = float("nan")
        return batch

    def _ref_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A private copy of the storage and its cache view (for the reference op)."""
        ref_storage = self.storage.clone()
        return ref_storage, ref_storage[:, : self.cache[0].numel()].view(self.cache.shape)

    def run(
        self,
        batch: Batch,
        s: int,
        impl: str,
        *,
        config: object = None,
        activation: str | None = None,
        residual: bool = True,
    ) -> torch.Tensor:
        """One fused_sconv call for stream s, with every check of the suite."""
        off, width = self.streams[s]
        x = batch.x[s]
        sb = batch.sconv()
        before = self.storage.clone()
        # The reference op on a private copy of the cache.
        ref_storage, ref_cache = self._ref_cache()
        ref_out = fused_sconv_ref(x, self.weights[s], ref_cache, sb, off, width, activation=activation, residual=residual)

        if impl == "reference":
            out = fused_sconv(x, self.weights[s], self.cache, sb, off, width, activation=activation, residual=residual)
        elif impl == "triton":
            from inkling_kernels.sconv.kernel import fused_sconv_triton

            out = torch.full_like(x, float("nan"))  # poisoned: every row must be written
            ret = fused_sconv_triton(
                x, self.weights[s], self.cache, sb, off, width,
                activation=activation, residual=residual, config=config, out=out, auto_map=False,
            )
            assert ret is out
        elif impl == "triton_map":
            from inkling_kernels.sconv.kernel import fused_sconv_triton

            mapped = batch.sconv(tap_map=self.tap_map(batch))
            out = torch.full_like(x, float("nan"))
            fused_sconv_triton(
                x, self.weights[s], self.cache, mapped, off, width,
                activation=activation, residual=residual, config=config, out=out,
            )
        else:
            raise AssertionError(impl)
        self.verify(batch, {s: (out, ref_out)}, before, ref_storage, activation, residual)
        return out

    def run_kv(
        self,
        batch: Batch,
        impl: str,
        *,
        streams: tuple[int, int] = (0, 1),
        q_cols: int = 24,
        config: object = None,
        activation: str | None = None,
        residual: bool = True,
        v_copy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One fused_sconv_kv call for the streams (K, V), with every check of
        :meth:`run` for both, against two fused_sconv reference calls. k and v are
        column slices of one qkv tensor ``[T, q_cols + 2C]`` (no copy; ``q_cols=0``
        and K, V swapped in ``streams`` give other layouts); ``v_copy``: v is a
        contiguous copy (another row stride)."""
        from inkling_kernels import fused_sconv_kv
        from inkling_kernels.sconv_kv.kernel import fused_sconv_kv_triton

        sk, sv = streams
        (k_off, width), (v_off, _) = self.streams[sk], self.streams[sv]
        channels = self.channels(sk)
        rows = batch.positions.shape[0]
        qkv = torch.cat([self.randn(rows, q_cols).to(self.dtype), batch.x[sk], batch.x[sv]], dim=1)
        k, v = qkv[:, q_cols : q_cols + channels], qkv[:, q_cols + channels :]
        assert rows < 2 or k.stride() == (qkv.shape[1], 1)  # a slice of qkv, not a copy
        if v_copy:
            v = v.contiguous()
        sb = batch.sconv()
        before = self.storage.clone()
        ref_storage, ref_cache = self._ref_cache()
        refs = [
            fused_sconv_ref(batch.x[s], self.weights[s], ref_cache, sb, self.streams[s][0], width,
                            activation=activation, residual=residual)
            for s in (sk, sv)
        ]
        args = (k, v, self.weights[sk], self.weights[sv], self.cache)
        epilogue = dict(activation=activation, residual=residual)
        if impl == "reference":
            outs = fused_sconv_kv(*args, sb, k_off, v_off, width, **epilogue)
        elif impl in ("triton", "triton_map"):
            poisoned = (torch.full_like(batch.x[sk], float("nan")), torch.full_like(batch.x[sv], float("nan")))
            mapped = batch.sconv(tap_map=self.tap_map(batch)) if impl == "triton_map" else sb
            outs = fused_sconv_kv_triton(*args, mapped, k_off, v_off, width, **epilogue, config=config,
                                         out=poisoned, auto_map=False)
            assert outs[0] is poisoned[0] and outs[1] is poisoned[1]
        else:
            raise AssertionError(impl)
        self.verify(batch, {sk: (outs[0], refs[0]), sv: (outs[1], refs[1])}, before, ref_storage, activation, residual)
        return outs

    def run_add(
        self,
        batch: Batch,
        s: int,
        impl: str,
        *,
        hidden: torch.Tensor | None = None,
        config: object = None,
        device: str | torch.device = "cpu",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One ``fused_sconv_add`` call for stream s (``new_hidden = hidden + d +
        conv(d)``, ``d`` the batch's rows), checked as :meth:`run` checks a conv: against
        the reference op on a copy of the cache, against the oracle ``dt(hidden +
        full-sequence conv)`` (:func:`assert_add_close`) and the cache by
        :meth:`verify_cache`. ``impl``: "reference" (the public op on CPU tensors),
        "triton" (the kernel, map-less) or "triton_map" (the kernel with the step's
        tap map, built by the reference builder); the kernel runs on ``device`` (CPU:
        the interpreter) with a NaN-poisoned output. ``hidden``: random when None.
        Returns ``(hidden, new_hidden)``."""
        from inkling_kernels import fused_sconv_add, fused_sconv_add_ref
        from inkling_kernels.sconv_add_rmsnorm.kernel import fused_sconv_add_triton

        off, width = self.streams[s]
        x, weight = batch.x[s], self.weights[s]
        if hidden is None:
            hidden = (2 * self.randn(*x.shape)).to(self.dtype)
        sb = batch.sconv()
        before = self.storage.clone()
        ref_storage, ref_cache = self._ref_cache()
        ref_out = fused_sconv_add_ref(hidden, x, weight, ref_cache, sb, off, width)
        if impl == "reference":
            out = fused_sconv_add(hidden, x, weight, self.cache, sb, off, width)
            assert torch.equal(bits(out), bits(ref_out)), "the public op's CPU path is not the reference"
        elif impl in ("triton", "triton_map"):
            dev = torch.device(device)
            tap_map = None
            if impl == "triton_map":
                tap_map = torch.empty(x.shape[0], self.W - 1, dtype=torch.int64)
                sconv_tap_map_ref(sb, tap_map)
                tap_map = tap_map.to(dev)
            storage = self.storage.to(dev)  # (the world's own storage on the CPU)
            cache = storage[:, : self.cache[0].numel()].view(self.cache.shape)
            meta = (batch.positions, batch.block_table, batch.seq_idx, batch.slot_mapping, batch.query_start)
            db = SconvBatch(*(m.to(dev) for m in meta), batch.block_size, batch.kernel_size, tap_map)
            out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=dev)
            ret = fused_sconv_add_triton(hidden.to(dev), x.to(dev), weight.to(dev), cache, db, off, width,
                                   config=config, out=out, auto_map=False)
            assert ret is out
            self.storage.copy_(storage.cpu())
            out = out.cpu()
        else:
            raise AssertionError(impl)
        assert_add_close(out, ref_out, hidden)
        idx, exp = self.expected(batch, s, None, True)
        assert_add_close(out[idx], (hidden[idx].float() + exp.float()).to(self.dtype), hidden[idx])
        self.verify_cache(batch, [s], before, ref_storage)
        return hidden, out

    def verify(
        self,
        batch: Batch,
        outs: dict[int, tuple[torch.Tensor, torch.Tensor]],
        before: torch.Tensor,
        ref_storage: torch.Tensor,
        activation: str | None,
        residual: bool,
    ) -> None:
        """The checks of one call that convolved the streams in ``outs`` (stream ->
        (output, the reference op's output)); ``before``: the storage before the call,
        ``ref_storage``: after the reference op ran on a copy of it."""
        tol = TOL[self.dtype]
        for s, (out, ref_out) in outs.items():
            x = batch.x[s]
            assert out.shape == x.shape and out.dtype == x.dtype
            assert not torch.isnan(out).any(), f"stream {s}: unwritten (NaN-poisoned) output rows"
            torch.testing.assert_close(out, ref_out, **tol)
            # Oracle: the full-sequence causal conv of each request's inputs.
            idx, exp = self.expected(batch, s, activation, residual)
            torch.testing.assert_close(out[idx], exp, **tol)
        self.verify_cache(batch, list(outs), before, ref_storage)

    def verify_cache(self, batch: Batch, streams: list[int], before: torch.Tensor, ref_storage: torch.Tensor) -> None:
        """The cache after a call that stored the streams ``streams``: written slots
        hold the batch's rows exactly, everything else is bit-identical to ``before``,
        and the whole storage equals ``ref_storage`` (the reference op's)."""
        written = torch.zeros_like(before, dtype=torch.bool)
        wview = written[:, : self.cache[0].numel()].view(self.cache.shape)
        slots = batch.slot_mapping
        valid = (slots >= 0) & (slots < self.cache.shape[0] * self.N)
        vs = slots[valid]
        for s in streams:
            off, width = self.streams[s]
            wview[vs // self.N, :, vs % self.N, off : off + width] = True
            got = self.cache[vs // self.N, :, vs % self.N, off : off + width].reshape(-1, self.H * width)
            assert torch.equal(bits(got.contiguous()), bits(batch.x[s][valid])), f"stream {s}: written slots differ from x"
        assert torch.equal(bits(self.storage)[~written], bits(before)[~written]), (
            "cache elements outside the written slots' stream range changed"
        )
        assert torch.equal(bits(self.storage), bits(ref_storage)), "cache differs from the reference op's"


def assert_add_close(got: torch.Tensor, want: torch.Tensor, hidden: torch.Tensor) -> None:
    """``new_hidden = dt(hidden + dt(d + conv))`` against an expected one: the two
    roundings may each land an ulp apart (fp32 accumulation order; the Triton
    interpreter truncates to bfloat16), so per element ``|got - want| <= 2 eps (|s| +
    |want|)`` with ``s = want - hidden`` (``eps``: the dtype's machine epsilon), plus
    fp32 accumulation slack (1e-5 (1 + |s|))."""
    assert got.shape == want.shape and got.dtype == want.dtype
    assert not torch.isnan(got).any(), "unwritten (NaN-poisoned) output rows"
    w = want.float()
    s = (w - hidden.float()).abs()
    bound = 2 * torch.finfo(want.dtype).eps * (s + w.abs()) + 1e-5 * (1 + s)
    err = (got.float() - w).abs()
    bad = err > bound
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.numel()} elements off; worst {float(err.max()):.3g} at "
        f"{tuple(int(i) for i in torch.nonzero(bad)[0])} (got {float(got.float()[bad][0]):.6g}, "
        f"want {float(w[bad][0]):.6g})"
    )


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["DTYPES", "TOL", "PagedWorld", "assert_add_close", "bits", "ceil_div", "math"]
