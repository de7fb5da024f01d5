"""torch.compile must not bake in the identity branch.

An engine traces its model on the memory-profiling pass, when there is no metadata
and no bound cache (the conv is the identity). The layer's custom op decides at run
time, so later passes of the same compiled graph must convolve. The compiled model
is compared with an eager copy of itself (same weights, its own cache) step by step.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inkling_cache import ConvStateLayout, Stream
from inkling_kernels import causal_conv_ref, fused_sconv
from inkling_model import (
    AttentionCacheOwner,
    ConvStateOwner,
    InklingRelAttention,
    InklingShortConv,
    InklingShortConvAddRMSNorm,
    PagedConvRuntime,
    RelAttentionMetadata,
    current_metadata,
    forward_metadata,
    paged_short_conv,
    paged_short_conv_add,
    paged_short_conv_add_rmsnorm,
    paged_short_conv_kv,
    short_conv_kv,
)

HIDDEN = 32


class TinyBlock(nn.Module):
    """proj -> K conv -> ... -> ATTN conv with the layer's residual around it."""

    def __init__(self, owner: ConvStateOwner) -> None:
        super().__init__()
        layout = owner.layout
        self.k_proj = nn.Linear(HIDDEN, layout.stream_dim(Stream.K), bias=False)
        self.k_sconv = InklingShortConv(layout.stream_dim(Stream.K), layout.kernel_size, owner, Stream.K)
        self.o_proj = nn.Linear(layout.stream_dim(Stream.K), HIDDEN, bias=False)
        self.attn_sconv = InklingShortConv(HIDDEN, layout.kernel_size, owner, Stream.ATTN)

    def forward(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        k = self.k_sconv(self.k_proj(h), positions)
        return h + self.attn_sconv(self.o_proj(torch.tanh(k)), positions)


def identity_block(block: TinyBlock, h: torch.Tensor) -> torch.Tensor:
    """The block with both convs the identity (what a profiling pass computes)."""
    return h + block.o_proj(torch.tanh(block.k_proj(h)))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_model_convolves_after_profiling_pass(backend, unique_name):
    torch.manual_seed(0)
    torch._dynamo.reset()
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=HIDDEN, kernel_size=4)
    eager_owner = ConvStateOwner(layout, unique_name("eager"))
    compiled_owner = ConvStateOwner(layout, unique_name("compiled"))
    eager = TinyBlock(eager_owner)
    with torch.no_grad():
        for p in eager.parameters():
            p.normal_(0.0, 0.5)
    traced = TinyBlock(compiled_owner)
    traced.load_state_dict(eager.state_dict())
    compiled = torch.compile(traced, backend=backend, dynamic=True, fullgraph=True)

    # Profiling pass: no metadata, no cache bound; this call is what gets traced.
    h0 = torch.randn(16, HIDDEN)
    with torch.no_grad():
        torch.testing.assert_close(compiled(h0, torch.arange(16)), identity_block(eager, h0))

    runtime = PagedConvRuntime(num_blocks=32, block_size=4, sliding_window=4, max_num_tokens=64)
    runtime.allocate_caches([eager_owner, compiled_owner], torch.float32, fill=float("nan"))
    seq = {"a": torch.randn(21, HIDDEN), "b": torch.randn(9, HIDDEN)}
    schedule = [
        [("a", 0, 7), ("b", 0, 5)],
        [("b", 5, 4), ("a", 7, 1)],
        [("a", 8, 13)],
    ]
    outs: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    with torch.no_grad():
        for chunks in schedule:
            step = runtime.step(chunks)
            h = torch.cat([seq[r][s : s + n] for r, s, n in chunks])
            with forward_metadata(step.metadata):
                want = eager(h, step.positions)
                got = compiled(h, step.positions)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            # It really convolved (the identity branch would give this instead).
            assert not torch.allclose(got, identity_block(eager, h), rtol=1e-3, atol=1e-3)
            for r, s, n in chunks:
                outs[r].append(got[step.token_slices[r]])
        # A pass without metadata again: the same compiled graph is the identity.
        torch.testing.assert_close(compiled(h0, torch.arange(16)), identity_block(eager, h0))

    # And the whole thing equals the full-sequence computation.
    for r, x in seq.items():
        with torch.no_grad():
            k = causal_conv_ref(eager.k_proj(x), eager.k_sconv.weight)
            want = x + causal_conv_ref(eager.o_proj(torch.tanh(k)), eager.attn_sconv.weight)
        torch.testing.assert_close(torch.cat(outs[r]), want, rtol=1e-5, atol=1e-5)


class NaiveConv(nn.Module):
    """What not to do: decide identity-or-conv in traced Python code."""

    def __init__(self, conv: InklingShortConv) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        owner = self.conv.owner
        meta = current_metadata(owner.name)
        if meta is None or not owner.is_bound:
            return h.clone()
        offset, width = owner.stream_range(self.conv.stream)
        return fused_sconv(h, self.conv.weight, owner.cache, meta, offset, width)


def test_guard_free_trace_of_profiling_pass(unique_name):
    """An engine that replays the graph traced on the profiling pass without
    re-checking guards (vLLM's compiled models) is modelled by torch.export: the
    graph is traced once, with no metadata, and run later with metadata."""
    torch.manual_seed(1)
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=HIDDEN, kernel_size=4)
    owner = ConvStateOwner(layout, unique_name("export"))
    conv = InklingShortConv(HIDDEN, 4, owner, Stream.MLP)
    with torch.no_grad():
        conv.weight.normal_()
    tokens = torch.export.Dim("tokens", min=2, max=64)
    shapes = {"x": {0: tokens}, "positions": {0: tokens}}
    h0, p0 = torch.randn(16, HIDDEN), torch.arange(16)
    exported = torch.export.export(conv, (h0, p0), dynamic_shapes=shapes).module()
    naive = torch.export.export(
        NaiveConv(conv), (h0, p0), dynamic_shapes={"h": {0: tokens}, "positions": {0: tokens}}
    ).module()

    runtime = PagedConvRuntime(num_blocks=16, block_size=4, sliding_window=4, max_num_tokens=64)
    runtime.allocate_caches([owner], torch.float32, fill=float("nan"))
    x = torch.randn(11, HIDDEN)
    step = runtime.step([("a", 0, 11)])
    with torch.no_grad(), forward_metadata(step.metadata):
        got = exported(x, step.positions)
        baked = naive(x, step.positions)
    torch.testing.assert_close(got, causal_conv_ref(x, conv.weight), rtol=1e-5, atol=1e-5)
    # The control: the Python branch was resolved at trace time and stays the identity.
    torch.testing.assert_close(baked, x, rtol=0, atol=0)


class EveryOpBlock(nn.Module):
    """One call of each of the model's metadata-reading ops."""

    def __init__(self, owner: ConvStateOwner, attention: AttentionCacheOwner) -> None:
        super().__init__()
        layout = owner.layout
        kv = layout.stream_dim(Stream.K)
        self.k_sconv = InklingShortConv(kv, layout.kernel_size, owner, Stream.K)
        self.v_sconv = InklingShortConv(kv, layout.kernel_size, owner, Stream.V)
        self.attn = InklingRelAttention(attention, d_rel=4, extent=8)
        self.attn_tail = InklingShortConvAddRMSNorm(HIDDEN, layout.kernel_size, owner, Stream.ATTN)
        self.mlp_sconv = InklingShortConv(HIDDEN, layout.kernel_size, owner, Stream.MLP)

    def forward(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        kv = self.k_sconv.dim
        k, v = short_conv_kv(self.k_sconv, self.v_sconv, h[:, :kv], h[:, kv:2 * kv])
        q = torch.cat([k, v], dim=1)
        o = self.attn(q, k, v, h[:, : 4 * 4], positions)
        hidden, normed = self.attn_tail(h, o)
        hidden = paged_short_conv_add(hidden, normed, self.mlp_sconv.weight, self.mlp_sconv.owner.name, int(Stream.MLP))
        return self.mlp_sconv(hidden)


def test_no_op_hands_a_later_graph_piece_a_tensor_it_allocated(unique_name):
    """Engines split the traced graph at these ops and capture the pieces between them
    as CUDA graphs (vLLM's piecewise graphs), which replay reading their inputs at the
    addresses of capture time. An op that returned a tensor it allocated would hand the
    next piece a new address at each replay; so every op writes into outputs that an
    earlier piece allocated and returns nothing a later node reads."""
    torch._dynamo.reset()
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=HIDDEN, kernel_size=4)
    attention = AttentionCacheOwner(unique_name("attn"), num_heads=4, num_kv_heads=2, head_dim=8)
    block = EveryOpBlock(ConvStateOwner(layout, unique_name("pieces")), attention)
    graphs = []

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    h = torch.randn(6, HIDDEN)
    with torch.no_grad():
        torch.compile(block, backend=record, fullgraph=True)(h, torch.arange(6))
    (graph,) = graphs
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and "inkling_model" in str(n.target)]
    assert {str(n.target).split(".")[1] for n in calls} == {
        "paged_short_conv_kv_out", "paged_rel_attention_out", "paged_short_conv_add_rmsnorm_out",
        "paged_short_conv_add_out", "paged_short_conv_out",
    }
    for node in calls:
        assert not node.users, f"{node.target}'s result is read by {list(node.users)}"
        schema = node.target._schema
        written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        assert written and not schema.returns, f"{node.target} must write its outputs into arguments"


def test_rows_past_the_batch_are_padding(unique_name, monkeypatch):
    """An engine may run a forward on more rows than the step's metadata describes
    (vLLM's drafters pad to a captured graph's size): every op computes the described
    rows as it would without the padding, writes the cache the same, and zeros the
    pad rows."""
    torch.manual_seed(2)
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=HIDDEN, kernel_size=4)
    kv = layout.stream_dim(Stream.K)
    weights = {s: torch.randn(layout.stream_dim(s), 1, 4) for s in Stream}
    norm_weight = torch.rand(HIDDEN) + 0.5
    rel_proj = torch.randn(4, 8)
    rows, pad = 7, 3
    x = torch.randn(rows + pad, HIDDEN)
    d = torch.randn(rows + pad, HIDDEN)

    def run(tag: str, n: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        owner = ConvStateOwner(layout, unique_name(f"pad-{tag}"))
        runtime = PagedConvRuntime(num_blocks=16, block_size=4, sliding_window=4, max_num_tokens=16)
        runtime.allocate_caches([owner], torch.float32)
        attention = AttentionCacheOwner(unique_name(f"pad-attn-{tag}"), num_heads=4, num_kv_heads=2, head_dim=8)
        attention.bind_cache(torch.zeros(4, 2, 4, 16))
        pos = torch.arange(rows)
        meta = RelAttentionMetadata(block_table=torch.tensor([[2, 0, 1, 3]], dtype=torch.int32),
                                    slot_mapping=torch.tensor([2, 0, 1, 3])[pos // 4] * 4 + pos % 4,
                                    query_start_loc_cpu=torch.tensor([0, rows]), seq_lens_cpu=torch.tensor([rows]),
                                    block_size=4)
        layer = InklingRelAttention(attention, d_rel=4, extent=8)
        layer.load_rel_proj(rel_proj)
        step = runtime.step([("a", 0, rows)])
        name = owner.name
        with torch.no_grad(), forward_metadata({name: step.metadata, attention.name: meta}):
            got = [
                *paged_short_conv_kv(x[:n, :kv], x[:n, kv:2 * kv], weights[Stream.K], weights[Stream.V], name),
                *paged_short_conv_add_rmsnorm(x[:n], d[:n], weights[Stream.ATTN], norm_weight, name,
                                              int(Stream.ATTN), 1e-6),
                paged_short_conv_add(x[:n], d[:n], weights[Stream.MLP], name, int(Stream.MLP)),
                paged_short_conv(d[:n], weights[Stream.MLP], name, int(Stream.MLP)),
                layer(x[:n], x[:n, :kv], x[:n, kv:2 * kv], x[:n, :16], torch.arange(n) % rows),
            ]
        return got, owner.cache.clone(), attention.cache.clone()

    want, want_conv, want_kv = run("plain", rows)
    empty_like = torch.empty_like

    def poisoned(*args, **kwargs):  # fresh outputs start as NaN: every row must be written
        out = empty_like(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty_like", poisoned)
    got, got_conv, got_kv = run("padded", rows + pad)
    for g, w in zip(got, want):
        assert g.shape[0] == rows + pad
        torch.testing.assert_close(g[:rows], w, rtol=1e-5, atol=1e-5)
        assert not g[rows:].any(), "pad rows must be zeros"
    assert torch.equal(got_conv, want_conv) and torch.equal(got_kv, want_kv)
