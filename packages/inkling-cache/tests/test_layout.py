"""ConvStateLayout: derived sizes, stream ranges, channel mapping, validation."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from inkling_cache import ConvStateLayout, PaddingPolicy, Stream, dtype_bytes


def next_pow2_ref(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


@st.composite
def dims(draw: st.DrawFn) -> dict[str, int]:
    kv = draw(st.integers(1, 32))
    return {
        "num_kv_heads": kv,
        "head_dim": draw(st.integers(1, 256)),
        "hidden_size": kv * draw(st.integers(1, 512)),
        "kernel_size": draw(st.integers(2, 8)),
    }


paddings = st.one_of(
    st.sampled_from(["pow2", "none"]),
    st.integers(1, 300),
    st.integers(1, 300).map(lambda k: ("multiple", k)),
)


def valid_tps(kv: int) -> list[int]:
    return [t for t in range(1, kv + 1) if kv % t == 0]


# ----------------------------------------------------------------------------- exact figures


def test_975b_global_layout_exact() -> None:
    for tp in (1, 2, 4, 8):
        lay = ConvStateLayout.build(num_kv_heads=8, head_dim=128, hidden_size=6144, kernel_size=4,
                                    tp_size=tp)
        assert lay.num_heads == 8 // tp
        assert lay.hidden_per_head == 768
        assert lay.raw_head_size == 1792
        assert lay.head_size == 2048
        assert lay.padding_fraction == 0.125
        assert lay.block_size == 4 and lay.sliding_window == 4
        assert lay.page_bytes("bfloat16") == 131072 // tp
        assert lay.cache_shape(10) == (10, 8 // tp, 4, 2048)


def test_975b_sliding_layout_exact() -> None:
    for tp in (1, 2, 4, 8, 16):
        lay = ConvStateLayout.build(num_kv_heads=16, head_dim=128, hidden_size=6144, kernel_size=4,
                                    tp_size=tp)
        assert lay.hidden_per_head == 384
        assert lay.raw_head_size == 1024
        assert lay.head_size == 1024
        assert lay.page_bytes("bf16") == 131072 // tp


def test_stream_ranges_975b() -> None:
    lay = ConvStateLayout.build(num_kv_heads=8, head_dim=128, hidden_size=6144, kernel_size=4)
    assert [lay.stream_range(s) for s in Stream] == [(0, 128), (128, 128), (256, 768), (1024, 768)]
    assert lay.stream_dim(Stream.ATTN) == 6144
    assert lay.stream_dim(Stream.K) == 1024
    assert int(Stream.K) == 0 and int(Stream.V) == 1 and int(Stream.ATTN) == 2 and int(Stream.MLP) == 3


def test_defaults_and_overrides() -> None:
    lay = ConvStateLayout.build(num_kv_heads=2, head_dim=16, hidden_size=64, kernel_size=3,
                                block_size=16, sliding_window=8, padding="none")
    assert (lay.block_size, lay.sliding_window, lay.head_size) == (16, 8, 2 * 16 + 2 * 32)
    assert lay.with_block_size(64).block_size == 64
    assert lay.with_block_size(64).head_size == lay.head_size


def test_sizes_for_each_dtype() -> None:
    lay = ConvStateLayout.build(num_kv_heads=4, head_dim=8, hidden_size=64, kernel_size=4,
                                tp_size=2, padding="none")
    # H = 2, hph = 16, raw = D = 48
    for name, size in [("bfloat16", 2), ("float16", 2), ("float32", 4), ("fp32", 4), ("bf16", 2),
                       ("fp16", 2), ("torch.bfloat16", 2)]:
        assert dtype_bytes(name) == size
        assert lay.slot_bytes(name) == 2 * 48 * size
        assert lay.page_bytes(name) == 4 * 2 * 48 * size
        assert lay.min_state_bytes(name) == 3 * 2 * 48 * size


def test_padding_policies() -> None:
    base = dict(num_kv_heads=8, head_dim=128, hidden_size=6144, kernel_size=4)
    assert ConvStateLayout.build(**base, padding="none").head_size == 1792
    assert ConvStateLayout.build(**base, padding=64).head_size == 1792
    assert ConvStateLayout.build(**base, padding=("multiple", 1000)).head_size == 2000
    assert ConvStateLayout.build(**base, padding="multiple:256").head_size == 1792
    assert ConvStateLayout.build(**base, padding="300").head_size == 1800
    assert ConvStateLayout.build(**base, padding=PaddingPolicy("multiple", 512)).head_size == 2048
    assert str(PaddingPolicy.parse(64)) == "multiple:64"
    assert PaddingPolicy.parse("pow2") == PaddingPolicy()


# ----------------------------------------------------------------------------- validation

BASE = dict(num_kv_heads=8, head_dim=128, hidden_size=6144, kernel_size=4)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"tp_size": 16}, "exceeds num_kv_heads"),
        ({"tp_size": 3}, "does not divide"),
        ({"hidden_size": 6145}, "not divisible"),
        ({"kernel_size": 1}, "kernel_size must be >= 2"),
        ({"kernel_size": 0}, "kernel_size must be >= 2"),
        ({"block_size": 0}, "block_size"),
        ({"sliding_window": 3}, "sliding_window"),
        ({"padding": "pow3"}, "unknown padding"),
        ({"padding": "\u00b2"}, "unknown padding"),  # a digit to str.isdigit, not a number
        ({"padding": 0}, "padding multiple"),
        ({"padding": ("multiple", 0)}, "padding multiple"),
        ({"padding": ("pad", 4)}, "padding tuple"),
        ({"num_kv_heads": 0}, "num_kv_heads"),
        ({"head_dim": 0}, "head_dim"),
        ({"tp_size": 0}, "tp_size"),
    ],
)
def test_invalid_combinations_say_what_to_change(change: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ConvStateLayout.build(**{**BASE, **change})  # type: ignore[arg-type]


def test_type_errors() -> None:
    with pytest.raises(TypeError):
        ConvStateLayout.build(**{**BASE, "head_dim": 128.0})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ConvStateLayout.build(**{**BASE, "tp_size": True})  # type: ignore[arg-type]
    lay = ConvStateLayout.build(**BASE)
    with pytest.raises(ValueError, match="unknown dtype"):
        lay.page_bytes("int8")
    with pytest.raises(TypeError):
        lay.page_bytes(2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stream"):
        lay.stream_range(4)


def test_tp_error_lists_valid_degrees() -> None:
    with pytest.raises(ValueError, match=r"\[1, 2, 4, 8\]"):
        ConvStateLayout.build(**{**BASE, "tp_size": 6})


def test_direct_construction_must_be_consistent() -> None:
    lay = ConvStateLayout.build(**BASE)
    with pytest.raises(ValueError, match="inconsistent"):
        dataclasses.replace(lay, head_size=1792)
    with pytest.raises(ValueError, match="inconsistent"):
        dataclasses.replace(lay, num_heads=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lay.block_size = 8  # type: ignore[misc]


def test_channel_mapping_errors() -> None:
    lay = ConvStateLayout.build(**BASE, tp_size=2)
    with pytest.raises(ValueError, match="out of range"):
        lay.channel_to_head(Stream.K, 4 * 128)
    with pytest.raises(ValueError):
        lay.channel_to_head(Stream.K, -1)
    with pytest.raises(ValueError, match="outside stream"):
        lay.head_to_channel(Stream.ATTN, 0, 0)
    with pytest.raises(ValueError, match="head 4 out of range"):
        lay.head_to_channel(Stream.K, 4, 0)


# ----------------------------------------------------------------------------- properties


@given(dims(), paddings)
def test_stream_ranges_disjoint_cover_raw_and_fit_in_d(d: dict[str, int], padding: object) -> None:
    lay = ConvStateLayout.build(**d, padding=padding)  # type: ignore[arg-type]
    covered: list[int] = []
    for s in Stream:
        off, width = lay.stream_range(s)
        assert width > 0 and off >= 0 and off + width <= lay.head_size
        covered.extend(range(off, off + width))
    assert len(covered) == len(set(covered)) == lay.raw_head_size
    assert sorted(covered) == list(range(lay.raw_head_size))
    assert lay.head_size >= lay.raw_head_size
    assert 0.0 <= lay.padding_fraction < 1.0


@given(dims(), paddings)
def test_padding_matches_reference(d: dict[str, int], padding: object) -> None:
    lay = ConvStateLayout.build(**d, padding=padding)  # type: ignore[arg-type]
    raw = 2 * d["head_dim"] + 2 * (d["hidden_size"] // d["num_kv_heads"])
    assert lay.raw_head_size == raw
    if padding == "pow2":
        assert lay.head_size == next_pow2_ref(raw)
    elif padding == "none":
        assert lay.head_size == raw
    else:
        k = padding if isinstance(padding, int) else padding[1]  # type: ignore[index]
        assert lay.head_size % k == 0 and raw <= lay.head_size < raw + k


@given(dims(), paddings, st.data())
def test_head_size_is_tp_invariant(d: dict[str, int], padding: object, data: st.DataObject) -> None:
    layouts = [ConvStateLayout.build(**d, tp_size=t, padding=padding)  # type: ignore[arg-type]
               for t in valid_tps(d["num_kv_heads"])]
    assert len({lay.head_size for lay in layouts}) == 1
    assert len({lay.hidden_per_head for lay in layouts}) == 1
    for lay in layouts:
        assert lay.num_heads * lay.tp_size == d["num_kv_heads"]
        assert lay.hidden_shard * lay.tp_size == d["hidden_size"]
        assert lay.stream_dim(Stream.MLP) == d["hidden_size"] // lay.tp_size
        assert lay.page_bytes("bf16") * lay.tp_size == layouts[0].page_bytes("bf16")


@given(dims(), st.data())
def test_channel_mapping_round_trips(d: dict[str, int], data: st.DataObject) -> None:
    kv = d["num_kv_heads"]
    tp = data.draw(st.sampled_from(valid_tps(kv)))
    lay = ConvStateLayout.build(**d, tp_size=tp)
    stream = data.draw(st.sampled_from(list(Stream)))
    off, width = lay.stream_range(stream)
    c = data.draw(st.integers(0, lay.stream_dim(stream) - 1))
    head, pos = lay.channel_to_head(stream, c)
    # Independent statement of the layout: heads are consecutive chunks of `width` channels.
    assert head == c // width and pos == off + c % width
    assert 0 <= head < lay.num_heads and off <= pos < off + width
    assert lay.head_to_channel(stream, head, pos) == c


@given(dims(), st.data())
def test_all_channels_of_all_streams_hit_distinct_cells(d: dict[str, int], data: st.DataObject) -> None:
    assume(d["num_kv_heads"] * (2 * d["head_dim"]) + d["hidden_size"] * 2 <= 20000)
    lay = ConvStateLayout.build(**d)
    cells = set()
    for s in Stream:
        for c in range(lay.stream_dim(s)):
            cells.add(lay.channel_to_head(s, c))
    assert len(cells) == lay.num_heads * lay.raw_head_size
