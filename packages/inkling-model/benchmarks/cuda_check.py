"""Check inkling_model on a CUDA device (the Triton path of fused_sconv).

Run from the repository root on a GPU machine (no install needed)::

    PYTHONPATH=packages/inkling-cache/src:packages/inkling-kernels/src:packages/inkling-model/src \
        python3 packages/inkling-model/benchmarks/cuda_check.py

1. Random schedules (chunked prefill, decode, speculative rejections, preemption, pad
   rows, several requests per step) through the runtime, all four streams sharing one
   cache, fp32 and bf16, block size W and larger: against the full-sequence reference.
2. CUDA graphs: one forward of InklingShortConv captured on the first step and replayed
   for every later step (fixed padded size): the runtime's and the builder's persistent
   buffers keep their addresses, so the replay reads the new step's metadata.
3. torch.compile (inductor) traced on a profiling pass without metadata, then run with
   metadata: equals eager.
4. The step's tap map (built by the runtime on CUDA by default): equals
   ``sconv_tap_map_ref`` of the same metadata, and a schedule run through it equals
   the same schedule run without it (``PagedConvRuntime(..., tap_map=False)``).

Exits non-zero on the first mismatch.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from inkling_cache import ConvStateLayout, Stream  # noqa: E402
from inkling_kernels import SconvBatch, causal_conv_ref, sconv_tap_map_ref  # noqa: E402
from inkling_model import (  # noqa: E402
    ConvStateOwner,
    InklingShortConv,
    PagedConvRuntime,
    ScheduledChunk,
    forward_metadata,
)
from model_test_driver import Feed, run_schedule  # noqa: E402

DEV = torch.device("cuda")
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}


def layout() -> ConvStateLayout:
    return ConvStateLayout.build(num_kv_heads=4, head_dim=64, hidden_size=512, kernel_size=4)


def check_schedules() -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for block_size in (4, 16):
            owner = ConvStateOwner(layout(), f"sched.{dtype}.{block_size}")
            feeds = []
            lengths = [1, 5, 37, 90, 64, 13, 200, 7]
            for stream in Stream:
                conv = InklingShortConv(owner.stream_dim(stream), 4, owner, stream, device=DEV)
                torch.nn.init.normal_(conv.weight, std=0.5)
                feeds.append(Feed(conv, [torch.randn(n, conv.dim, device=DEV).to(dtype) for n in lengths]))
            rt = PagedConvRuntime(128, block_size, 4, max_num_tokens=512, max_blocks_per_req=64, device=DEV)
            rt.allocate_caches([owner], dtype, fill=float("nan"))
            t0 = time.perf_counter()
            outs, stats = run_schedule(rt, feeds, seed=block_size, max_chunk=40)
            for feed, per_seq in zip(feeds, outs):
                for x, y in zip(feed.inputs, per_seq):
                    torch.testing.assert_close(y, causal_conv_ref(x, feed.conv.weight), **TOL[dtype])
            print(
                f"schedule ok: {dtype} N={block_size}: {stats.steps} steps, {stats.spec_rounds} spec rounds "
                f"({stats.rejected} rejected), {stats.preemptions} preemptions, "
                f"{stats.padded_steps} padded steps ({time.perf_counter() - t0:.1f} s)"
            )


def check_same_step_prefix_hit() -> None:
    """B starts on a shared prefix whose last block A computes in the same launch
    (docs/design.md §3.2), in both batch orders, repeated: every launch must be right."""
    dtype = torch.bfloat16
    lay = layout()
    for block_size in (4, 16):
        for b_first in (True, False):
            owner = ConvStateOwner(lay, f"hit.{block_size}.{b_first}")
            conv = InklingShortConv(lay.stream_dim(Stream.ATTN), 4, owner, Stream.ATTN, device=DEV)
            torch.nn.init.normal_(conv.weight, std=0.5)
            bad = 0
            for trial in range(50):
                rt = PagedConvRuntime(512, block_size, 4, max_num_tokens=2048, max_blocks_per_req=256, device=DEV)
                rt.allocate_caches([owner], dtype, fill=float("nan"))
                prefix = 32 * block_size
                a = torch.randn(64 * block_size, conv.dim, device=DEV).to(dtype)
                b = torch.cat([a[:prefix], torch.randn(9, conv.dim, device=DEV).to(dtype)])
                step0 = rt.step([("A", 0, 1)])
                with forward_metadata(step0.metadata):
                    conv(a[:1], step0.positions)
                hit = ScheduledChunk("B", prefix, 9, prefix_from="A")
                a_chunk = ("A", 1, len(a) - 1)
                chunks = [hit, a_chunk] if b_first else [a_chunk, hit]
                step = rt.step(chunks)
                parts = {"A": a[1:], "B": b[prefix:]}
                x = torch.cat([parts["B"], parts["A"]] if b_first else [parts["A"], parts["B"]])
                with forward_metadata(step.metadata):
                    y = conv(x, step.positions)
                want = causal_conv_ref(b, conv.weight)[prefix:]
                if not torch.allclose(y[step.token_slices["B"]], want, **TOL[dtype]):
                    bad += 1
            if bad:
                raise AssertionError(f"same-step prefix hit: {bad}/50 launches wrong (N={block_size}, b_first={b_first})")
            print(f"same-step prefix hit ok: N={block_size} {'B first' if b_first else 'A first'}: 50/50 launches")


def check_cuda_graph() -> None:
    dtype = torch.bfloat16
    lay = layout()
    owner = ConvStateOwner(lay, "graph.owner")
    warm_owner = ConvStateOwner(lay, "graph.warmup")
    conv = InklingShortConv(lay.stream_dim(Stream.ATTN), 4, owner, Stream.ATTN, device=DEV)
    torch.nn.init.normal_(conv.weight, std=0.5)
    warm = InklingShortConv(conv.dim, 4, warm_owner, Stream.ATTN, device=DEV)
    rt = PagedConvRuntime(64, 4, 4, max_num_tokens=64, max_blocks_per_req=32, max_num_reqs=8, device=DEV)
    rt.allocate_caches([owner, warm_owner], dtype, fill=float("nan"))
    seqs = {r: torch.randn(n, conv.dim, device=DEV).to(dtype) for r, n in (("a", 30), ("b", 9), ("c", 17))}
    schedule = [
        [("a", 0, 12), ("b", 0, 9)],
        [("c", 0, 5), ("a", 12, 3)],
        [("a", 15, 1), ("c", 5, 12), ("b", 9, 0)],
        [("a", 16, 14)],
    ]
    padded = 32
    static_x = torch.zeros(padded, conv.dim, device=DEV, dtype=dtype)
    graph = None
    captured_ptrs = None
    outs: dict[str, list[torch.Tensor]] = {r: [] for r in seqs}
    replays = 0
    for chunks in schedule:
        chunks = [c for c in chunks if c[2] > 0]
        step = rt.step(chunks, pad_to=padded)
        meta = step.metadata
        if meta.tap_map is None:
            raise AssertionError("the runtime built no tap map on CUDA")
        ptrs = [
            t.data_ptr()
            for t in (meta.block_table, meta.slot_mapping, meta.seq_idx, meta.query_start, step.positions, meta.tap_map)
        ]
        static_x.normal_()  # pad rows hold garbage
        rows = torch.cat([seqs[r][s : s + n] for r, s, n in chunks])
        static_x[: rows.shape[0]] = rows
        if graph is None:
            with forward_metadata(meta):
                warm(static_x, step.positions)  # Triton JIT outside the capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_y = conv(static_x, step.positions)
            captured_ptrs = ptrs
        if ptrs != captured_ptrs:
            raise AssertionError("metadata buffers moved between steps: the graph would read stale ones")
        graph.replay()
        replays += 1
        for r, s, n in chunks:
            outs[r].append(static_y[step.token_slices[r]].clone())
    torch.cuda.synchronize()
    for r, x in seqs.items():
        torch.testing.assert_close(torch.cat(outs[r]), causal_conv_ref(x, conv.weight), **TOL[dtype])
    print(f"cuda graph ok: 1 capture, {replays} replays over changing batches")


def check_tap_map() -> None:
    """The runtime's per-step tap map on CUDA: equal to the reference map of the same
    metadata, and a schedule through it equal to the same schedule without it."""
    for dtype in (torch.float32, torch.bfloat16):
        for block_size in (4, 16):
            lengths = [1, 5, 37, 90, 64, 13, 200, 7]
            outs = {}
            maps = 0
            for with_map in (True, False):
                owner = ConvStateOwner(layout(), f"tapmap.{dtype}.{block_size}.{with_map}")
                torch.manual_seed(block_size)
                feeds = []
                for stream in Stream:
                    conv = InklingShortConv(owner.stream_dim(stream), 4, owner, stream, device=DEV)
                    torch.nn.init.normal_(conv.weight, std=0.5)
                    feeds.append(Feed(conv, [torch.randn(n, conv.dim, device=DEV).to(dtype) for n in lengths]))
                rt = PagedConvRuntime(
                    128, block_size, 4, max_num_tokens=512, max_blocks_per_req=64, device=DEV,
                    tap_map=None if with_map else False,
                )
                rt.allocate_caches([owner], dtype, fill=float("nan"))
                real_step = rt.step

                def step(*args, **kwargs):  # check every step's map against the reference
                    nonlocal maps
                    out = real_step(*args, **kwargs)
                    meta = out.metadata
                    if with_map:
                        if meta.tap_map is None:
                            raise AssertionError("no tap map on CUDA in auto mode")
                        want = torch.empty(meta.num_tokens, 3, dtype=torch.int64)
                        sconv_tap_map_ref(
                            SconvBatch(
                                out.positions.cpu(), meta.block_table.cpu(), meta.seq_idx.cpu(),
                                meta.slot_mapping.cpu(), meta.query_start.cpu(), block_size, 4,
                            ),
                            want,
                        )
                        if not torch.equal(meta.tap_map.cpu(), want):
                            raise AssertionError("the CUDA tap map differs from sconv_tap_map_ref")
                        maps += 1
                    elif meta.tap_map is not None:
                        raise AssertionError("tap_map=False still built a map")
                    return out

                rt.step = step  # type: ignore[method-assign]
                outs[with_map], stats = run_schedule(rt, feeds, seed=block_size, max_chunk=40)
                for feed, per_seq in zip(feeds, outs[with_map]):
                    for x, y in zip(feed.inputs, per_seq):
                        torch.testing.assert_close(y, causal_conv_ref(x, feed.conv.weight), **TOL[dtype])
            for a_seqs, b_seqs in zip(outs[True], outs[False]):
                for a, b in zip(a_seqs, b_seqs):
                    torch.testing.assert_close(a, b, rtol=0, atol=0)
            print(f"tap map ok: {dtype} N={block_size}: {maps} maps equal the reference, outputs equal the map-less run")


class Block(torch.nn.Module):
    def __init__(self, owner: ConvStateOwner) -> None:
        super().__init__()
        hidden = owner.layout.hidden_size
        self.proj = torch.nn.Linear(hidden, hidden, bias=False, device=DEV)
        self.mlp_sconv = InklingShortConv(hidden, 4, owner, Stream.MLP, device=DEV)

    def forward(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return h + self.mlp_sconv(torch.nn.functional.silu(self.proj(h)), positions)


def check_compile() -> None:
    lay = layout()
    eager_owner, compiled_owner = ConvStateOwner(lay, "compile.eager"), ConvStateOwner(lay, "compile.compiled")
    eager = Block(eager_owner)
    torch.nn.init.normal_(eager.mlp_sconv.weight, std=0.5)
    compiled_src = Block(compiled_owner)
    compiled_src.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_src, backend="inductor", dynamic=True, fullgraph=True)
    h0 = torch.randn(24, lay.hidden_size, device=DEV)
    with torch.no_grad():
        want0 = h0 + torch.nn.functional.silu(eager.proj(h0))
        torch.testing.assert_close(compiled(h0, torch.arange(24, device=DEV)), want0)  # profiling pass
        rt = PagedConvRuntime(32, 4, 4, max_num_tokens=64, device=DEV)
        rt.allocate_caches([eager_owner, compiled_owner], torch.float32, fill=float("nan"))
        x = torch.randn(40, lay.hidden_size, device=DEV)
        for start, n in ((0, 17), (17, 1), (18, 22)):
            step = rt.step([("a", start, n)])
            with forward_metadata(step.metadata):
                want = eager(x[start : start + n], step.positions)
                got = compiled(x[start : start + n], step.positions)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            ident = x[start : start + n] + torch.nn.functional.silu(eager.proj(x[start : start + n]))
            if torch.allclose(got, ident, rtol=1e-3, atol=1e-3):
                raise AssertionError("the compiled graph kept the identity branch")
    print("torch.compile (inductor, CUDA) ok: traced without metadata, convolves with it")


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name())
    check_schedules()
    check_same_step_prefix_hit()
    check_cuda_graph()
    check_compile()
    check_tap_map()
    print("all CUDA checks passed")
