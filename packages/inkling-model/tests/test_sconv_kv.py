"""short_conv_kv: an attention block's K and V convs in one launch, on the column
slices of a fused QKV projection, equal the two-launch path
(``k_sconv(k.contiguous())``, ``v_sconv(v.contiguous())``) step by step: outputs and
caches, on the reference path and on the Triton kernels (interpreted here) with and
without the step's tap map."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inkling_cache import ConvStateLayout, Stream
from inkling_model import ConvStateOwner, InklingShortConv, PagedConvRuntime, forward_metadata, short_conv_kv

HIDDEN, Q_SIZE = 32, 48


class QKVBlock(nn.Module):
    """The K/V part of an Inkling attention block: one fused QKV projection, then the
    K and V convs (``fused``: one launch on the slices; else the two-launch path)."""

    def __init__(self, owner: ConvStateOwner, fused: bool) -> None:
        super().__init__()
        layout = owner.layout
        self.kv_size = layout.stream_dim(Stream.K)
        self.qkv_proj = nn.Linear(HIDDEN, Q_SIZE + 2 * self.kv_size, bias=False)
        self.k_sconv = InklingShortConv(self.kv_size, layout.kernel_size, owner, Stream.K)
        self.v_sconv = InklingShortConv(self.kv_size, layout.kernel_size, owner, Stream.V)
        self.fused = fused

    def forward(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, k, v = self.qkv_proj(h).split([Q_SIZE, self.kv_size, self.kv_size], dim=-1)
        if self.fused:
            assert not k.is_contiguous() or k.shape[0] <= 1  # the slices go in as they are
            return short_conv_kv(self.k_sconv, self.v_sconv, k, v, positions)
        return self.k_sconv(k.contiguous(), positions), self.v_sconv(v.contiguous(), positions)


def _layout() -> ConvStateLayout:
    return ConvStateLayout.build(num_kv_heads=2, head_dim=8, hidden_size=HIDDEN, kernel_size=4)


def _pair(unique_name, dtype: torch.dtype) -> tuple[QKVBlock, QKVBlock]:
    layout = _layout()
    new = QKVBlock(ConvStateOwner(layout, unique_name("kv-fused")), fused=True).to(dtype)
    old = QKVBlock(ConvStateOwner(layout, unique_name("kv-two")), fused=False).to(dtype)
    with torch.no_grad():
        for p in new.parameters():
            p.normal_(0.0, 0.5)
    old.load_state_dict(new.state_dict())
    return new, old


# Prefill (chunked), decode, a speculative round whose two drafts are rejected (the
# next step restarts after the accepted token), a new request; pad rows throughout.
SCHEDULE = [
    [("a", 0, 7), ("b", 0, 3)],
    [("b", 3, 4), ("a", 7, 1)],
    [("a", 8, 3), ("b", 7, 1)],
    [("c", 0, 5), ("a", 9, 1), ("b", 8, 1)],
]


@pytest.mark.parametrize(
    "backend,tap_map,dtype",
    [("reference", None, torch.float32), ("reference", None, torch.bfloat16),
     ("triton", True, torch.bfloat16), ("triton", False, torch.float32)],
    ids=["reference-fp32", "reference-bf16", "triton-map-bf16", "triton-no-map-fp32"],
)
def test_kv_in_one_launch_equals_the_two_launch_path(backend, tap_map, dtype, unique_name, monkeypatch):
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", backend)
    new, old = _pair(unique_name, dtype)
    rt = PagedConvRuntime(num_blocks=32, block_size=4, sliding_window=4, max_num_tokens=24, tap_map=tap_map)
    caches = rt.allocate_caches([new.k_sconv.owner, old.k_sconv.owner], dtype)
    noise = torch.randn(caches[0].shape).to(dtype)  # the same unwritten contents in both
    for cache in caches:
        cache.copy_(noise)
    for chunks in SCHEDULE:
        step = rt.step(chunks, pad_to=sum(n for _, _, n in chunks) + 2)
        assert (step.metadata.tap_map is not None) == bool(tap_map)
        h = torch.randn(step.positions.shape[0], HIDDEN).to(dtype)
        with forward_metadata(step.metadata), torch.no_grad():
            k_new, v_new = new(h, step.positions)
            k_old, v_old = old(h, step.positions)
        assert k_new.is_contiguous() and v_new.is_contiguous()
        assert torch.equal(k_new, k_old) and torch.equal(v_new, v_old)
        assert torch.equal(caches[0], caches[1]), "the caches differ"
        _, k_in, _ = new.qkv_proj(h).split([Q_SIZE, new.kv_size, new.kv_size], dim=-1)
        assert not torch.equal(k_new, k_in)  # the conv ran


def test_without_metadata_it_is_the_identity(unique_name):
    new, _ = _pair(unique_name, torch.float32)
    h = torch.randn(5, HIDDEN)
    with torch.no_grad():
        k_out, v_out = new(h, torch.arange(5))
        _, k, v = new.qkv_proj(h).split([Q_SIZE, new.kv_size, new.kv_size], dim=-1)
    assert k_out.is_contiguous() and torch.equal(k_out, k) and torch.equal(v_out, v)


def test_pairing_errors(unique_name):
    new, old = _pair(unique_name, torch.float32)
    k = v = torch.zeros(3, new.kv_size)
    with pytest.raises(ValueError, match="Stream.K, then of Stream.V"):
        short_conv_kv(new.v_sconv, new.k_sconv, k, v)
    with pytest.raises(ValueError, match="one layer's cache"):
        short_conv_kv(new.k_sconv, old.v_sconv, k, v)
    with pytest.raises(ValueError, match=r"v must be \[num_tokens, 16\]"):
        short_conv_kv(new.k_sconv, new.v_sconv, k, torch.zeros(3, 8))
    with pytest.raises(ValueError, match="one row per token"):
        short_conv_kv(new.k_sconv, new.v_sconv, k, torch.zeros(2, 16))


def test_compiled_block_convolves_after_profiling_pass(unique_name):
    """Traced on a pass without metadata (the identity), the compiled block still
    runs the one-launch op later, equal to the eager two-launch block."""
    torch._dynamo.reset()
    new, old = _pair(unique_name, torch.float32)
    compiled = torch.compile(new, backend="aot_eager", dynamic=True, fullgraph=True)
    with torch.no_grad():
        compiled(torch.randn(6, HIDDEN), torch.arange(6))  # profiling pass
    rt = PagedConvRuntime(num_blocks=32, block_size=4, sliding_window=4, max_num_tokens=24)
    rt.allocate_caches([new.k_sconv.owner, old.k_sconv.owner], torch.float32)
    for chunks in SCHEDULE[:3]:
        step = rt.step(chunks)
        h = torch.randn(step.positions.shape[0], HIDDEN)
        with forward_metadata(step.metadata), torch.no_grad():
            got, want = compiled(h, step.positions), old(h, step.positions)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
