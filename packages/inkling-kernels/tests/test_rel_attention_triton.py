"""The Triton paged relative-logit attention against the dense reference and the
PyTorch path.

Small worlds (``test_rel_attention.build_world``: shuffled pages, every slot the op
may not read NaN, blocks below the window pointing at a NaN null block) run under
Triton's interpreter on CPU and compiled on a GPU. The ``GPU-only`` section (skipped
without CUDA) runs Inkling 975B shapes (64 query heads, 8 or 16 KV heads, head dim
128, d_rel 16) against the PyTorch path on the Inkling cache layout
(``[num_blocks, Hkv, N, 2 * Dh]`` pages), plus CUDA-graph replay.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from inkling_kernels.rel_attention import paged_rel_attention, paged_rel_attention_triton, rel_attention_uses_triton
from inkling_kernels.rel_attention import kernel as rel_kernel
from inkling_kernels.rel_attention.kernel import (
    RelAttentionConfig,
    RelAttentionProblem,
    check_paged_rel_attention_triton_args,
    choose_rel_attention_config,
)

from test_rel_attention import LAYERS, METADATA_BAD, World, _check_close, build_world

# decode at long context, prefill, spec verify, chunked prefill, no rows, short verify
MIX = [(40, 1), (0, 17), (25, 4), (33, 12), (12, 0), (6, 5)]

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CUDA = DEV.type == "cuda"


def _gp(group: int) -> int:
    return 1 << max(0, (group - 1).bit_length())


def _cfg(group: int, block_n: int, splits: int = 1, bias: str = "band", **kw: Any) -> RelAttentionConfig:
    # 16 tile rows: the interpreter's cost is per program, and tl.dot needs >= 16 on GPU
    return RelAttentionConfig(block_q=max(1, 16 // _gp(group)), block_n=block_n, num_splits=splits,
                              bias=bias, min_split_tiles=1, **kw)


def _on(w: World, dev: torch.device) -> World:
    """The world with every tensor the op reads moved to ``dev`` (cache views kept)."""
    storage = w.storage.to(dev)

    def view(t: torch.Tensor) -> torch.Tensor:
        return storage.as_strided(t.shape, t.stride(), t.storage_offset())

    moved = {k: getattr(w, k).to(dev) for k in ("q", "r", "rel_proj", "positions", "block_table")}
    return World(**{**w.__dict__, **moved, "storage": storage, "key_cache": view(w.key_cache),
                    "value_cache": view(w.value_cache)})


def _run(w: World, config: RelAttentionConfig | None = None, *, device_meta: bool = True,
         out: torch.Tensor | None = None) -> torch.Tensor:
    qsl, sl = w.query_start_loc, w.seq_lens
    if device_meta:
        qsl, sl = qsl.to(w.q.device), sl.to(w.q.device)
    return paged_rel_attention_triton(
        w.q, w.r, w.rel_proj, w.key_cache, w.value_cache, w.positions, w.block_table, qsl, sl,
        **w.kwargs(), out=out, config=config,
    )


# --- small worlds: interpreter on CPU, compiled on GPU ------------------------------


@pytest.mark.parametrize("variant", ["band", "band-split", "diag-split"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_matches_reference(layer: str, variant: str) -> None:
    seed = 2000 + 31 * list(LAYERS).index(layer) + {"band": 0, "band-split": 7, "diag-split": 13}[variant]
    if variant == "band":  # [2, nb, N, Hkv, Dh] views, one split, tiles span pages
        w = build_world(seed=seed, mix=MIX, layer=layer, group=2, n=16)
        cfg = _cfg(2, block_n=32, near_block_n=16)
    elif variant == "band-split":  # [nb, 2, N, Hkv, Dh] views, N = 3, keys split 3 ways
        w = build_world(seed=seed, mix=MIX, layer=layer, group=2, n=3, layout="split1")
        cfg = _cfg(2, block_n=16, splits=3)
    else:  # block-diagonal bias MMA; N = 5 (tiles across pages), near tiles half the far ones, 2 splits
        w = build_world(seed=seed, mix=MIX, layer=layer, group=2, n=5)
        cfg = _cfg(2, block_n=32, splits=2, bias="diag", near_block_n=16)
    want = w.reference()
    d = _on(w, DEV)
    out = torch.full_like(d.q, float("nan"))  # every row must be written (pad rows: zeros)
    got = _run(d, cfg, out=out)
    assert got is out, f"seed {seed}: out= must be returned"
    assert torch.equal(got[w.num_rows:].cpu(), torch.zeros_like(want[w.num_rows:])), f"seed {seed}: pad rows"
    _check_close(got.cpu(), want, torch.float32, f"seed {seed} {layer} {variant}")


@pytest.mark.parametrize(
    ("dtype", "group", "layer", "n"),
    [(torch.bfloat16, 4, "global_log", 16), (torch.float16, 1, "sliding_small", 5),
     (torch.float32, 3, "global_log", 4)],
    ids=["bf16-g4", "fp16-g1", "fp32-g3"],
)
def test_dtypes_groups_default_config(dtype: torch.dtype, group: int, layer: str, n: int) -> None:
    seed = 2100 + group
    w = build_world(seed=seed, mix=MIX, layer=layer, group=group, n=n, dtype=dtype)
    d = _on(w, DEV)
    before = d.storage.clone()
    got = _run(d)  # choose_rel_attention_config
    _check_close(got.cpu(), w.reference(), dtype, f"seed {seed} {dtype} group {group}")
    # the op only reads the cache
    bits = {torch.float32: torch.int32}.get(dtype, torch.int16)
    assert torch.equal(d.storage.view(bits), before.view(bits)), f"seed {seed}: cache changed"


@pytest.mark.parametrize(
    ("dtype", "group", "layer", "n", "block_q"),
    [(torch.bfloat16, 8, "global_log", 16, 2), (torch.float32, 3, "sliding_small", 4, 4),
     (torch.float16, 1, "global_plain", 8, 16), (torch.bfloat16, 5, "global_log", 4, 2)],
    ids=["bf16-g8", "fp32-g3-sliding", "fp16-g1-bq16", "bf16-g5-bq2"],
)
def test_diag_bias_dtypes_groups(dtype: torch.dtype, group: int, layer: str, n: int, block_q: int) -> None:
    """``bias="diag"`` (the near tiles' bias as one block-diagonal MMA) on 16-bit and
    fp32 inputs, GQA groups 8, 1 and not powers of two (3, 5: padded tile rows), one
    to 16 queries a tile (MMA depth ``block_q * 16``), pad rows."""
    seed = 2120 + 10 * group + block_q
    w = build_world(seed=seed, mix=MIX, layer=layer, group=group, n=n, dtype=dtype)
    want = w.reference()
    d = _on(w, DEV)
    cfg = RelAttentionConfig(block_q=block_q, block_n=16, bias="diag", min_split_tiles=1)
    got = _run(d, cfg, out=torch.full_like(d.q, float("nan")))
    assert torch.equal(got[w.num_rows:].cpu(), torch.zeros_like(want[w.num_rows:])), f"seed {seed}: pad rows"
    _check_close(got.cpu(), want, dtype, f"seed {seed} diag {dtype} group {group} block_q {block_q}")


@pytest.mark.parametrize(
    ("dtype", "group", "layer", "n", "splits", "mix"),
    [(torch.float32, 2, "global_log", 16, 1, MIX), (torch.bfloat16, 4, "sliding_small", 5, 3, MIX),
     (torch.float16, 3, "global_plain", 4, 2, [(40, 1), (7, 1), (0, 1), (29, 1)]),
     (torch.float32, 16, "sliding_small", 8, 1, [(33, 1), (12, 1)])],
    ids=["fp32-g2-mixed", "bf16-g4-sliding-split3", "fp16-g3-decode-split2", "fp32-g16-sliding-decode"],
)
def test_row_bias_one_position_a_tile(dtype: torch.dtype, group: int, layer: str, n: int, splits: int,
                                      mix: list[tuple[int, int]]) -> None:
    """``bias="row"``: one query row a block (``block_q=1``; the tile rows past the
    group's heads are padding), its bias one MMA at a single distance per key; exact
    on any batch (prefill, chunked, spec verify, decode), with key splits and pad rows."""
    seed = 2160 + 10 * group + splits
    w = build_world(seed=seed, mix=mix, layer=layer, group=group, n=n, dtype=dtype)
    want = w.reference()
    d = _on(w, DEV)
    cfg = RelAttentionConfig(block_q=1, block_n=16, bias="row", num_splits=splits, min_split_tiles=1)
    got = _run(d, cfg, out=torch.full_like(d.q, float("nan")))
    assert torch.equal(got[w.num_rows:].cpu(), torch.zeros_like(want[w.num_rows:])), f"seed {seed}: pad rows"
    _check_close(got.cpu(), want, dtype, f"seed {seed} row {dtype} group {group} splits {splits}")


@pytest.mark.parametrize(
    ("scale", "log_scaling", "bias"),
    [(-6.0, None, "diag"), (-6.0, None, "row"), (6.0, (1, -0.6), "band"),
     (0.3, None, "diag"), (0.3, (4, 0.5), "row"), (0.3, (4, 0.5), "band")],
    ids=["negative-scale-diag", "negative-scale-row", "tau-below-zero-band",
         "scale-not-a-power-of-two-diag", "scale-not-a-power-of-two-row", "scale-not-a-power-of-two-band"],
)
def test_scores_with_a_coefficient_at_or_below_zero(scale: float, log_scaling: Any, bias: str) -> None:
    """Where every row's coefficient (scale x tau) is positive the kernel takes a row's
    maximum before scaling it (exact then); a negative scale, or a log-scaling alpha
    that takes tau below zero at later positions, must scale first. Scores here spread
    over hundreds of log2 units, so a maximum taken on the wrong side overflows the
    softmax. A scale that is not a power of two keeps the bias MMA on the scaled
    scores (the other worlds' 1 / head_dim divides ``r`` by it instead)."""
    w = build_world(seed=2190, mix=MIX, layer="global_plain", group=2, n=8)
    w = World(**{**w.__dict__, "scale": scale, "log_scaling": log_scaling})
    want = w.reference()
    assert torch.isfinite(want).all()
    block_q = 1 if bias == "row" else 4
    cfg = RelAttentionConfig(block_q=block_q, block_n=16, bias=bias, min_split_tiles=1)
    got = _run(_on(w, DEV), cfg)
    _check_close(got.cpu(), want, torch.float32, f"scale {scale} log_scaling {log_scaling} {bias}")


@pytest.mark.parametrize("bias", ["diag", "row", "band"])
def test_dividing_r_by_a_power_of_two_scale_changes_no_bit(monkeypatch: pytest.MonkeyPatch, bias: str) -> None:
    """With ``scale`` a power of two the near tiles' bias MMAs accumulate onto the
    unscaled scores and ``r`` comes divided by ``scale``: bit for bit the scores of
    scaling first (every product and sum only moves by a power of two)."""
    w = build_world(seed=2195, mix=MIX, layer="global_log", group=2, n=8, dtype=torch.bfloat16)
    assert math.frexp(w.scale)[0] == 0.5
    block_q = 1 if bias == "row" else 4
    cfg = RelAttentionConfig(block_q=block_q, block_n=16, bias=bias, min_split_tiles=1)
    d = _on(w, DEV)
    folded = _run(d, cfg)
    monkeypatch.setattr(rel_kernel, "_exact_inverse", lambda scale: False)
    assert torch.equal(_run(d, cfg), folded)
    _check_close(folded.cpu(), w.reference(), torch.bfloat16, f"folded scale, {bias}")


def test_fp16_r_is_not_divided_by_the_scale() -> None:
    """fp16 ``r`` of magnitude 100 divided by a scale of 2^-10 would overflow fp16
    (inf, then NaN scores): the kernel scales the scores instead for fp16."""
    w = build_world(seed=2196, mix=MIX, layer="global_plain", group=2, n=8, dtype=torch.float16)
    w = World(**{**w.__dict__, "scale": 2.0 ** -10, "r": (w.r.float() * 100).to(torch.float16)})
    want = w.reference()
    got = _run(_on(w, DEV), RelAttentionConfig(block_q=4, block_n=16, bias="diag", min_split_tiles=1))
    _check_close(got.cpu(), want, torch.float16, "fp16 r, scale 2^-10")


@pytest.mark.parametrize("near_cost", [1, 3, 9])
def test_cost_weighted_key_splits(near_cost: int) -> None:
    """Key splits share a block's cost with near tiles weighted: every split boundary
    (some splits empty, boundaries inside the near band) must still cover each key
    tile exactly once."""
    seed = 2150 + near_cost
    w = build_world(seed=seed, mix=[(57, 1), (40, 2), (3, 1)], layer="global_log", group=2, n=4)
    got = _run(_on(w, DEV), _cfg(2, block_n=16, splits=5, near_cost=near_cost))
    _check_close(got.cpu(), w.reference(), torch.float32, f"seed {seed} near_cost {near_cost}")


def test_launch_options_pdl_and_register_cap() -> None:
    """``pdl`` and ``max_registers`` (the few-request decode default on CUDA): the same
    results as the reference. Compiled on a GPU they change the launch (overlap) and
    the register allocation (spills); under the interpreter they are ignored."""
    seed = 2160
    w = build_world(seed=seed, mix=[(61, 1), (40, 2), (3, 1)], layer="global_log", group=4, n=4)
    cfg = _cfg(4, block_n=16, splits=5, near_cost=3, pdl=True, max_registers=64, flat_grid=True)
    got = _run(_on(w, DEV), cfg, out=torch.full_like(w.q, float("nan"), device=DEV))
    _check_close(got.cpu(), w.reference(), torch.float32, f"seed {seed} pdl + register cap")


@pytest.mark.parametrize(
    ("flat", "splits", "group", "layer"),
    [(True, 3, 4, "global_log"), (False, 7, 2, "sliding_small"), (True, 5, 4, "global_log"),
     (True, 2, 1, "global_plain")],
    ids=["flat-s3-g4", "s7-g2-sliding", "flat-s5-g4", "flat-s2-g1"],
)
def test_split_combine(flat: bool, splits: int, group: int, layer: str) -> None:
    """Key splits (any count, not only powers of two) merged by the combine launch:
    against the reference, on a batch whose blocks use 1..splits splits (long decode,
    spec verify, prefill, pad rows); a second call with other contexts (other split
    counts per block) must be right too."""
    seed = 2170 + splits + 10 * group
    cfg = _cfg(group, block_n=16 if CUDA else 8, splits=splits, flat_grid=flat)
    for step, mix in enumerate(([(61, 1), (30, 4), (0, 9), (7, 1)], [(13, 1), (70, 4), (2, 9), (44, 1)])):
        w = build_world(seed=seed + step, mix=mix, layer=layer, group=group, n=4)
        want = w.reference()
        d = _on(w, DEV)
        out = torch.full_like(d.q, float("nan"))
        got = _run(d, cfg, out=out)
        assert torch.equal(got[w.num_rows:].cpu(), torch.zeros_like(want[w.num_rows:])), f"seed {seed}: pad rows"
        _check_close(got.cpu(), want, torch.float32, f"seed {seed + step} splits {splits}")


@pytest.mark.parametrize(
    ("layer", "bias", "far_q", "dtype", "tma"),
    [("global_log", "diag", 16, torch.float32, False), ("global_plain", "band", 32, torch.float32, False),
     ("global_log", "diag", 8, torch.bfloat16, False), ("global_log", "diag", 16, torch.bfloat16, True),
     ("sliding_small", "diag", 16, torch.float32, False)],
    ids=["log-diag-2x", "plain-band-4x", "log-diag-1x-bf16", "log-diag-2x-bf16-tma", "sliding-no-far-pass"],
)
def test_far_tiles_in_their_own_launch(layer: str, bias: str, far_q: int, dtype: torch.dtype, tma: bool) -> None:
    """``far_block_q``: the far tiles run in a second launch of larger query blocks,
    merged with the first launch's result (the near tiles, and the far tiles of the
    smaller blocks that the larger block leaves). Against the reference on prefill,
    chunked prefill, decode and empty requests with pad rows, the output buffer
    starting as NaN. ``tma``: the far tiles through TMA descriptors on an SM 9.0+ GPU."""
    group = 2
    block_q = 16 // _gp(group)
    cfg = RelAttentionConfig(block_q=block_q, block_n=8 if DEV.type == "cpu" else 16, bias=bias,
                             min_split_tiles=1, far_block_q=far_q, tma=tma)
    mixes = ([(40, 1), (0, 37), (25, 20), (3, 12), (12, 0), (6, 5)], [(7, 33), (51, 9), (0, 1), (30, 2)])
    for step, mix in enumerate(mixes):
        seed = 2230 + far_q + step
        w = build_world(seed=seed, mix=mix, layer=layer, group=group, n=16, dtype=dtype)
        want = w.reference()
        d = _on(w, DEV)
        got = _run(d, cfg, out=torch.full_like(d.q, float("nan")))
        assert torch.equal(got[w.num_rows:].cpu(), torch.zeros_like(want[w.num_rows:])), f"seed {seed}: pad rows"
        _check_close(got.cpu(), want, dtype, f"seed {seed} {layer} {bias} far_block_q {far_q}")


@pytest.mark.parametrize(("layer", "bias", "splits", "dtype"),
                         [("global_log", "diag", 1, torch.bfloat16), ("global_plain", "band", 3, torch.float16)],
                         ids=["diag-bf16", "band-split-fp16"])
def test_far_tiles_through_tma(layer: str, bias: str, splits: int, dtype: torch.dtype) -> None:
    """``tma``: on an SM 9.0+ GPU the far tiles load K and V through TMA descriptors of
    the caches (elsewhere the pointer path); page-sized key tiles, against the reference."""
    group = 2
    cfg = RelAttentionConfig(block_q=16 // _gp(group), block_n=16, bias=bias, num_splits=splits,
                             min_split_tiles=1, tma=True)
    for step, mix in enumerate(([(40, 1), (0, 37), (25, 20), (3, 12), (12, 0), (6, 5)], [(70, 3), (51, 9)])):
        seed = 2260 + splits + step
        w = build_world(seed=seed, mix=mix, layer=layer, group=group, n=16, dtype=dtype)
        got = _run(_on(w, DEV), cfg)
        _check_close(got.cpu(), w.reference(), dtype, f"seed {seed} {layer} tma")


@pytest.mark.parametrize(("far_q", "splits"), [(16, 1), (None, 3)], ids=["far-launch", "single-split"])
def test_tma_descriptor_loads_on_any_device(monkeypatch: pytest.MonkeyPatch, far_q: int | None, splits: int) -> None:
    """The TMA path's descriptors, coordinates and tile reshapes against the reference
    on any device: the interpreter runs descriptor loads too once the launcher is told
    the caches allow them (on a GPU this is the real TMA path)."""
    monkeypatch.setattr(rel_kernel, "_tma_ok", lambda *args: True)
    group = 2
    cfg = RelAttentionConfig(block_q=16 // _gp(group), block_n=8 if DEV.type == "cpu" else 16, bias="diag",
                             num_splits=splits, min_split_tiles=1, far_block_q=far_q, tma=True)
    for step, mix in enumerate(([(40, 1), (0, 37), (25, 20), (3, 12), (6, 5)], [(70, 3), (51, 9)])):
        seed = 2270 + splits + step
        w = build_world(seed=seed, mix=mix, layer="global_log", group=group, n=16, dtype=torch.bfloat16)
        got = _run(_on(w, DEV), cfg)
        _check_close(got.cpu(), w.reference(), torch.bfloat16, f"seed {seed} tma far_block_q {far_q}")


def test_far_block_q_is_checked() -> None:
    with pytest.raises(ValueError, match="far_block_q .* must be >= block_q"):
        RelAttentionConfig(block_q=8, block_n=16, far_block_q=4)
    with pytest.raises(ValueError, match="power of two"):
        RelAttentionConfig(block_q=8, block_n=16, far_block_q=24)
    w = build_world(seed=2240, mix=MIX, layer="global_log", group=2, n=8)
    with pytest.raises(ValueError, match="far_block_q needs num_splits=1"):
        _run(_on(w, DEV), RelAttentionConfig(block_q=8, block_n=8, num_splits=2, far_block_q=16))


@pytest.mark.parametrize("n", [1, 64], ids=["N1", "N64"])
def test_block_sizes(n: int) -> None:
    seed = 2200 + n
    w = build_world(seed=seed, mix=MIX, layer="sliding_small", group=2, n=n)
    got = _run(_on(w, DEV), _cfg(2, block_n=16, splits=2))
    _check_close(got.cpu(), w.reference(), torch.float32, f"seed {seed} N {n}")


def _inkling_views(w: World) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The world's cache rewritten into Inkling's ``[nb, Hkv, N, 2*Dh]`` page layout
    (per token and head K then V), returned with its key/value views."""
    kc, vc = w.key_cache, w.value_cache
    nb, n, hkv, dh = kc.shape
    page = torch.empty(nb, hkv, n, 2 * dh, dtype=kc.dtype)
    page[..., :dh] = kc.permute(0, 2, 1, 3)
    page[..., dh:] = vc.permute(0, 2, 1, 3)
    kv = page.unflatten(-1, (2, dh)).transpose(1, 2)  # AttentionCacheOwner.kv_views
    return page, kv[..., 0, :], kv[..., 1, :]


def test_inkling_page_layout_and_host_metadata() -> None:
    seed = 2300
    w = build_world(seed=seed, mix=MIX, layer="global_log", group=4, n=8)
    page, kc, vc = _inkling_views(w)
    w.storage, w.key_cache, w.value_cache = page, kc, vc
    d = _on(w, DEV)
    cfg = _cfg(4, block_n=16, splits=2)
    got = _run(d, cfg)
    _check_close(got.cpu(), w.reference(), torch.float32, f"seed {seed} inkling layout")
    if CUDA:  # host metadata is copied to the device first
        host = _run(d, cfg, device_meta=False)
        assert torch.equal(host, got), f"seed {seed}: host and device metadata differ"


def test_strided_q_and_out() -> None:
    seed = 2400
    w = build_world(seed=seed, mix=MIX, layer="sliding_large", group=2, n=16)
    d = _on(w, DEV)
    t, hq, dh = d.q.shape
    wide = torch.zeros(t, hq, 2 * dh, dtype=d.q.dtype, device=DEV)
    wide[..., dh:] = d.q
    out_wide = torch.full((t, hq + 1, dh), float("nan"), dtype=d.q.dtype, device=DEV)
    d.q = wide[..., dh:]
    got = _run(d, _cfg(2, block_n=32), out=out_wide[:, 1:])
    _check_close(got.cpu(), w.reference(), torch.float32, f"seed {seed} strided")
    assert torch.isnan(out_wide[:, 0]).all(), f"seed {seed}: wrote outside out"


def test_pad_only_and_no_requests() -> None:
    seed = 2500
    w = build_world(seed=seed, mix=[(4, 0), (0, 0)], num_pad=3)
    d = _on(w, DEV)
    got = _run(d, _cfg(2, block_n=16, splits=2), out=torch.full_like(d.q, float("nan")))
    assert torch.equal(got, torch.zeros_like(got)), f"seed {seed}"
    none = paged_rel_attention_triton(
        d.q, d.r, d.rel_proj, d.key_cache, d.value_cache, d.positions, d.block_table[:0],
        torch.zeros(1, dtype=torch.int32, device=DEV), torch.zeros(0, dtype=torch.int32, device=DEV),
        scale=w.scale, out=torch.full_like(d.q, float("nan")),
    )
    assert torch.equal(none, torch.zeros_like(none)), f"seed {seed}"


# --- validation, config and dispatch (no launch) ------------------------------------


def _small_kw() -> dict[str, Any]:
    w = build_world(seed=5, mix=[(5, 2), (0, 3)], n=4, group=2, num_pad=1)
    return dict(q=w.q, r=w.r, rel_proj=w.rel_proj, key_cache=w.key_cache, value_cache=w.value_cache,
                positions=w.positions, block_table=w.block_table, query_start_loc=w.query_start_loc,
                seq_lens=w.seq_lens, scale=w.scale, window=None, log_scaling=None, out=None,
                max_chunk_elements=1 << 24)


BAD: list[tuple[str, str, Any, type[Exception], str]] = [
    ("q 2-D", "q", lambda k: k["q"][0], ValueError, "3-D"),
    ("r heads", "r", lambda k: k["r"][:, :1], ValueError, r"r must be \[T, Hq, d_rel"),
    ("cache vs q dtype", "key_cache", lambda k: k["key_cache"].bfloat16(), TypeError, "differs"),
    ("head_dim", "q", lambda k: k["q"][..., :-1], ValueError, "head_dim"),
    ("positions length", "positions", lambda k: k["positions"][:-1], ValueError, "one per query row"),
    ("block_table float", "block_table", lambda k: k["block_table"].float(), TypeError, "int32 or int64"),
    ("block_table rows", "block_table", lambda k: k["block_table"][:1], ValueError, "2 requests"),
    ("qsl length", "query_start_loc", lambda k: k["query_start_loc"][:-1], ValueError, "3 entries"),
    ("qsl float", "query_start_loc", lambda k: k["query_start_loc"].float(), TypeError, "int32 or int64"),
    ("qsl strided", "query_start_loc", lambda k: torch.zeros(6, dtype=torch.int32)[::2], ValueError, "contiguous"),
    ("seq_lens other device", "seq_lens", lambda k: k["seq_lens"].to("meta"), ValueError, "q's device"),
    ("window 0", "window", lambda k: 0, ValueError, ">= 1"),
    ("alpha nan", "log_scaling", lambda k: (4, float("nan")), ValueError, "finite"),
    ("scale str", "scale", lambda k: "0.1", TypeError, "scale must be a float"),
    ("out dtype", "out", lambda k: torch.empty_like(k["q"], dtype=torch.float16), TypeError, "out dtype"),
    ("chunk float", "max_chunk_elements", lambda k: 1.0, TypeError, "max_chunk_elements"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_validation(case: tuple[str, str, Any, type[Exception], str]) -> None:
    _, key, mutate, exc, match = case
    kw = _small_kw()
    kw[key] = mutate(kw)
    with pytest.raises(exc, match=match):
        check_paged_rel_attention_triton_args(**kw)


@pytest.mark.parametrize("case", METADATA_BAD, ids=[c[0] for c in METADATA_BAD])
def test_host_metadata_values_are_checked_before_the_launch(case: tuple[str, str, Any, type[Exception], str]) -> None:
    """Host ``query_start_loc`` / ``seq_lens`` (and a host block table) are checked as
    the PyTorch path checks them: bad values would make the kernel read or write out
    of bounds (rows past T, pages outside the cache); nothing is written."""
    _, key, mutate, exc, match = case
    kw = _small_kw()
    if key:
        kw[key] = mutate(kw)
    else:
        kw.update(mutate(kw))
    buffer = torch.full((kw["q"].shape[0] + 4, *kw["q"].shape[1:]), float("nan"), dtype=kw["q"].dtype)
    kw["out"] = buffer[: kw["q"].shape[0]]
    args = [kw.pop(k) for k in ("q", "r", "rel_proj", "key_cache", "value_cache", "positions", "block_table",
                                "query_start_loc", "seq_lens")]
    with pytest.raises(exc, match=match):
        paged_rel_attention_triton(*args, **kw)
    assert torch.isnan(buffer).all()


def test_validation_base_is_valid_and_config_checks() -> None:
    prob = check_paged_rel_attention_triton_args(**_small_kw())
    assert (prob.num_reqs, prob.num_q_heads, prob.num_kv_heads, prob.block_size) == (2, 4, 2, 4)
    for bad in (dict(block_q=3), dict(block_n=0), dict(bias="dense"), dict(bias="table"), dict(num_stages=0),
                dict(near_block_n=32), dict(pdl=1), dict(bias="row")):
        with pytest.raises(ValueError):
            RelAttentionConfig(**{**dict(block_q=4, block_n=16), **bad})
    for mode in ("band", "diag"):
        assert RelAttentionConfig(block_q=4, block_n=16, bias=mode).bias == mode
    with pytest.raises(ValueError, match="block_q=1"):
        RelAttentionConfig(block_q=2, block_n=16, bias="row")
    assert RelAttentionConfig(block_q=1, block_n=16, bias="row").bias == "row"
    kw = _small_kw()
    with pytest.raises(TypeError, match="RelAttentionConfig"):
        paged_rel_attention_triton(*[kw.pop(k) for k in list(kw)[:9]], scale=0.1, config=(4, 16))
    # max_seq_len: a host int or None, checked with or without an explicit config,
    # before anything is written
    for bad in ("5", 5.0, -1, True, torch.tensor(5)):
        for cfg in (None, RelAttentionConfig(block_q=4, block_n=16)):
            kw = _small_kw()
            out = torch.full_like(kw["q"], float("nan"))
            with pytest.raises(ValueError, match="max_seq_len"):
                paged_rel_attention_triton(*[kw.pop(k) for k in list(kw)[:9]], scale=0.1, out=out,
                                           max_seq_len=bad, config=cfg)
            assert torch.isnan(out).all()


def test_uses_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INKLING_KERNELS_CPU_BACKEND", raising=False)
    assert not rel_attention_uses_triton("cpu")
    assert rel_attention_uses_triton("cuda")
    monkeypatch.setenv("INKLING_KERNELS_CPU_BACKEND", "triton")
    assert rel_attention_uses_triton(torch.device("cpu"))
    monkeypatch.setenv("INKLING_KERNELS_CPU_ATTENTION", "reference")  # attention alone on PyTorch
    assert not rel_attention_uses_triton("cpu")
    assert rel_attention_uses_triton("cuda")  # a CPU-only switch
    monkeypatch.setenv("INKLING_KERNELS_CPU_ATTENTION", "triton")
    with pytest.raises(ValueError, match="'follow' or 'reference'"):
        rel_attention_uses_triton("cpu")


# --- GPU-only: Inkling 975B shapes against the PyTorch path -------------------------

gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (shapes too large for the interpreter)")


@dataclass
class BigWorld:
    q: torch.Tensor
    r: torch.Tensor
    rel_proj: torch.Tensor
    page: torch.Tensor  # [nb, Hkv, N, 2*Dh], NaN wherever the op may not read
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    positions: torch.Tensor
    block_table: torch.Tensor
    qsl_cpu: torch.Tensor
    sl_cpu: torch.Tensor
    window: int | None
    log_scaling: tuple[int, float] | None
    num_rows: int

    def args(self, device_meta: bool = True) -> tuple[torch.Tensor, ...]:
        qsl, sl = self.qsl_cpu, self.sl_cpu
        if device_meta:
            qsl, sl = qsl.to(self.q.device), sl.to(self.q.device)
        return (self.q, self.r, self.rel_proj, self.key_cache, self.value_cache, self.positions,
                self.block_table, qsl, sl)

    def kwargs(self) -> dict[str, Any]:
        return dict(scale=1.0 / self.q.shape[2], window=self.window, log_scaling=self.log_scaling)


def big_world(mix: list[tuple[int, int]], *, hkv: int, n: int, window: int | None = None,
              log_scaling: tuple[int, float] | None = (4096, 0.1), extent: int = 1024,
              dtype: torch.dtype = torch.bfloat16, num_pad: int = 5, seed: int = 0,
              hq: int = 64, dh: int = 128, d_rel: int = 16) -> BigWorld:
    """A batch on the GPU in Inkling's page layout. Only the positions the queries
    may see are written; pages wholly below the window point at the NaN block 0;
    every other slot (spare pages, page tails, this step's unwritten rows) is NaN."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    extent = window if window is not None else extent
    lens = [c + t for c, t in mix]
    per_req = [max(1, -(-length // n)) for length in lens]
    nb = 1 + sum(per_req) + 3
    page = torch.full((nb, hkv, n, 2 * dh), float("nan"), dtype=dtype, device=dev)
    kv = page.unflatten(-1, (2, dh)).transpose(1, 2)
    kc, vc = kv[..., 0, :], kv[..., 1, :]
    perm = (torch.randperm(nb - 1, generator=g, device=dev) + 1).tolist()
    table = torch.zeros(len(mix), max(per_req) + 2, dtype=torch.int32)
    blocks, offs = [], []
    for i, ((ctx, qlen), length) in enumerate(zip(mix, lens)):
        lo = 0 if window is None or qlen == 0 else max(0, ctx - window + 1)
        for b in range(per_req[i]):
            page_id = perm.pop()
            if (b + 1) * n - 1 >= lo:
                table[i, b] = page_id
        if qlen > 0:
            pos = torch.arange(lo, length)
            blocks.append(table[i, pos // n].long())
            offs.append(pos % n)
    table_d = table.to(dev)
    if blocks:
        bi, oi = torch.cat(blocks).to(dev), torch.cat(offs).to(dev)
        keys = torch.randn(bi.numel(), hkv, dh, generator=g, device=dev)
        kc[bi, oi] = (keys * torch.rsqrt(keys.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
        vc[bi, oi] = torch.randn(bi.numel(), hkv, dh, generator=g, device=dev).to(dtype)
    rows = sum(t for _, t in mix)
    total = rows + num_pad
    q = torch.randn(total, hq, dh, generator=g, device=dev)
    q = (q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    r = torch.randn(total, hq, d_rel, generator=g, device=dev).to(dtype)
    rel_proj = (torch.randn(d_rel, extent, generator=g, device=dev) / math.sqrt(d_rel) * 2.0).to(dtype)
    starts = [0]
    for _, t in mix:
        starts.append(starts[-1] + t)
    positions = torch.zeros(total, dtype=torch.int64)
    for i, (ctx, t) in enumerate(mix):
        positions[starts[i]:starts[i + 1]] = torch.arange(ctx, ctx + t)
    return BigWorld(q=q, r=r, rel_proj=rel_proj, page=page, key_cache=kc, value_cache=vc,
                    positions=positions.to(dev), block_table=table_d,
                    qsl_cpu=torch.tensor(starts, dtype=torch.int32),
                    sl_cpu=torch.tensor(lens, dtype=torch.int32), window=window,
                    log_scaling=log_scaling, num_rows=rows)


def _compare_big(got: torch.Tensor, want: torch.Tensor, w: BigWorld, what: str, tight: bool = False) -> None:
    assert not torch.isnan(got).any(), f"{what}: NaN in the output (a poisoned slot was read)"
    pad = got[w.num_rows:]
    assert torch.equal(pad, torch.zeros_like(pad)), f"{what}: pad rows not zero"
    err = (got.float() - want.float()).abs()
    if tight:
        tol = dict(atol=1e-4, rtol=1e-4)
    else:  # bf16: P rounded to bf16 before P @ V, outputs rounded to bf16
        tol = dict(atol=1e-2, rtol=2e-2)
    torch.testing.assert_close(got, want, **tol, msg=lambda m: f"{what}: max err {err.max().item()}\n{m}")
    assert err.mean().item() < (1e-6 if tight else 2e-3), f"{what}: mean err {err.mean().item()}"


def _rng_lens(count: int, low: int, high: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (count,), generator=g).tolist()


BIG: dict[str, dict[str, Any]] = {
    "decode-1x32k": dict(mix=[(32767, 1)], hkv=8, n=16, num_pad=0),
    "decode-64-upto-32k": dict(mix=[(c, 1) for c in _rng_lens(64, 1, 32767, 1)], hkv=8, n=16),
    "decode-256-sliding": dict(mix=[(c, 1) for c in _rng_lens(256, 0, 4000, 2)], hkv=16, n=16, window=512,
                               log_scaling=None),
    "spec-64x4": dict(mix=[(c, 4) for c in _rng_lens(64, 0, 8000, 3)], hkv=8, n=32),
    "prefill-8k": dict(mix=[(0, 8192)], hkv=8, n=16),
    "chunked-8k-after-8k": dict(mix=[(8192, 8192)], hkv=16, n=64),
    "chunked-sliding-8k-after-8k": dict(mix=[(8192, 8192)], hkv=8, n=16, window=512, log_scaling=None),
    "mixed": dict(mix=[(2048, 2048)] + [(c, 1) for c in _rng_lens(200, 1, 8000, 4)]
                  + [(c, 3) for c in _rng_lens(8, 10, 3000, 5)] + [(0, 300)], hkv=8, n=32, num_pad=17),
    "block-256": dict(mix=[(5000, 1), (3000, 7), (0, 700), (900, 1)], hkv=8, n=256, window=512,
                      log_scaling=None),
}


def _problem(rows: int, reqs: int, hkv: int, d_rel: int = 16) -> RelAttentionProblem:
    return RelAttentionProblem(num_rows=rows, num_reqs=reqs, num_q_heads=64, num_kv_heads=hkv, head_dim=128,
                               d_rel=d_rel, extent=1024, block_size=64, scale=1 / 128, window=None,
                               log_scaling=None)


@pytest.mark.parametrize("dev", ["cuda", "cpu"])
def test_default_bias_follows_the_measured_rule(monkeypatch: pytest.MonkeyPatch, dev: str) -> None:
    """The default tiling takes the block-diagonal bias MMA only for prefill-like
    batches where it is at most 128 deep (block_q x d_rel), else the band; on the GPU
    prefill-like batches take half-width near tiles with either bias. The GPU rule is
    checked without a GPU (only the SM count is read from it)."""
    monkeypatch.setattr(rel_kernel, "_num_sms", lambda device: 132)
    device = torch.device(dev)
    prefill = choose_rel_attention_config(_problem(8192, 1, 8), device)  # group 8: block_q 8, depth 128
    assert (prefill.bias, prefill.block_q) == ("diag", 8)
    assert prefill.near_block_n == (32 if dev == "cuda" else None)
    mixed = choose_rel_attention_config(_problem(2303, 256, 8), device)
    assert mixed.bias == "diag"
    for case in (_problem(8192, 1, 16), _problem(8192, 1, 32), _problem(8192, 1, 8, d_rel=32)):
        cfg = choose_rel_attention_config(case, device)  # depth 256 / 512 / 256
        assert cfg.bias == "band", case
        assert cfg.near_block_n == (cfg.block_n // 2 if dev == "cuda" else None), cfg
    for case in (_problem(256, 256, 8), _problem(1, 1, 8), _problem(256, 64, 8)):  # decode, spec verify
        assert choose_rel_attention_config(case, device).bias == "band", case


@pytest.mark.parametrize("dev", ["cuda", "cpu"])
def test_default_far_launch_follows_the_measured_rule(monkeypatch: pytest.MonkeyPatch, dev: str) -> None:
    """Batches of >= 512 rows a request whose rows reach on average >= 3 extents back
    (max_seq_len - rows / 2) take the far launch of twice the query rows: prefill 8k
    and 16k, chunks of 512 rows or more after 8k; prefill 2k-4k, a mixed batch of
    decodes, a sliding layer and an unknown max_seq_len do not. Global-layer batches
    that are not decode load far tiles through TMA; decode and sliding layers do not."""
    import dataclasses

    monkeypatch.setattr(rel_kernel, "_num_sms", lambda device: 132)
    device = torch.device(dev)
    takes = [(_problem(8192, 1, 8), 16384), (_problem(8192, 1, 8), 8192), (_problem(16384, 1, 8), 16384),
             (_problem(512, 1, 8), 8704), (_problem(1024, 1, 8), 9216), (_problem(1024, 2, 8), 8192)]
    for case, max_seq_len in takes:
        config = choose_rel_attention_config(case, device, max_seq_len)
        assert config.far_block_q == 2 * config.block_q and config.num_splits == 1, (case, max_seq_len, config)
        assert config.tma, config
    sliding = dataclasses.replace(_problem(8192, 1, 16), window=512, extent=512)
    for case, max_seq_len in ((_problem(4096, 1, 8), 4096), (_problem(8192, 4, 8), 2048),
                              (_problem(8192, 1, 8), None), (_problem(2303, 256, 8), 4096),
                              (_problem(256, 1, 8), 8448), (_problem(2046, 2, 8), 3069), (sliding, 16384)):
        config = choose_rel_attention_config(case, device, max_seq_len)
        assert config.far_block_q is None, (case, max_seq_len, config)
        assert config.tma == (case.window is None), config
    decodes = (_problem(256, 256, 8), _problem(256, 64, 8), dataclasses.replace(sliding, num_rows=256, num_reqs=256))
    for case in decodes if dev == "cuda" else ():  # (the interpreter's tiling has no decode kind)
        assert not choose_rel_attention_config(case, device, 8192).tma, case


def test_default_decode_tiling_follows_the_measured_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's decode tiling on a device of 132 SMs (checked without a GPU): a few
    long requests fill exactly one wave of 3 register-capped programs on
    every SM (1 x 8 KV heads: 49 splits) with launch overlap; 2048 programs or more
    on a global layer 2 warps, on a sliding layer 4 below 4096; a sliding layer's
    one-row decode takes one row a tile with the one-distance bias."""
    import dataclasses

    monkeypatch.setattr(rel_kernel, "_num_sms", lambda device: 132)
    cuda = torch.device("cuda")
    one = choose_rel_attention_config(_problem(1, 1, 8), cuda, 32768)
    assert (one.num_splits, one.flat_grid, one.pdl, one.max_registers) == (49, True, True, 160), one
    assert (one.num_warps, one.num_stages, one.near_cost, one.block_n) == (4, 3, 3, 64), one
    assert rel_kernel.DECODE_FEW_PER_SM * one.max_registers * one.num_warps * 32 <= 65536
    four = choose_rel_attention_config(_problem(4, 4, 8), cuda, 32768)
    assert (four.num_splits, four.pdl) == (3 * 132 // 32, True), four
    short = choose_rel_attention_config(_problem(1, 1, 8), cuda, 2048)  # 32 tiles: a few splits
    assert short.num_splits * 4 <= 32, short
    many = choose_rel_attention_config(_problem(256, 256, 8), cuda, 8192)
    assert (many.num_warps, many.pdl, many.max_registers) == (2, False, None), many
    sliding = dataclasses.replace(_problem(256, 256, 8), window=512, extent=512)
    assert choose_rel_attention_config(sliding, cuda, 8192).num_warps == 4
    sliding16 = dataclasses.replace(_problem(256, 256, 16), window=512, extent=512)  # 4096 programs
    cfg = choose_rel_attention_config(sliding16, cuda, 8192)
    assert (cfg.num_warps, cfg.block_q, cfg.bias, cfg.block_n) == (2, 1, "row", 64), cfg
    # one row a request on a sliding layer only: verification rows and global layers keep the band
    verify = dataclasses.replace(_problem(256, 64, 16), window=512, extent=512)
    assert choose_rel_attention_config(verify, cuda, 8192).bias == "band"
    assert choose_rel_attention_config(_problem(256, 256, 16), cuda, 8192).bias == "band"
    cpu = choose_rel_attention_config(_problem(1, 1, 8), torch.device("cpu"), 32768)
    assert (cpu.pdl, cpu.max_registers) == (False, None), cpu


@gpu
@pytest.mark.parametrize("name", list(BIG))
def test_gpu_975b_shapes(name: str) -> None:
    seed = 3000 + list(BIG).index(name)
    w = big_world(**BIG[name], seed=seed)
    want = paged_rel_attention(*w.args(device_meta=False), **w.kwargs())
    before = w.page.clone()
    got = paged_rel_attention_triton(*w.args(), **w.kwargs(), out=torch.full_like(w.q, float("nan")))
    _compare_big(got, want, w, f"seed {seed} {name}")
    assert torch.equal(w.page.view(torch.int16), before.view(torch.int16)), f"seed {seed}: cache changed"
    if name in ("mixed", "decode-1x32k"):  # a forced split, same batch
        cfg = RelAttentionConfig(block_q=2 if name != "mixed" else 8, block_n=64, num_splits=4,
                                 num_warps=4, num_stages=2)
        alt = paged_rel_attention_triton(*w.args(), **w.kwargs(), config=cfg)
        _compare_big(alt, want, w, f"seed {seed} {name} split")
    # the other near-tile bias on the default tiling (band <-> diag), and on prefill
    # shapes diag with 16 queries a tile (MMA depth 256) and both modes on 32-key near tiles
    prob = check_paged_rel_attention_triton_args(*w.args(), 1.0 / w.q.shape[2], w.window, w.log_scaling, None,
                                                 1 << 24)
    default = choose_rel_attention_config(prob, w.q.device)
    other = "band" if default.bias == "diag" else "diag"
    variants = {other: RelAttentionConfig(**{**default.__dict__, "bias": other})}
    if name in ("prefill-8k", "chunked-8k-after-8k", "mixed", "spec-64x4"):
        variants["diag q16 w8"] = RelAttentionConfig(**{**default.__dict__, "bias": "diag", "block_q": 16,
                                                        "num_warps": 8})
        for bias in ("band", "diag"):
            variants[f"{bias} near32"] = RelAttentionConfig(**{**default.__dict__, "bias": bias, "near_block_n": 32})
    for tag, cfg in variants.items():
        alt = paged_rel_attention_triton(*w.args(), **w.kwargs(), config=cfg,
                                         out=torch.full_like(w.q, float("nan")))
        _compare_big(alt, want, w, f"seed {seed} {name} bias {tag}")


@gpu
@pytest.mark.parametrize("splits", [32, 1], ids=["split", "one-launch"])
def test_gpu_pdl_back_to_back_graph(splits: int) -> None:
    """Programmatic dependent launch (``pdl``): two calls captured back to back in one
    CUDA graph, each launch allowed to start while the one before it finishes. The
    second call's workspace may reuse the first's memory (graph pool) and its main
    kernel writes partials the first call's combine may still be reading: each
    launch must wait for the one before it. Both outputs against the PyTorch path,
    replayed with the other world's inputs."""
    seed = 3400 + splits
    mix_a = [(31000, 1), (4000, 1), (12000, 1)]
    mix_b = [(9000, 1), (30000, 1), (100, 1)]
    worlds = [big_world(m, hkv=8, n=16, seed=seed + i) for i, m in enumerate((mix_a, mix_b))]
    wa, wb = worlds
    prob = check_paged_rel_attention_triton_args(*wa.args(), 1.0 / 128, None, wa.log_scaling, None, 1 << 24)
    default = choose_rel_attention_config(prob, wa.q.device, 32768)
    cfg = RelAttentionConfig(**{**default.__dict__, "num_splits": splits, "pdl": True,
                                "flat_grid": default.flat_grid and splits > 1})
    ins = [[t.clone() for t in (w.q, w.r, w.positions)] for w in worlds]
    outs = [torch.empty_like(wa.q) for _ in worlds]
    meta = [(w.qsl_cpu.cuda(), w.sl_cpu.cuda()) for w in worlds]

    def step() -> None:
        for (q, r, pos), w, out, (qsl, sl) in zip(ins, worlds, outs, meta):
            paged_rel_attention_triton(q, r, w.rel_proj, w.key_cache, w.value_cache, pos, w.block_table,
                                       qsl, sl, **w.kwargs(), out=out, config=cfg)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    wants = [paged_rel_attention(*w.args(device_meta=False), **w.kwargs()) for w in worlds]
    for rep in range(2):
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for i, (o, w, want) in enumerate(zip(outs, worlds, wants)):
            _compare_big(o, want, w, f"seed {seed} pdl replay {rep} call {i}")
    # new queries copied into the captured buffers: the replay must use them
    for q, _, _ in ins:
        q.copy_(torch.randn_like(q.float()).to(q.dtype))
    graph.replay()
    torch.cuda.synchronize()
    for i, ((q, r, pos), w, o) in enumerate(zip(ins, worlds, outs)):
        want = paged_rel_attention(q, r, w.rel_proj, w.key_cache, w.value_cache, pos, w.block_table,
                                   w.qsl_cpu, w.sl_cpu, **w.kwargs())
        _compare_big(o, want, w, f"seed {seed} pdl new queries call {i}")


@gpu
def test_gpu_fp32_tight() -> None:
    seed = 3100
    w = big_world([(2000, 1), (0, 300), (700, 5), (4000, 2)], hkv=8, n=16, dtype=torch.float32, seed=seed)
    want = paged_rel_attention(*w.args(device_meta=False), **w.kwargs())
    got = paged_rel_attention_triton(*w.args(), **w.kwargs())
    _compare_big(got, want, w, f"seed {seed} fp32", tight=True)


@gpu
def test_gpu_cuda_graph_replay() -> None:
    """Captured once; replayed after new metadata (same T and R) is copied in."""
    seed = 3200
    mix_a = [(3000, 1), (0, 200), (100, 4), (7000, 1)]
    mix_b = [(10, 190), (5000, 1), (2500, 3), (0, 12)]  # 206 rows of 210 in both
    wa = big_world(mix_a, hkv=8, n=16, seed=seed, num_pad=4)
    wb = big_world(mix_b, hkv=8, n=16, seed=seed + 1, num_pad=4)
    assert wa.q.shape == wb.q.shape
    # one static set of buffers; the cache of a and b stacked so both stay valid
    page = torch.cat([wa.page, wb.page])
    kv = page.unflatten(-1, (2, 128)).transpose(1, 2)
    kc, vc = kv[..., 0, :], kv[..., 1, :]
    table_b = wb.block_table + wa.page.shape[0]
    width = max(wa.block_table.shape[1], table_b.shape[1])
    tables = [torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in (wa.block_table, table_b)]
    q, r, pos = wa.q.clone(), wa.r.clone(), wa.positions.clone()
    bt, qsl, sl = tables[0].clone(), wa.qsl_cpu.cuda(), wa.sl_cpu.cuda()
    out = torch.empty_like(q)

    def step() -> None:
        paged_rel_attention_triton(q, r, wa.rel_proj, kc, vc, pos, bt, qsl, sl, **wa.kwargs(), out=out,
                                   max_seq_len=8192)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for w, table in ((wb, tables[1]), (wa, tables[0])):
        q.copy_(w.q)
        r.copy_(w.r)
        pos.copy_(w.positions)
        bt.copy_(table)
        qsl.copy_(w.qsl_cpu)
        sl.copy_(w.sl_cpu)
        out.fill_(float("nan"))
        graph.replay()
        want = paged_rel_attention(w.q, w.r, wa.rel_proj, w.key_cache, w.value_cache, w.positions,
                                   w.block_table, w.qsl_cpu, w.sl_cpu, **wa.kwargs())
        _compare_big(out, want, w, f"seed {seed} graph replay")
