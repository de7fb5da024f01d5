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


# --- argument checks: a clear error before any work ----------------------------------


def _bound_layer(name: str) -> tuple[InklingRelAttention, RelAttentionMetadata]:
    """4 query heads, 2 KV heads of 4, d_rel 2: q [T, 16], k/v [T, 8], r [T, 8]."""
    owner = AttentionCacheOwner(name, num_heads=4, num_kv_heads=2, head_dim=4, replace=True)
    owner.bind_cache(torch.zeros(4, 2, 4, 8))
    meta = RelAttentionMetadata(
        block_table=torch.tensor([[1]], dtype=torch.int32), slot_mapping=torch.tensor([4, 5, 6]),
        query_start_loc_cpu=torch.tensor([0, 3]), seq_lens_cpu=torch.tensor([3]), block_size=4,
    )
    return InklingRelAttention(owner, 2, 6), meta


@pytest.mark.parametrize("with_metadata", [False, True])
@pytest.mark.parametrize(
    "name,shape,match",
    [
        ("q", (3, 12), r"q must be \[3 \(q's rows\), 16\] \(4 heads x 4"),
        ("q", (48,), r"q must be \[num_tokens, 16\]"),
        ("q", (), r"q must be \[num_tokens, 16\]"),
        ("k", (3, 12), r"k must be \[3 \(q's rows\), 8\] \(2 heads x 4"),
        ("k", (2, 8), r"k must be \[3 \(q's rows\), 8\].*got \(2, 8\)"),
        ("v", (2, 8), r"v must be \[3 \(q's rows\), 8\].*got \(2, 8\)"),
        ("v", (4, 8), r"v must be \[3 \(q's rows\), 8\].*got \(4, 8\)"),
        ("r", (3, 6), r"r must be \[3 \(q's rows\), 8\] \(4 heads x 2"),
        ("r", (3, 2, 4), r"r must be \[3 \(q's rows\), 8\]"),
    ],
)
def test_forward_names_an_input_of_the_wrong_shape(name, shape, match, with_metadata) -> None:
    layer, meta = _bound_layer(f"test-attn-shapes-{with_metadata}")
    inputs = dict(q=torch.randn(3, 16), k=torch.randn(3, 8), v=torch.randn(3, 8), r=torch.randn(3, 8))
    inputs[name] = torch.randn(shape)
    cache = layer.owner.cache.clone()
    with forward_metadata(meta if with_metadata else None), pytest.raises(ValueError, match=match):
        layer(**inputs, positions=torch.arange(3))
    assert torch.equal(layer.owner.cache, cache)  # nothing was written


def test_shape_checks_compile_without_breaks_or_recompiles() -> None:
    """The checks are plain shape comparisons: a graph traced with a symbolic token
    count (fullgraph) serves every batch size, and still refuses a bad width."""
    torch._dynamo.reset()
    layer, _ = _bound_layer("test-attn-shapes-compiled")
    layer.load_rel_proj(torch.randn(2, 6))
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="eager")
    for tokens in (3, 5, 2):
        meta = RelAttentionMetadata(
            block_table=torch.tensor([[1, 2]], dtype=torch.int32), slot_mapping=torch.arange(4, 4 + tokens),
            query_start_loc_cpu=torch.tensor([0, tokens]), seq_lens_cpu=torch.tensor([tokens]), block_size=4,
        )
        q, k, v, r = (torch.randn(tokens, n) for n in (16, 8, 8, 8))
        with forward_metadata(meta):
            want = layer(q, k, v, r, torch.arange(tokens))
            with torch._dynamo.config.patch(error_on_recompile=tokens != 3):
                got = compiled(q, k, v, r, torch.arange(tokens))
        torch.testing.assert_close(got, want)
    # (fullgraph=True reports the raise as Dynamo's Unsupported, message included)
    with pytest.raises(ValueError, match=r"k must be \[3 \(q's rows\), 8\]"):
        torch.compile(layer, dynamic=True, backend="eager")(
            torch.randn(3, 16), torch.randn(3, 12), torch.randn(3, 12), torch.randn(3, 8), torch.arange(3))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(log_scaling=0.5), TypeError, r"log_scaling must be None or a tuple \(n_floor, alpha\)"),
        (dict(log_scaling=(1, 2, 3)), TypeError, r"log_scaling must be None or a tuple \(n_floor, alpha\)"),
        (dict(log_scaling=(8, "x")), TypeError, "log_scaling alpha must be a float"),
        (dict(log_scaling=(8, math.nan)), ValueError, "log_scaling alpha must be finite"),
        (dict(log_scaling=(0, 0.5)), ValueError, "log_scaling n_floor must be >= 1"),
        (dict(log_scaling=(2.0, 0.5)), TypeError, "log_scaling n_floor must be an int"),
        (dict(scale=math.nan), ValueError, "scale must be finite"),
        (dict(scale=math.inf), ValueError, "scale must be finite"),
        (dict(scale="x"), TypeError, "scale must be a float"),
    ],
)
def test_owner_checks_log_scaling_and_scale_when_built(kwargs, error, match) -> None:
    from inkling_model import get_attention_owner

    name = f"test-attn-owner-args-{len(kwargs)}-{next(iter(kwargs))}-{kwargs!r}"
    with pytest.raises(error, match=match):
        AttentionCacheOwner(name, num_heads=2, num_kv_heads=1, head_dim=4, **kwargs)
    with pytest.raises(KeyError):
        get_attention_owner(name)  # nothing was registered


def test_owner_keeps_valid_log_scaling_and_scale() -> None:
    owner = AttentionCacheOwner("test-attn-owner-ok", num_heads=2, num_kv_heads=1, head_dim=4,
                                log_scaling=[3, 1], scale=1, replace=True)
    assert owner.log_scaling == (3, 1.0) and isinstance(owner.log_scaling[1], float)
    assert owner.scale == 1.0 and isinstance(owner.scale, float)
    assert AttentionCacheOwner("test-attn-owner-default", num_heads=2, num_kv_heads=1, head_dim=4,
                               replace=True).scale == 0.25


@pytest.mark.parametrize("field", ["block_table", "slot_mapping", "query_start_loc_cpu", "seq_lens_cpu",
                                   "query_start_loc", "seq_lens"])
def test_metadata_fields_must_be_tensors(field) -> None:
    fields = dict(block_table=torch.tensor([[1]], dtype=torch.int32), slot_mapping=torch.tensor([4, 5, 6]),
                  query_start_loc_cpu=torch.tensor([0, 3]), seq_lens_cpu=torch.tensor([3]))
    fields[field] = [0, 3]
    with pytest.raises(TypeError, match=rf"RelAttentionMetadata\.{field} must be a torch\.Tensor"):
        RelAttentionMetadata(**fields, block_size=4)


def test_load_rel_proj_wants_a_tensor() -> None:
    layer, _ = _bound_layer("test-attn-rel-proj-list")
    with pytest.raises(TypeError, match=r"rel_logits_proj\.proj of layer .* must be a torch\.Tensor, got list"):
        layer.load_rel_proj([[0.5] * 6] * 2)
    assert torch.equal(layer.rel_proj, torch.zeros(2, 6))
