"""The benchmark's peer swap (``inkling_vllm.demo.peer_conv``) computes what the
plugin's conv ops compute: outputs and cache writes of vLLM 0.33.0's ``fused_sconv``
behind the four conv ops, against the project's ops (their CPU reference path), for
decode, prefill and a mixed batch with pad rows. The peer kernel runs in Triton's
interpreter.

Skipped unless the peer module has been extracted into ``.peer/`` at the repository
root (``packages/inkling-kernels/benchmarks/fetch_peer.py``; nothing of vllm's is
committed), or the folder ``INKLING_PEER_DIR`` names.

Triton picks interpreted or compiled mode for its own ``@jit`` helpers when it is first
imported, and vllm imports it compiled; so the comparison runs in a child pytest that
imports Triton with the interpreter on, whatever ran before it in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inkling_cache import ConvStateLayout, Stream
from inkling_model import (
    ConvStateOwner,
    SconvMetadataBuilder,
    forward_metadata,
    paged_short_conv,
    paged_short_conv_add,
    paged_short_conv_add_rmsnorm,
    paged_short_conv_kv,
)

PEER_DIR = Path(os.environ.get("INKLING_PEER_DIR", Path(__file__).resolve().parents[3] / ".peer"))
if not (PEER_DIR / "vllm_sconv_peer.py").is_file():
    pytest.skip(f"no vllm_sconv_peer.py in {PEER_DIR} (fetch_peer.py extracts it)", allow_module_level=True)
pytest.importorskip("numpy")  # Triton's interpreter

#: set in the child pytest that runs the comparison
CHILD = "_INKLING_PEER_CONV_CHILD"


def test_the_peer_comparison_passes_under_the_interpreter():
    env = dict(os.environ, **{CHILD: "1", "TRITON_INTERPRET": "1"})
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                          env=env, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "6 passed" in done.stdout.splitlines()[-1], done.stdout[-2000:]

W = N = 4
EPS = 1e-6

#: (history tokens, new tokens) per request, in batch order; pad rows after them.
STEPS = {
    "decode": ([(5, 1), (0, 1), (13, 1)], 0),
    "prefill": ([(0, 11)], 0),
    "mixed": ([(7, 1), (0, 9), (2, 1), (3, 5)], 3),
}


@pytest.fixture(scope="module")
def swap():
    from inkling_vllm.demo.peer_conv import PeerConv, load_peer

    # Triton reads it when the peer's kernels are decorated and launched: set for this module
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "1")
        yield PeerConv(load_peer(PEER_DIR))


def _step(requests, pad, device="cpu"):
    """A batch of ``requests`` over randomly placed blocks; (batch, query_start_loc, blocks)."""
    spans = [(max(0, h - (W - 1)) // N, (h + n - 1) // N) for h, n in requests]
    num_blocks = 1 + sum(last - first + 1 for first, last in spans)
    perm = (torch.randperm(num_blocks - 1) + 1).tolist()
    table = torch.zeros(len(requests), max(last for _, last in spans) + 1, dtype=torch.int32)
    positions, slots, starts = [], [], [0]
    for r, ((h, n), (first, last)) in enumerate(zip(requests, spans)):
        table[r, first:last + 1] = torch.tensor([perm.pop() for _ in range(last - first + 1)], dtype=torch.int32)
        p = torch.arange(h, h + n)
        positions.append(p)
        slots.append(table[r, p // N].long() * N + p % N)
        starts.append(starts[-1] + n)
    actual = starts[-1]
    positions.append(torch.zeros(pad, dtype=torch.int64))
    slots.append(torch.full((pad,), -1, dtype=torch.int64))
    qsl = torch.tensor(starts, dtype=torch.int32)
    builder = SconvMetadataBuilder(64, device, kernel_size=W)
    batch = builder.build(qsl, torch.cat(slots), table, len(requests), actual, actual + pad, block_size=N,
                          positions=torch.cat(positions))
    return batch, qsl, num_blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_peer_ops_match_the_project_ops(swap, step, dtype):
    requests, pad = STEPS[step]
    layout = ConvStateLayout.build(num_kv_heads=2, head_dim=16, hidden_size=64, kernel_size=W, block_size=N)
    owner = ConvStateOwner(layout, f"peer-test-{step}-{dtype}", replace=True)
    batch, qsl, num_blocks = _step(requests, pad)
    rows = batch.num_tokens
    cache = torch.randn(num_blocks, layout.num_heads, N, layout.head_size).to(dtype)
    kv = owner.stream_dim(Stream.K)
    hidden_dim = owner.stream_dim(Stream.ATTN)
    qkv = torch.randn(rows, 3 * kv).to(dtype)  # k and v as column slices, as the model has them
    k, v = qkv[:, kv:2 * kv], qkv[:, 2 * kv:]
    d, d_mlp, hidden = (torch.randn(rows, hidden_dim).to(dtype) for _ in range(3))
    wk, wv = (0.5 * torch.randn(kv, 1, W) for _ in range(2))
    w_attn = (0.5 * torch.randn(W, hidden_dim)).t().unsqueeze(1)  # tap-major, as the fused tails keep it
    w_mlp = 0.5 * torch.randn(hidden_dim, 1, W)
    norm_weight = (1 + 0.2 * torch.randn(hidden_dim)).to(dtype)
    name = owner.name

    def run():
        with forward_metadata(batch):
            return [*paged_short_conv_kv(k, v, wk, wv, name),
                    *paged_short_conv_add_rmsnorm(hidden, d, w_attn, norm_weight, name, int(Stream.ATTN), EPS),
                    paged_short_conv_add(hidden, d_mlp, w_mlp, name, int(Stream.MLP)),
                    paged_short_conv(d_mlp, w_mlp, name, int(Stream.MLP))]

    owner.bind_cache(cache.clone())
    want = run()
    want_cache = owner.cache
    owner.bind_cache(cache.clone())
    swap.note_step("group", batch, qsl, len(requests), rows - pad, 64)
    launches = swap.launches
    library = swap.register(("CPU",))
    try:
        got = run()
    finally:
        library._destroy()
    assert swap.launches == launches + 1, "the peer's metadata runs once per step"
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=4e-2, rtol=2e-2)
    for what, g, w in zip(["k", "v", "attn hidden", "attn normed", "mlp hidden", "mlp conv"], got, want):
        assert g.shape == w.shape, what
        # pad rows: anything (the engine drops them)
        torch.testing.assert_close(g[: rows - pad].float(), w[: rows - pad].float(), **tol, msg=what)
    assert torch.equal(owner.cache, want_cache), "the peer wrote the cache differently"
    # the project's implementations are back once the library is gone
    owner.bind_cache(cache.clone())
    again = run()
    assert all(torch.equal(a, b) for a, b in zip(again, want))


# the parent runs only the child; the child only the comparison
if os.environ.get(CHILD):
    del test_the_peer_comparison_passes_under_the_interpreter
else:
    del test_peer_ops_match_the_project_ops
