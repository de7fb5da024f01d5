"""InklingRelAttention over a paged KV cache, step by step, against transformers'
own relative-logit attention math on the whole sequence."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from inkling_model import (
    AttentionCacheOwner,
    InklingRelAttention,
    RelAttentionMetadata,
    forward_metadata,
)

SEED = 1234


def _transformers_attention(q, k, v, r, proj, *, window, log_scaling):
    """One sequence through transformers' InklingRelativeLogits + eager attention
    (q [T, Hq, Dh], k/v [T, Hkv, Dh], r [T, Hq, d_rel]); the log scaling applied as
    transformers' InklingAttention.forward does."""
    from transformers.models.inkling import modeling_inkling as mi

    tokens, heads, head_dim = q.shape
    rel = mi.InklingRelativeLogits(proj.shape[0], proj.shape[1])
    rel.proj.data.copy_(proj)
    pos = torch.arange(tokens)
    bias = rel(r[None], pos, pos)  # [1, H, T, T]
    query = q.transpose(0, 1)[None]
    if log_scaling is not None:
        n_floor, alpha = log_scaling
        tau = (1.0 + alpha * torch.log(((pos + 1).float() / n_floor).clamp(min=1.0))).view(1, 1, -1, 1)
        query = query * tau
        bias = bias * tau
    d = pos[:, None] - pos[None, :]
    allowed = d >= 0
    if window is not None:
        allowed &= d < window
    mask = torch.zeros(tokens, tokens).masked_fill(~allowed, float("-inf"))[None, None]
    module = SimpleNamespace(num_key_value_groups=heads // k.shape[1], training=False)
    out, _ = mi.eager_attention_forward(
        module, query, k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask, 1.0 / head_dim, position_bias=bias
    )
    return out[0]  # [T, H, Dh]


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize(
    "name,window,extent,log_scaling,block_size,chunks",
    [
        ("sliding", 6, 6, None, 4, [9, 1, 1, 5, 1]),
        ("global, log scaling", None, 12, (3, 0.4), 3, [7, 1, 6, 1, 1]),
        ("global, extent past the context", None, 64, (2, 0.25), 5, [13, 2, 1]),
    ],
)
def test_paged_steps_match_transformers(
    name, window, extent, log_scaling, block_size, chunks, backend, monkeypatch
) -> None:
    """Both paths of the op: PyTorch (the CPU default) and the Triton kernels (the GPU
    path, here under the interpreter, given device metadata as an engine does)."""
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", backend)
    launches = []
    if backend == "triton":
        from inkling_kernels.rel_attention import kernel

        for fn_name in ("paged_rel_attention_triton", "write_kv_triton"):
            original = getattr(kernel, fn_name)

            def counted(*args, _original=original, _name=fn_name, **kwargs):
                launches.append(_name)
                return _original(*args, **kwargs)

            monkeypatch.setattr(kernel, fn_name, counted)
    gen = torch.Generator().manual_seed(SEED)
    heads, kv_heads, head_dim, d_rel = 4, 2, 16, 3
    total = sum(chunks)
    q = torch.randn(total, heads, head_dim, generator=gen)
    k = torch.randn(total, kv_heads, head_dim, generator=gen)
    v = torch.randn(total, kv_heads, head_dim, generator=gen)
    r = torch.randn(total, heads, d_rel, generator=gen)
    proj = torch.randn(d_rel, extent, generator=gen)
    want = _transformers_attention(q, k, v, r, proj, window=window, log_scaling=log_scaling)

    owner = AttentionCacheOwner(
        f"test-attn-{name}", num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        window=window, log_scaling=log_scaling, replace=True,
    )
    # the Triton path runs compiled on a GPU, interpreted on the CPU otherwise
    dev = torch.device("cuda" if backend == "triton" and torch.cuda.is_available() else "cpu")
    layer = InklingRelAttention(owner, d_rel, extent, device=dev)
    layer.load_rel_proj(proj.to(dev))
    num_blocks = math.ceil(total / block_size) + 3
    owner.bind_cache(torch.full((num_blocks, kv_heads, block_size, 2 * head_dim), float("nan"), device=dev))
    # a shuffled block table: logical block i lives in physical block blocks[i]
    blocks = torch.randperm(num_blocks, generator=gen)[: math.ceil(total / block_size)]
    got = []
    start = 0
    for n in chunks:
        pos = torch.arange(start, start + n)
        slots = blocks[pos // block_size] * block_size + pos % block_size
        meta = RelAttentionMetadata(
            block_table=blocks[None].to(dev, torch.int32),
            slot_mapping=slots.to(dev),
            query_start_loc_cpu=torch.tensor([0, n]),
            seq_lens_cpu=torch.tensor([start + n]),
            block_size=block_size,
        )
        if backend == "triton" and start > 0:  # device copies, as an engine passes them
            meta = dataclasses.replace(
                meta, query_start_loc=meta.query_start_loc_cpu.to(dev, torch.int32),
                seq_lens=meta.seq_lens_cpu.to(dev, torch.int32), max_seq_len=start + n,
            )
        with forward_metadata(meta):
            out = layer(*(x[start : start + n].reshape(n, -1).to(dev) for x in (q, k, v, r)), pos.to(dev))
        got.append(out.reshape(n, heads, head_dim).cpu())
        start += n
    got_all = torch.cat(got)
    err = (got_all - want).abs().max().item()
    assert err < 1e-5, f"{name}, {backend} (seed {SEED}): max error {err:.2e} against transformers"
    assert launches == (["write_kv_triton", "paged_rel_attention_triton"] * len(chunks) if backend == "triton" else [])
    # the cache holds exactly what was written, K then V per token and head
    key_cache, value_cache = (c.cpu() for c in owner.kv_views())
    pos = torch.arange(total)
    assert torch.equal(key_cache[blocks[pos // block_size], pos % block_size], k)
    assert torch.equal(value_cache[blocks[pos // block_size], pos % block_size], v)


def test_no_metadata_gives_zeros_and_bad_caches_are_refused() -> None:
    owner = AttentionCacheOwner("test-attn-unbound", num_heads=2, num_kv_heads=1, head_dim=8, replace=True)
    layer = InklingRelAttention(owner, 2, 5)
    x = torch.randn(3, 16)
    out = layer(x, torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 4), torch.arange(3))
    assert torch.equal(out, torch.zeros_like(out))  # profiling pass: no cache, no metadata
    with pytest.raises(ValueError, match="2 x 8"):
        owner.bind_cache(torch.zeros(4, 1, 2, 8))
    with pytest.raises(ValueError, match="1 KV heads"):
        owner.bind_cache(torch.zeros(4, 2, 2, 16))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        AttentionCacheOwner("test-attn-bad", num_heads=3, num_kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match=r"\[d_rel, extent\]"):
        layer.load_rel_proj(torch.zeros(2, 6))


def test_metadata_for_another_block_size_is_refused() -> None:
    owner = AttentionCacheOwner("test-attn-bs", num_heads=2, num_kv_heads=1, head_dim=8, replace=True)
    layer = InklingRelAttention(owner, 2, 5)
    owner.bind_cache(torch.zeros(4, 1, 3, 16))
    meta = RelAttentionMetadata(
        block_table=torch.zeros(1, 4, dtype=torch.int32), slot_mapping=torch.arange(2),
        query_start_loc_cpu=torch.tensor([0, 2]), seq_lens_cpu=torch.tensor([2]), block_size=4,
    )
    with forward_metadata(meta), pytest.raises(ValueError, match="block size 4"):
        layer(torch.randn(2, 16), torch.randn(2, 8), torch.randn(2, 8), torch.randn(2, 4), torch.arange(2))


def test_compiled_layer_matches_eager() -> None:
    """The custom op hides the host-side request walk from torch.compile: a graph
    traced once reads the metadata of each later call."""
    gen = torch.Generator().manual_seed(SEED + 1)
    owner = AttentionCacheOwner("test-attn-compile", num_heads=2, num_kv_heads=2, head_dim=8, replace=True)
    layer = InklingRelAttention(owner, 2, 7)
    layer.load_rel_proj(torch.randn(2, 7, generator=gen))
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    outs = []
    for fn in (layer, compiled):
        owner.bind_cache(torch.zeros(6, 2, 4, 16))
        q, k, v, r = (torch.randn(5, n, generator=torch.Generator().manual_seed(SEED + 2)) for n in (16, 16, 16, 4))
        meta = RelAttentionMetadata(
            block_table=torch.tensor([[2, 0, 5]], dtype=torch.int32),
            slot_mapping=torch.tensor([8, 9, 10, 11, 0]),
            query_start_loc_cpu=torch.tensor([0, 5]), seq_lens_cpu=torch.tensor([5]), block_size=4,
        )
        with forward_metadata(meta):
            outs.append(fn(q, k, v, r, torch.arange(5)))
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
    assert outs[0].abs().sum() > 0
