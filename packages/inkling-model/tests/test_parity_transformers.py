"""Parity with transformers' Inkling (the reference implementation, >= 5.14).

(a) ``InklingShortConvolution`` with its own cache (prefill, then token-by-token
decode) and without one (the full sequence) against ``InklingShortConv`` driven
through the paged runtime: arbitrary chunking, several sequences per batch,
speculative rounds with rejections, preemption/recompute, pad rows.

(b) A whole ``InklingDecoderLayer``: its four conv streams' inputs and outputs are
captured with hooks; the weights are loaded from the layer's state_dict under
transformers' names; TP degrees 1, 2 and 4 shard the same weights and inputs, and the
ranks' outputs reassembled must equal the unsharded result.
"""

from __future__ import annotations

import pytest
import torch

from transformers.cache_utils import DynamicCache
from transformers.models.inkling.configuration_inkling import InklingTextConfig
from transformers.models.inkling.modeling_inkling import InklingDecoderLayer, InklingShortConvolution

from inkling_cache import ConvStateLayout, Stream
from inkling_model import ConvStateOwner, InklingShortConv, PagedConvRuntime
from hf_tiny import tiny_text_config
from model_test_driver import Feed, run_schedule

TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    # One bf16 rounding of the fp32 result; the two sides only sum in another order.
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
}

# The stream names transformers gives the four convs of a decoder layer.
HF_STREAM_NAMES = {
    Stream.K: "self_attn.k_sconv",
    Stream.V: "self_attn.v_sconv",
    Stream.ATTN: "attn_sconv",
    Stream.MLP: "mlp_sconv",
}


def hf_conv_cached(conv: InklingShortConvolution, x: torch.Tensor, prefill: int, cfg: InklingTextConfig) -> torch.Tensor:
    """transformers' own cache: prefill ``prefill`` tokens, then decode one by one."""
    cache = DynamicCache(config=cfg)
    outs = [conv(x[None, :prefill], cache=cache)[0]]
    for t in range(prefill, x.shape[0]):
        outs.append(conv(x[None, t : t + 1], cache=cache)[0])
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("stream", "block_size"),
    [(Stream.K, 4), (Stream.ATTN, 16), (Stream.MLP, 3)],
    ids=["K-N4", "ATTN-N16", "MLP-N3"],
)
def test_short_conv_matches_transformers(dtype, stream, block_size, unique_name):
    torch.manual_seed(0)
    cfg = tiny_text_config()
    width = 4
    layout = ConvStateLayout.build(num_kv_heads=4, head_dim=8, hidden_size=32, kernel_size=width)
    owner = ConvStateOwner(layout, unique_name())
    dim = layout.stream_dim(stream)
    hf = InklingShortConvolution(dim, width, layer_idx=0, conv_idx=int(stream))
    with torch.no_grad():
        hf.conv1d.weight.normal_(0.0, 0.5)
    ours = InklingShortConv(dim, width, owner, stream)
    ours.load_weight(hf.state_dict()["conv1d.weight"])

    lengths = [1, 2, 7, 19, 33, 40]
    xs = [(torch.randn(n, dim) * 2).to(dtype) for n in lengths]
    with torch.no_grad():
        hf_full = [hf(x[None])[0] for x in xs]
        hf_cached = [hf_conv_cached(hf, x, max(1, n // 3), cfg) for x, n in zip(xs, lengths)]
    for a, b in zip(hf_full, hf_cached):
        torch.testing.assert_close(b, a, **TOL[dtype])  # the reference agrees with itself

    runtime = PagedConvRuntime(
        num_blocks=64, block_size=block_size, sliding_window=width, max_num_tokens=128, max_blocks_per_req=16
    )
    runtime.allocate_caches([owner], dtype, fill=float("nan"))
    (outs,), stats = run_schedule(runtime, [Feed(ours, xs)], seed=int(stream) * 10 + block_size)
    assert stats.spec_rounds and stats.rejected and stats.preemptions and stats.padded_steps
    assert stats.max_batch > 1 and stats.decodes and stats.prefill_chunks
    for i, (out, full, cached) in enumerate(zip(outs, hf_full, hf_cached)):
        assert out.dtype == dtype
        torch.testing.assert_close(out, full, **TOL[dtype], msg=lambda m: f"sequence {i} vs full: {m}")
        torch.testing.assert_close(out, cached, **TOL[dtype], msg=lambda m: f"sequence {i} vs cached: {m}")
    # Only window-live blocks stay held once every request is done with its steps.
    for i in range(len(lengths)):
        assert len(runtime.live_blocks(i)) <= -(-(width - 1 + 9) // block_size) + 1


def capture_streams(layer: InklingDecoderLayer, hidden: torch.Tensor) -> dict[Stream, tuple[torch.Tensor, torch.Tensor]]:
    """Run the HF layer; return each conv stream's (input, output) as ``[L, C]``."""
    captured: dict[Stream, tuple[torch.Tensor, torch.Tensor]] = {}
    handles = []
    for stream, name in HF_STREAM_NAMES.items():
        module = layer.get_submodule(name)
        assert isinstance(module, InklingShortConvolution)

        def hook(mod, args, kwargs, out, stream=stream):
            captured[stream] = (args[0][0].detach().clone(), out[0].detach().clone())

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            layer(hidden)
    finally:
        for h in handles:
            h.remove()
    assert set(captured) == set(Stream)
    return captured


def global_channels(layout: ConvStateLayout, stream: Stream, rank: int) -> torch.Tensor:
    """Unsharded channel of each of ``rank``'s stream channels, from the layout's
    channel -> (head, d) mapping: K/V heads are KV heads, ATTN/MLP heads are
    ``hph``-wide chunks of the hidden size, and rank ``r`` holds heads
    ``[r*H, (r+1)*H)`` of them."""
    offset, width = layout.stream_range(stream)
    index = []
    for c in range(layout.stream_dim(stream)):
        head, d = layout.channel_to_head(stream, c)
        index.append((rank * layout.num_heads + head) * width + (d - offset))
    return torch.tensor(index)


@pytest.mark.parametrize("layer_idx", [0, 1], ids=["sliding", "global"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decoder_layer_streams_tp(layer_idx, dtype, unique_name):
    torch.manual_seed(layer_idx)
    cfg = tiny_text_config()
    layer = InklingDecoderLayer(cfg, layer_idx)
    with torch.no_grad():
        for name, param in layer.named_parameters():
            param.normal_(0.0, 0.3 if "sconv" in name else 0.2)
    layer = layer.to(dtype)
    for name in HF_STREAM_NAMES.values():  # transformers keeps the conv weights in fp32
        layer.get_submodule(name).float()
    state = layer.state_dict()
    weight_names = {s: f"{n}.conv1d.weight" for s, n in HF_STREAM_NAMES.items()}
    assert all(state[w].dtype == torch.float32 for w in weight_names.values())

    lengths = [13, 27, 5]
    captures = [capture_streams(layer, torch.randn(1, n, cfg.hidden_size).to(dtype)) for n in lengths]
    for cap in captures:
        for stream, (x, y) in cap.items():
            assert x.dtype == dtype and y.dtype == dtype

    for tp_size in (1, 2, 4):
        owners, feeds, index = [], [], {}
        for rank in range(tp_size):
            owner = ConvStateOwner.for_layer(cfg, layer_idx, unique_name(f"rank{rank}.layer{layer_idx}"), tp_size=tp_size)
            assert owner.layout.tp_size == tp_size
            owners.append(owner)
            for stream in Stream:
                dim = owner.stream_dim(stream)
                conv = InklingShortConv(dim, cfg.conv_kernel_size, owner, stream)
                full_weight = state[weight_names[stream]]
                idx = global_channels(owner.layout, stream, rank)
                index[rank, stream] = idx
                if rank % 2 == 0:
                    conv.load_weight(full_weight, tp_rank=rank, tp_size=tp_size)
                else:  # an already-sharded checkpoint tensor
                    conv.load_weight(full_weight[idx].clone(), tp_rank=rank, tp_size=tp_size)
                torch.testing.assert_close(conv.weight, full_weight[idx], rtol=0, atol=0)
                feeds.append(Feed(conv, [cap[stream][0][:, idx] for cap in captures]))
        runtime = PagedConvRuntime(
            num_blocks=48, block_size=cfg.conv_kernel_size, sliding_window=cfg.conv_kernel_size,
            max_num_tokens=128, max_blocks_per_req=16,
        )
        runtime.allocate_caches(owners, dtype, fill=float("nan"))
        outs, _ = run_schedule(runtime, feeds, seed=100 * tp_size + layer_idx)

        f = 0
        gathered = {s: [torch.full_like(cap[s][1], float("nan")) for cap in captures] for s in Stream}
        for rank in range(tp_size):
            for stream in Stream:
                for seq, out in enumerate(outs[f]):
                    gathered[stream][seq][:, index[rank, stream]] = out
                f += 1
        for stream in Stream:
            for seq, cap in enumerate(captures):
                torch.testing.assert_close(
                    gathered[stream][seq], cap[stream][1], **TOL[dtype],
                    msg=lambda m: f"tp {tp_size} {stream.name} seq {seq}: {m}",
                )
