"""Capacity planning: the 975B unification table and per-request / concurrency figures."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inkling_cache import GIB_BYTES, AttentionLayout, load_config, plan_capacity

# docs/design.md §2.3: --block-size -> (conv block, global attn block, sliding attn block)
TABLE_975B = {16: (4, 32, 16), 32: (8, 64, 32), 128: (32, 256, 128)}


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("block", sorted(TABLE_975B))
def test_975b_unification_table(block: int, tp: int) -> None:
    plan = plan_capacity("inkling-975b", tp_size=tp, block_size=block)
    got = {k.name: k.page.block_size for k in plan.kinds}
    conv, g, s = TABLE_975B[block]
    assert got == {"conv/global": conv, "conv/sliding": conv, "attn/global": g, "attn/sliding": s}
    # Why: per rank the conv page at N=4 is 4*H*D*2 = 131072/tp for both layer types; the
    # attention pages are block*H*128*2*2 = block*4096/tp (global, 8 heads) and
    # block*8192/tp (sliding, 16 heads). At 16 the conv and sliding pages tie for largest;
    # from 32 up the sliding attention page (block*8192/tp) is the largest.
    largest = max(131072 // tp, block * 4096 // tp, block * 8192 // tp)
    assert largest == max(131072, block * 8192) // tp
    assert plan.page_bytes == largest
    assert all(k.page.physical_page_bytes == k.page.page_bytes == largest for k in plan.kinds)
    assert not any(k.page.padded for k in plan.kinds)
    assert plan.block_size_sweep[block]["conv/global"] == conv


def test_975b_page_sizes_before_unification() -> None:
    plan = plan_capacity("inkling-975b", tp_size=8, block_size=16)
    before = {k.name: k.page.original_page_bytes for k in plan.kinds}
    assert before == {"conv/global": 16384, "conv/sliding": 16384, "attn/global": 8192,
                      "attn/sliding": 16384}
    assert plan.conv_layouts["global"].page_bytes("bf16") == 131072 // 8
    assert plan.attention_layouts["sliding"].page_bytes(16, "bf16") == 16 * 2 * 128 * 2 * 2


def test_non_dividing_pages_fail_or_pad() -> None:
    # padding "none": global conv D = 1792 -> page 4*8*1792*2 = 114688, not a divisor of 131072
    with pytest.raises(ValueError, match="does not divide the largest page"):
        plan_capacity("inkling-975b", padding="none", block_size=16)
    plan = plan_capacity("inkling-975b", padding="none", block_size=16, pad_pages=True)
    conv_g = next(k for k in plan.kinds if k.name == "conv/global")
    assert conv_g.page.padded and conv_g.page.block_size == 4
    assert conv_g.page.padding_bytes == 131072 - 4 * 8 * 1792 * 2


def per_request_reference(tp: int, block: int, batched: int, max_len: int, req: int,
                          dtype_bytes: int = 2) -> dict[str, tuple[int, int, int]]:
    """(steady pages, reserve pages, layers) per cache kind, worked out by hand for 975B."""
    page = max(131072, block * 8192) // tp * dtype_bytes // 2
    out = {}
    for name, layers, per_token, window in [
        ("conv/global", 11, (8 // tp) * 2048 * dtype_bytes, 4),
        ("conv/sliding", 55, (16 // tp) * 1024 * dtype_bytes, 4),
        ("attn/global", 11, (8 // tp) * 128 * 2 * dtype_bytes, None),
        ("attn/sliding", 55, (16 // tp) * 128 * 2 * dtype_bytes, 512),
    ]:
        n = page // per_token
        if window is None:
            steady, reserve = math.ceil(req / n), math.ceil(max_len / n)
        else:
            live = max(len({p // n for p in range(q - window + 1, q + 1) if p >= 0})
                       for q in range(req - 2 * n - window, req))
            steady = live
            reserve = math.ceil(min(window - 1 + batched, max_len) / n) + 1
        out[name] = (steady, reserve, layers)
    return out


@given(
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([16, 32, 64, 128, 256]),
    st.integers(1, 16384),
    st.integers(2048, 262144),
    st.data(),
)
def test_per_request_and_concurrency_match_reference(
    tp: int, block: int, batched: int, max_len: int, data: st.DataObject
) -> None:
    req = data.draw(st.integers(1024, max_len))
    budget = data.draw(st.floats(1.0, 141.0))
    dtype = data.draw(st.sampled_from(["bf16", "fp32"]))
    plan = plan_capacity("inkling-975b", tp_size=tp, block_size=block,
                         max_num_batched_tokens=batched, max_model_len=max_len, request_len=req,
                         budgets_gib=(budget,), dtype=dtype)
    size = 4 if dtype == "fp32" else 2
    ref = per_request_reference(tp, block, batched, max_len, req, size)
    got = {k.name: (k.steady_blocks, k.reserve_blocks, k.num_layers) for k in plan.kinds}
    assert got == ref
    page = plan.page_bytes
    steady_pages = sum(s * n for s, _, n in ref.values())
    reserve_pages = sum(r * n for _, r, n in ref.values())
    assert plan.per_request_bytes() == steady_pages * page
    assert plan.per_request_bytes(reserve=True) == reserve_pages * page
    # concurrency: fill a pool of whole pages request by request
    budget_bytes = int(budget * GIB_BYTES)
    pool = budget_bytes // page
    (conc,) = plan.concurrency
    assert conc.steady * steady_pages <= pool < (conc.steady + 1) * steady_pages
    assert conc.reserve * reserve_pages <= pool < (conc.reserve + 1) * reserve_pages
    rolling = (steady_pages - ref["conv/global"][0] * 11 - ref["conv/sliding"][0] * 55) * page
    rolling += 3 * (11 * 8 * 1792 + 55 * 16 * 1024) // tp * size
    assert conc.rolling_minimum == budget_bytes // rolling


def test_975b_conv_minimum_and_steady_state() -> None:
    plan = plan_capacity("inkling-975b", tp_size=1, block_size=16)
    conv = {k.name: k for k in plan.kinds if k.name.startswith("conv/")}
    # rolling minimum (W-1)*C*bytes: C = 8*1792 (global), 16*1024 (sliding)
    assert conv["conv/global"].min_bytes == 3 * 8 * 1792 * 2 == 86016
    assert conv["conv/sliding"].min_bytes == 3 * 16 * 1024 * 2
    # two live pages of 131072 bytes each per layer
    assert conv["conv/global"].steady_bytes == conv["conv/sliding"].steady_bytes == 2 * 131072
    # vLLM's reserve at max_num_batched_tokens 8192: cdiv(3 + 8192, 4) + 1 pages
    assert conv["conv/global"].reserve_blocks == 2050
    d = plan.to_dict()
    assert d["per_request"]["conv_min_bytes"] == 11 * 86016 + 55 * 98304


def test_short_requests_hold_fewer_blocks() -> None:
    plan = plan_capacity("inkling-975b", block_size=16, request_len=3, max_model_len=4096)
    assert {k.name: k.steady_blocks for k in plan.kinds} == {
        "conv/global": 1, "conv/sliding": 1, "attn/global": 1, "attn/sliding": 1}


def test_attention_layout() -> None:
    a = AttentionLayout.build(num_kv_heads=8, head_dim=128, tp_size=8, sliding_window=None)
    assert a.num_heads == 1 and a.bytes_per_token("bf16") == 512
    assert a.page_bytes(32, "bfloat16") == 16384


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"tp_size": 16}, "exceeds num_kv_heads"),
        ({"block_size": 0}, "block_size"),
        ({"max_model_len": 100, "request_len": 200}, "request_len 200 exceeds"),
        ({"max_model_len": 100, "prompt_len": 8192}, "prompt_len 8192 exceeds max_model_len 100"),
        ({"prompt_len": 0}, "prompt_len"),
        ({"budgets_gib": (0.0,)}, "budget"),
        ({"budgets_gib": (float("inf"),)}, "budget"),
        ({"dtype": "int4"}, "unknown dtype"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ],
)
def test_plan_errors(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        plan_capacity("inkling-975b", **kwargs)  # type: ignore[arg-type]


def test_plan_defaults_follow_config() -> None:
    plan = plan_capacity(load_config("inkling-975b"))
    assert plan.max_model_len == plan.request_len == 131072
    assert plan.prompt_len == 8192
    # a context limit below the default prompt caps the admission figure's prompt
    assert plan_capacity("inkling-975b", max_model_len=100).prompt_len == 100
    assert plan.tp_size == 1 and plan.dtype == "bfloat16" and plan.block_size == 16


# --- the two conv-state managers side by side ---------------------------------------------


@pytest.mark.parametrize("batches,k,expected", [(1, 0, 6), (2, 0, 8), (1, 3, 7), (2, 3, 9)])
def test_tail_conv_admission_blocks_by_hand(batches: int, k: int, expected: int) -> None:
    from inkling_cache import tail_conv_admission_blocks

    # W = N = 4, + the prompt-end and the shared-prefix junction checkpoints (a block
    # each). A lone 3-row chunk tail touches 2 blocks.
    # k = 0: B + 1 lone tails, 2 blocks each: 4 / 6 (+2).
    # B = 1, k = 3: decode tails reach 3 + 3 = 6 rows (3 blocks); a decode tail, then a
    #   chunk tail elsewhere (a streaming session's next turn): 3 + 2 = 5; a tail and
    #   a decode tail after it: one run of 6 + 4 = 10 rows, 4.
    # B = 2, k = 3: decode tails reach 3 + 6 = 9 rows (3 blocks); a decode tail, then two
    #   chunk tails: 3 + 2 + 2 = 7; a decode tail, then a chunk and a decode tail (13
    #   rows, 4): 7; three tails in one run: 17 rows, 5.
    for budget in (2048, 8192):
        got = tail_conv_admission_blocks(4, 4, budget, 131072, max_concurrent_batches=batches, spec_tokens=k)
        assert got == expected
        for method, more in (("ngram", 0), ("suffix", 0), ("draft_model", 0), ("eagle", 4), ("mtp", 4)) if k else ():
            # lookahead slots the conv does not write take no block; under the EAGLE block
            # drop a checkpoint keeps the block after its boundary, and the prompt end two
            # boundaries: 3 checkpoints of 2 blocks instead of 2 of 1
            assert tail_conv_admission_blocks(
                4, 4, budget, 131072, max_concurrent_batches=batches, spec_tokens=k, speculative_method=method
            ) == expected + more
    # never above the plain window's reserve (tiny max_model_len)
    assert tail_conv_admission_blocks(4, 4, 8192, 5, max_concurrent_batches=batches) == min(expected, 3)
    # retention checkpoints: one block per 1024 tokens of each unrun chunk
    assert tail_conv_admission_blocks(4, 4, 8192, 131072, retention_tokens=1024) == 6 + (8 + 1)


@pytest.mark.parametrize("batches,k,method,expected", [
    (1, 0, None, 2), (2, 0, None, 2), (1, 3, "ngram", 3), (2, 3, "ngram", 3), (1, 3, "eagle", 3), (2, 3, "mtp", 3),
])
def test_tail_conv_steady_blocks_by_hand(batches: int, k: int, method: str | None, expected: int) -> None:
    from inkling_cache import tail_conv_steady_blocks

    # W = N = 4: from W - 1 rows below the settled tokens to the newest end: 3 + B rows
    # without drafts (2 blocks), 3 + 4 = 7 with one step of 1 + 3 in flight (3 blocks)
    assert tail_conv_steady_blocks(4, 4, max_concurrent_batches=batches, spec_tokens=k,
                                   speculative_method=method) == expected
    if method in ("eagle", "mtp"):  # lookahead slots the conv layers write: 10 rows, 4 blocks
        assert tail_conv_steady_blocks(4, 4, max_concurrent_batches=batches, spec_tokens=k,
                                       speculative_method=method, lookahead_written=3) == 4


def test_speculative_methods_and_their_lookahead() -> None:
    from inkling_cache import speculative_lookahead_tokens, tail_conv_admission_blocks

    assert speculative_lookahead_tokens(None, 0) == speculative_lookahead_tokens("ngram", 3) == 0
    assert speculative_lookahead_tokens("eagle", 3) == speculative_lookahead_tokens("draft_model", 2) + 1 == 3
    with pytest.raises(ValueError, match="not known"):
        speculative_lookahead_tokens("medusa-ish", 3)
    with pytest.raises(ValueError, match="needs spec_tokens"):
        speculative_lookahead_tokens("eagle", 0)
    with pytest.raises(ValueError, match="exceeds the 0 lookahead slots"):
        tail_conv_admission_blocks(4, 4, 2048, 65536, spec_tokens=3, speculative_method="ngram", lookahead_written=1)


def _live_tail_blocks_of_a_schedule(
    w: int, n: int, k: int, b: int, look: int, prompt: int, chunks: list[int],
    decode: list[tuple[int, int]], resume: list[int],
) -> int:
    """Brute force, independent of the bound's derivation: play one request's schedule
    the way vLLM's scheduler counts (chunks of the prompt, then decode steps of 1 + d
    tokens, then the chunks of a streaming session's next turn; ``b`` steps in flight,
    a settled step's rejected drafts taken back from the computed count) and return the
    most blocks the ``b + 1`` newest tails touch together (a tail: ``W - 1`` rows before
    a step without drafts ends, ``W - 1 + k b`` before a decode step's end, plus the
    lookahead slots; a step after the prompt of at most ``1 + k`` tokens counts as a
    decode step, the larger tail)."""
    computed, steps, in_flight, worst = 0, [], [], 0
    plan = [(size, 0) for size in chunks] + [(1 + d, r) for d, r in decode] + [(size, 0) for size in resume]
    for size, rejected in plan:
        if computed < prompt:
            size = min(size, prompt - computed)
            rejected = 0
        end = computed + size
        drafts = end > prompt and size <= 1 + k  # what the manager may assume
        rows = w - 1 + k * b if drafts else w - 1
        steps.append((end - rows, end + look))
        in_flight.append((size, rejected if end > prompt else 0))
        computed = end
        live = set()
        for lo, hi in steps[-(b + 1):]:
            live.update(range(max(0, lo) // n, -(-hi // n)))
        worst = max(worst, len(live))
        if len(in_flight) >= b:
            done_size, done_rejected = in_flight.pop(0)
            computed -= min(done_rejected, done_size - 1)
    return worst


@given(
    w=st.integers(2, 6), n=st.integers(1, 16), k=st.integers(0, 4), b=st.integers(1, 3),
    look=st.integers(0, 3), prompt=st.integers(1, 300),
    chunks=st.lists(st.integers(1, 120), min_size=1, max_size=8),
    decode=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), max_size=10),
    resume=st.lists(st.integers(1, 120), max_size=4),
)
def test_live_tail_bound_holds_for_any_schedule(
    w: int, n: int, k: int, b: int, look: int, prompt: int, chunks: list[int],
    decode: list[tuple[int, int]], resume: list[int],
) -> None:
    from inkling_cache import tail_conv_live_blocks

    decode = [(min(d, k), min(r, d, k)) for d, r in decode]
    worst = _live_tail_blocks_of_a_schedule(w, n, k, b, look, prompt, chunks, decode, resume)
    bound = tail_conv_live_blocks(w, n, max_concurrent_batches=b, spec_tokens=k, lookahead_written=look)
    assert worst <= bound <= (b + 1) * (-(-(w - 2 + k * b + look) // n) + 1)  # the README's cap


def test_live_tail_bound_covers_a_chunk_after_decode_tails() -> None:
    # A chunk tail after a decode tail, as the property test above may draw it: a
    # 1-token prompt, a 1-token step after it (a decode step: its tail reaches
    # W - 1 + k = 2 rows back), then a 3-token step (no drafts). With 2 lookahead
    # slots and 1-row blocks the two live tails are rows 0-3 and 4-6: 7 blocks.
    from inkling_cache import tail_conv_live_blocks

    seen = _live_tail_blocks_of_a_schedule(2, 1, 1, 1, 2, 1, [1, 1, 3], [], [])
    bound = tail_conv_live_blocks(2, 1, max_concurrent_batches=1, spec_tokens=1, lookahead_written=2)
    assert (seen, bound) == (7, 7)


def test_live_tail_bound_is_reached() -> None:
    # the bound is not loose at W = N = 4, B = 2, k = 3: some schedule touches all 7
    # (a decode step, then a streaming session's next turn in two chunks)
    from inkling_cache import tail_conv_live_blocks

    bound = tail_conv_live_blocks(4, 4, max_concurrent_batches=2, spec_tokens=3)
    seen = max(
        _live_tail_blocks_of_a_schedule(4, 4, 3, 2, 0, prompt, [prompt], [(3, r)], [c1, c2, 64])
        for prompt in range(60, 68) for c1 in range(5, 13) for c2 in range(5, 13) for r in range(4)
    )
    assert (seen, bound) == (7, 7)


def test_in_flight_tokens_scale_the_window_reserve_not_the_tail() -> None:
    one = plan_capacity("inkling-975b", tp_size=8, max_concurrent_batches=1)
    two = plan_capacity("inkling-975b", tp_size=8, max_concurrent_batches=2)
    c1 = {k.name: k for k in one.kinds}["conv/sliding"]
    c2 = {k.name: k for k in two.kinds}["conv/sliding"]
    assert (c1.reserve_blocks, c2.reserve_blocks) == (2050, 4098)  # cdiv(3 + B * 8192, 4) + 1
    assert (c1.tail_reserve_blocks, c2.tail_reserve_blocks) == (6, 8)
    assert two.in_flight_tokens == 16384
    # admission of an 8k prompt: the conv state's share falls from most to ~1.5 %
    assert two.conv_admission_share("window") > 0.8 > 0.02 > two.conv_admission_share("tail")
    assert two.admission_bytes("tail", "attn/") == two.admission_bytes("window", "attn/")
    with pytest.raises(ValueError, match="choose 'window' or 'tail'"):
        two.admission_bytes("ring")


# ----------------------------------------------------------------------------- argument checks


def test_a_single_budget_number_is_one_budget() -> None:
    one = plan_capacity("inkling-975b", tp_size=8, budgets_gib=8.0)
    assert one.concurrency == plan_capacity("inkling-975b", tp_size=8, budgets_gib=(8.0,)).concurrency
    assert [c.budget_bytes for c in one.concurrency] == [8 * GIB_BYTES]
    assert plan_capacity("inkling-975b", tp_size=8, budgets_gib=8).concurrency == one.concurrency


@pytest.mark.parametrize(
    ("budgets", "words"),
    [
        (("8",), r"budgets_gib\[0\] must be a number of GiB, got str '8'"),
        ((8.0, None), r"budgets_gib\[1\] must be a number of GiB, got NoneType"),
        ((True,), r"budgets_gib\[0\] must be a number of GiB, got bool"),
        ("8", "budgets_gib must be a number or a sequence of numbers"),
        (None, "budgets_gib must be a number or a sequence of numbers"),
    ],
)
def test_budgets_must_be_numbers(budgets: object, words: str) -> None:
    with pytest.raises(TypeError, match=words):
        plan_capacity("inkling-975b", budgets_gib=budgets)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sizes", "error", "words"),
    [
        ((0, -3), ValueError, r"sweep_block_sizes\[0\] must be >= 1, got 0"),
        ((16, -3), ValueError, r"sweep_block_sizes\[1\] must be >= 1, got -3"),
        ((16.0,), TypeError, r"sweep_block_sizes\[0\] must be an int"),
        ((True,), TypeError, r"sweep_block_sizes\[0\] must be an int"),
        ("16", TypeError, "sweep_block_sizes must be an int or a sequence of ints"),
    ],
)
def test_sweep_block_sizes_are_checked(sizes: object, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        plan_capacity("inkling-975b", sweep_block_sizes=sizes)  # type: ignore[arg-type]


def test_a_single_sweep_block_size() -> None:
    plan = plan_capacity("inkling-975b", tp_size=8, sweep_block_sizes=32)
    assert list(plan.block_size_sweep) == [32]


def test_total_names_the_valid_figures() -> None:
    plan = plan_capacity("inkling-975b", tp_size=8)
    with pytest.raises(ValueError, match="'nope' is not a per-kind figure: choose one of steady_blocks, steady_bytes"):
        plan.total("nope")
    with pytest.raises(ValueError, match="min_bytes is not defined for attn/global, attn/sliding.*prefix='conv/'"):
        plan.total("min_bytes")
    assert plan.total("min_bytes", "conv/") == sum(k.min_bytes * k.num_layers for k in plan.kinds if k.min_bytes)
    assert plan.total("steady_bytes") == plan.per_request_bytes()
