"""InklingShortConvAddRMSNorm against transformers' own modules.

A tiny ``InklingDecoderLayer`` runs whole sequences; hooks capture, per sequence,
the sublayer outputs that feed ``attn_sconv`` / ``mlp_sconv`` and the residual
stream around them. The fused layer, driven through the paged runtime with random
schedules (chunked prefill, decode, speculative rounds with rejections, preemption,
pad rows), must reproduce ``residual + sconv(d)`` and the next RMSNorm of it:
``post_attention_layernorm`` after attention, and an ``InklingRMSNorm`` standing for
the next layer's ``input_layernorm`` after the MLP.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformers.models.inkling.modeling_inkling import InklingDecoderLayer, InklingRMSNorm

from inkling_cache import ConvStateLayout, Stream
from inkling_kernels.sconv_add_rmsnorm import rms_norm_ref
from inkling_model import ConvStateOwner, InklingShortConv, PagedConvRuntime, forward_metadata
from inkling_model.fused_norm import InklingShortConvAddRMSNorm, paged_short_conv_add
from hf_tiny import tiny_text_config
from model_test_driver import Feed, run_schedule

TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    # transformers rounds at the same points; only the conv's fp32 summation order
    # differs, which can flip a bf16 rounding (and the flip carries into the norm).
    torch.bfloat16: dict(rtol=1.6e-2, atol=3e-2),
}


class Packed(nn.Module):
    """Adapts the fused layer to the driver's ``conv(x, positions)``: ``x`` is
    ``[hidden | d]`` along channels, the result ``[new_hidden | normed]``."""

    def __init__(self, fused: InklingShortConvAddRMSNorm) -> None:
        super().__init__()
        self.fused = fused

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, d = x.chunk(2, dim=1)
        return torch.cat(self.fused(hidden.contiguous(), d.contiguous(), positions), dim=1)


def capture(layer: InklingDecoderLayer, next_norm: InklingRMSNorm, h_in: torch.Tensor) -> dict[str, torch.Tensor]:
    """One sequence ``[1, L, hidden]`` through the HF layer; ``[L, hidden]`` tensors."""
    got: dict[str, torch.Tensor] = {}

    def keep(name: str, index: int | None):
        def hook(mod, args, out):
            got[name] = (args[0] if index is None else out)[0].detach().clone()
        return hook

    handles = [
        layer.attn_sconv.register_forward_hook(keep("attn_d", None)),
        layer.post_attention_layernorm.register_forward_hook(keep("attn_hidden", None)),
        layer.post_attention_layernorm.register_forward_hook(keep("attn_normed", 0)),
        layer.mlp_sconv.register_forward_hook(keep("mlp_d", None)),
    ]
    try:
        with torch.no_grad():
            out = layer(h_in)
            got["mlp_hidden"] = out[0].clone()
            got["mlp_normed"] = next_norm(out)[0].clone()
    finally:
        for h in handles:
            h.remove()
    got["layer_in"] = h_in[0].clone()
    return got


def build_reference(layer_idx: int, dtype: torch.dtype, lengths: list[int]):
    torch.manual_seed(10 + layer_idx)
    cfg = tiny_text_config(rms_norm_eps=1e-5)
    layer = InklingDecoderLayer(cfg, layer_idx)
    next_norm = InklingRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
    with torch.no_grad():
        for name, param in list(layer.named_parameters()) + list(next_norm.named_parameters()):
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.4 if "sconv" in name else 0.2)
    layer, next_norm = layer.to(dtype), next_norm.to(dtype)
    layer.attn_sconv.float()  # transformers keeps the conv weights in fp32
    layer.mlp_sconv.float()
    caps = [capture(layer, next_norm, torch.randn(1, n, cfg.hidden_size).to(dtype)) for n in lengths]
    return cfg, layer, next_norm, caps


@pytest.mark.parametrize("layer_idx", [0, 1], ids=["sliding", "global"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_matches_transformers_decoder_layer(layer_idx, dtype, unique_name):
    lengths = [1, 6, 17, 30]
    cfg, layer, next_norm, caps = build_reference(layer_idx, dtype, lengths)
    state = layer.state_dict()
    owner = ConvStateOwner.for_layer(cfg, layer_idx, unique_name("fused"))
    streams = {
        Stream.ATTN: ("attn", state["attn_sconv.conv1d.weight"], state["post_attention_layernorm.weight"]),
        Stream.MLP: ("mlp", state["mlp_sconv.conv1d.weight"], next_norm.weight.detach()),
    }
    feeds, names = [], []
    for stream, (name, conv_w, norm_w) in streams.items():
        fused = InklingShortConvAddRMSNorm(cfg.hidden_size, cfg.conv_kernel_size, owner, stream,
                                           eps=cfg.rms_norm_eps)
        fused.load_weight(conv_w)
        fused.load_norm_weight(norm_w)
        residual = [c["layer_in"] if stream == Stream.ATTN else c["attn_hidden"] for c in caps]
        inputs = [torch.cat([h, c[f"{name}_d"]], dim=1) for h, c in zip(residual, caps)]
        feeds.append(Feed(Packed(fused), inputs))  # type: ignore[arg-type]
        names.append(name)
    block_size = 4 if layer_idx == 0 else 8  # an engine may enlarge the block
    runtime = PagedConvRuntime(num_blocks=64, block_size=block_size, sliding_window=cfg.conv_kernel_size,
                               max_num_tokens=128, max_blocks_per_req=16)
    runtime.allocate_caches([owner], dtype, fill=float("nan"))
    outs, stats = run_schedule(runtime, feeds, seed=7 + layer_idx)
    assert stats.spec_rounds and stats.rejected and stats.preemptions and stats.padded_steps
    assert stats.decodes and stats.prefill_chunks and stats.max_batch > 1

    for name, per_seq in zip(names, outs):
        for i, (out, cap) in enumerate(zip(per_seq, caps)):
            assert out.dtype == dtype
            new_hidden, normed = out.chunk(2, dim=1)
            torch.testing.assert_close(new_hidden, cap[f"{name}_hidden"], **TOL[dtype],
                                       msg=lambda m: f"{name} seq {i} new_hidden: {m}")
            torch.testing.assert_close(normed, cap[f"{name}_normed"], **TOL[dtype],
                                       msg=lambda m: f"{name} seq {i} normed: {m}")
            if dtype == torch.bfloat16:
                # Rounded at transformers' points: nearly every element is bit-exact
                # (a 1 % error in the sum, say, would pass the tolerance but not this).
                for got, want in ((new_hidden, cap[f"{name}_hidden"]), (normed, cap[f"{name}_normed"])):
                    assert (got == want).float().mean() >= 0.98


def test_matches_unfused_layers(unique_name):
    """The fused layer against InklingShortConv + add + RMSNorm, step by step, each
    with its own cache, on one schedule (bf16, pad rows included)."""
    torch.manual_seed(3)
    dtype = torch.bfloat16
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=32, kernel_size=4)
    fused_owner, plain_owner = ConvStateOwner(layout, unique_name("f")), ConvStateOwner(layout, unique_name("p"))
    fused = InklingShortConvAddRMSNorm(32, 4, fused_owner, Stream.MLP, eps=1e-6)
    plain = InklingShortConv(32, 4, plain_owner, Stream.MLP)
    weight, norm_w = torch.randn(32, 1, 4) * 0.5, torch.rand(32) + 0.5
    fused.load_weight(weight)
    plain.load_weight(weight)
    fused.load_norm_weight(norm_w.to(dtype))
    runtime = PagedConvRuntime(num_blocks=32, block_size=4, sliding_window=4, max_num_tokens=64)
    runtime.allocate_caches([fused_owner, plain_owner], dtype, fill=float("nan"))
    schedule = [[("a", 0, 7), ("b", 0, 5)], [("b", 5, 1), ("a", 7, 1)], [("a", 8, 11)]]
    for chunks in schedule:
        step = runtime.step(chunks, pad_to=sum(c[2] for c in chunks) + 2)
        hidden = torch.randn(step.num_padded_tokens, 32).to(dtype)
        d = torch.randn(step.num_padded_tokens, 32).to(dtype)
        with torch.no_grad(), forward_metadata(step.metadata):
            new_hidden, normed = fused(hidden, d, step.positions)
            want_hidden = hidden + plain(d, step.positions)
        want_normed = rms_norm_ref(want_hidden, norm_w.to(dtype), 1e-6)
        torch.testing.assert_close(new_hidden, want_hidden, **TOL[dtype])
        torch.testing.assert_close(normed, want_normed, **TOL[dtype])
        # The fused layer wrote the same conv inputs into its cache.
        assert torch.equal(fused_owner.cache.nan_to_num(7.0), plain_owner.cache.nan_to_num(7.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_shard_conv_add_matches_unfused(dtype, unique_name):
    """tp > 1: ``paged_short_conv_add`` on a rank's hidden shard (no norm) against
    InklingShortConv on the same shard + the residual add, each with its own cache,
    on a schedule with chunks, decode and pad rows; both ranks' layouts."""
    torch.manual_seed(5)
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=64, kernel_size=4, tp_size=2)
    shard = 32
    weight = torch.randn(2 * shard, 1, 4) * 0.5
    for rank in range(2):
        fused_owner = ConvStateOwner(layout, unique_name(f"sf{rank}"))
        plain_owner = ConvStateOwner(layout, unique_name(f"sp{rank}"))
        fused = InklingShortConv(shard, 4, fused_owner, Stream.ATTN, tap_major=True)
        plain = InklingShortConv(shard, 4, plain_owner, Stream.ATTN)
        fused.load_weight(weight, rank, 2)
        plain.load_weight(weight, rank, 2)
        assert torch.equal(fused.weight, plain.weight) and fused.weight[:, 0].stride() == (1, shard)
        runtime = PagedConvRuntime(num_blocks=32, block_size=4, sliding_window=4, max_num_tokens=64)
        runtime.allocate_caches([fused_owner, plain_owner], dtype, fill=float("nan"))
        schedule = [[("a", 0, 7), ("b", 0, 5)], [("b", 5, 1), ("a", 7, 1)], [("a", 8, 11), ("b", 6, 1)]]
        for chunks in schedule:
            step = runtime.step(chunks, pad_to=sum(c[2] for c in chunks) + 2)
            hidden = torch.randn(step.num_padded_tokens, shard).to(dtype)
            d = torch.randn(step.num_padded_tokens, shard).to(dtype)
            with torch.no_grad(), forward_metadata(step.metadata):
                got = paged_short_conv_add(hidden, d, fused.weight, fused_owner.name, int(Stream.ATTN))
                want = hidden + plain(d, step.positions)
            torch.testing.assert_close(got, want, **TOL[dtype])
            assert torch.equal(fused_owner.cache.nan_to_num(7.0), plain_owner.cache.nan_to_num(7.0))
        # no metadata: the conv is the identity
        hidden, d = torch.randn(3, shard).to(dtype), torch.randn(3, shard).to(dtype)
        got = paged_short_conv_add(hidden, d, fused.weight, fused_owner.name, int(Stream.ATTN))
        assert torch.equal(got, hidden + d)


def test_identity_without_metadata_or_cache(unique_name):
    torch.manual_seed(4)
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=32, kernel_size=4)
    owner = ConvStateOwner(layout, unique_name())
    fused = InklingShortConvAddRMSNorm(32, 4, owner, Stream.ATTN, eps=1e-5)
    fused.load_weight(torch.randn(32, 1, 4))
    fused.load_norm_weight(torch.rand(32) + 0.5)
    hidden, d = torch.randn(5, 32), torch.randn(5, 32)
    want = hidden + d
    runtime = PagedConvRuntime(num_blocks=8, block_size=4, sliding_window=4, max_num_tokens=8)
    step = runtime.step([("a", 0, 5)])
    for meta in (None, step.metadata):  # no metadata; metadata but no bound cache
        with torch.no_grad(), forward_metadata(meta):
            new_hidden, normed = fused(hidden, d, step.positions)
        assert torch.equal(new_hidden, want)
        torch.testing.assert_close(normed, rms_norm_ref(want, fused.norm_weight, 1e-5), rtol=0, atol=0)
        assert new_hidden.data_ptr() not in (hidden.data_ptr(), d.data_ptr())


def test_forward_checks_match_the_plain_layer(unique_name):
    """The fused layer runs the same pre-launch checks as InklingShortConv."""
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=32, kernel_size=4)
    owner = ConvStateOwner(layout, unique_name())
    fused = InklingShortConvAddRMSNorm(32, 4, owner, Stream.MLP, eps=1e-5)
    runtime = PagedConvRuntime(num_blocks=8, block_size=4, sliding_window=4, max_num_tokens=8)
    runtime.allocate_caches([owner], torch.float32)
    step = runtime.step([("a", 0, 6)])
    with torch.no_grad(), forward_metadata(step.metadata):
        with pytest.raises(ValueError, match="batch describes 6 tokens"):
            fused(torch.randn(5, 32), torch.randn(5, 32), torch.arange(5))
        with pytest.raises(TypeError, match="differs from x dtype"):
            fused(torch.randn(6, 32).bfloat16(), torch.randn(6, 32).bfloat16(), step.positions)
    # Slots computed for N = 4 must not be used with a cache of 8-row blocks.
    owner.bind_cache(torch.zeros(8, 2, 8, layout.head_size))
    with torch.no_grad(), forward_metadata(step.metadata):
        with pytest.raises(ValueError, match=r"cache.shape\[2\] = 8 differs from the batch's block_size 4"):
            fused(torch.randn(6, 32), torch.randn(6, 32), step.positions)


def test_compiled_after_profiling_pass_still_convolves(unique_name):
    """A graph traced with no metadata (an engine's profiling pass) must convolve
    when metadata arrives: compiled and eager copies, each with its own cache."""
    torch.manual_seed(5)
    torch._dynamo.reset()
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=32, kernel_size=4)
    owners = [ConvStateOwner(layout, unique_name(k)) for k in ("eager", "compiled")]

    class Block(nn.Module):
        def __init__(self, owner: ConvStateOwner) -> None:
            super().__init__()
            self.proj = nn.Linear(32, 32, bias=False)
            self.fused = InklingShortConvAddRMSNorm(32, 4, owner, Stream.ATTN)

        def forward(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            new_h, normed = self.fused(h, self.proj(h), positions)
            return new_h + torch.tanh(normed)

    eager, traced = Block(owners[0]), Block(owners[1])
    with torch.no_grad():
        for p in eager.parameters():
            p.normal_(0.0, 0.5)
    traced.load_state_dict(eager.state_dict())
    compiled = torch.compile(traced, backend="aot_eager", dynamic=True, fullgraph=True)
    h0 = torch.randn(12, 32)
    with torch.no_grad():
        identity = compiled(h0, torch.arange(12))
        torch.testing.assert_close(identity, eager(h0, torch.arange(12)))
    runtime = PagedConvRuntime(num_blocks=16, block_size=4, sliding_window=4, max_num_tokens=32)
    runtime.allocate_caches(owners, torch.float32, fill=float("nan"))
    for chunks in ([("a", 0, 6), ("b", 0, 3)], [("b", 3, 1), ("a", 6, 2)]):
        step = runtime.step(chunks)
        h = torch.randn(step.num_padded_tokens, 32)
        with torch.no_grad(), forward_metadata(step.metadata):
            want = eager(h, step.positions)
            got = compiled(h, step.positions)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        with torch.no_grad(), forward_metadata(None):
            assert not torch.allclose(got, eager(h, step.positions), rtol=1e-3, atol=1e-3)


def test_rejects_what_it_cannot_fuse(unique_name):
    layout = ConvStateLayout.build(num_kv_heads=4, head_dim=8, hidden_size=32, kernel_size=4, tp_size=2)
    owner = ConvStateOwner(layout, unique_name())
    with pytest.raises(ValueError, match="RMSNorm needs the whole row"):
        InklingShortConvAddRMSNorm(16, 4, owner, Stream.ATTN)
    full = ConvStateOwner(ConvStateLayout.build(num_kv_heads=4, head_dim=8, hidden_size=32, kernel_size=4),
                          unique_name())
    with pytest.raises(ValueError, match="use InklingShortConv for K and V"):
        InklingShortConvAddRMSNorm(32, 4, full, Stream.K)
    with pytest.raises(ValueError, match="dim"):
        InklingShortConvAddRMSNorm(24, 4, full, Stream.MLP)
    with pytest.raises(ValueError, match="eps"):
        InklingShortConvAddRMSNorm(32, 4, full, Stream.MLP, eps=-1.0)
    fused = InklingShortConvAddRMSNorm(32, 4, full, Stream.MLP)
    with pytest.raises(ValueError, match="norm weight must have shape"):
        fused.load_norm_weight(torch.ones(16))
    with pytest.raises(ValueError, match="hidden must have"):
        fused(torch.randn(3, 32), torch.randn(2, 32), torch.arange(2))
    with pytest.raises(TypeError, match="one activation dtype"):
        fused(torch.randn(2, 32).double(), torch.randn(2, 32), torch.arange(2))


def test_weight_is_channel_contiguous_and_loads(unique_name):
    """The conv weight keeps the checkpoint's (dim, 1, W) shape but is stored
    channel-contiguous (vector loads in the kernel); loading and state_dict keep it so."""
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=32, kernel_size=4)
    fused = InklingShortConvAddRMSNorm(32, 4, ConvStateOwner(layout, unique_name()), Stream.MLP)
    assert fused.conv.weight.shape == (32, 1, 4) and fused.conv.weight.stride(0) == 1
    w = torch.randn(32, 1, 4)
    fused.load_weight(w)
    assert torch.equal(fused.conv.weight, w) and fused.conv.weight.stride(0) == 1
    other = InklingShortConvAddRMSNorm(32, 4, ConvStateOwner(layout, unique_name()), Stream.MLP)
    other.load_state_dict(fused.state_dict())
    assert torch.equal(other.conv.weight, w) and other.conv.weight.stride(0) == 1
    assert set(fused.state_dict()) == {"conv.weight", "norm_weight"}


def test_fused_layer_passes_the_step_map(unique_name, monkeypatch):
    """With a tap map in the metadata the fused layer hands it to the fused op (the
    CUDA kernel then skips its own tap resolution); without one it passes None. The
    outputs are the same either way (the kernels' tests check the mapped kernel)."""
    import inkling_model.fused_norm as fused_norm_module

    seen = []
    real = fused_norm_module.fused_sconv_add_rmsnorm

    def spy(*args, **kwargs):
        seen.append(args[4].tap_map)  # (hidden, d, weight, cache, batch, ...)
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_norm_module, "fused_sconv_add_rmsnorm", spy)
    torch.manual_seed(5)
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=32, kernel_size=4)
    weight, hidden, d = torch.randn(32, 1, 4) * 0.5, torch.randn(14, 32), torch.randn(14, 32)
    results = {}
    for with_map in (True, False):
        owner = ConvStateOwner(layout, unique_name())
        fused = InklingShortConvAddRMSNorm(32, 4, owner, Stream.ATTN, eps=1e-6)
        fused.load_weight(weight)
        runtime = PagedConvRuntime(num_blocks=32, block_size=4, sliding_window=4, max_num_tokens=64,
                                   tap_map=with_map)
        runtime.allocate_caches([owner], torch.float32, fill=float("nan"))
        step = runtime.step([("a", 0, 7), ("b", 0, 5)], pad_to=14)
        seen.clear()
        with torch.no_grad(), forward_metadata(step.metadata):
            results[with_map] = fused(hidden, d, step.positions)
        assert len(seen) == 1
        if with_map:
            assert seen[0] is step.metadata.tap_map and tuple(seen[0].shape) == (14, 3)
        else:
            assert seen[0] is None
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)
