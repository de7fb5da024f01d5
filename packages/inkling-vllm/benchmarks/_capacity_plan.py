"""Plan a capacity run without the model: vLLM's own scheduler on the tiny Inkling's KV specs.

    python3 packages/inkling-vllm/benchmarks/run.py capacity-plan [--prompts 64] [--prompt-len 2048] \\
        [--new-tokens 24] [--budget 8192] [--max-model-len 4096] [--blocks 150,200,300]

For each pool size and each conv-state manager (``window``: vLLM's plain
``SlidingWindowSpec``; ``tail``: :class:`inkling_vllm.conv_manager.ConvStateSpec`) this
builds the engine's ``VllmConfig`` from the tiny checkpoint (no weights loaded), the
KV-cache specs the tiny model's layers emit (one conv state and one attention layer per
decoder layer), vLLM's own ``get_kv_cache_configs`` (page unification, grouping, and the
startup check that refuses a pool too small for one ``max_model_len`` request), and
then runs vLLM's real ``Scheduler`` (admission gate, chunked prefill, preemption) on
``--prompts`` prompts, feeding it a fixed sampled token instead of running the model.
It prints the most and mean requests running, preemptions and steps: the scheduler's
side of ``run.py capacity`` in seconds, to choose a configuration before serving it.
The figures are a plan, not a measurement of serving: ``run.py capacity`` measures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def tiny_checkpoint(root: Path, max_model_len: int) -> Path:
    from inkling_vllm.demo.tiny import build_tiny_checkpoint

    path = build_tiny_checkpoint(root / "tiny")
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = max(max_model_len, int(config["max_position_embeddings"]))
    (path / "config.json").write_text(json.dumps(config))
    return path


def plan_one(checkpoint: Path, manager: str, blocks: int, args: argparse.Namespace) -> dict[str, Any]:
    import inkling_vllm.conv_manager  # noqa: F401  (registers the tail spec's manager)
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import (
        get_kv_cache_configs,
        get_request_block_hasher,
        init_none_hash,
        resolve_cache_hit_alignment_tokens,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    engine_args = EngineArgs(model=str(checkpoint), dtype="float32", max_model_len=args.max_model_len,
                             max_num_batched_tokens=args.budget, max_num_seqs=args.max_num_seqs or args.prompts,
                             num_gpu_blocks_override=blocks, enforce_eager=True, seed=0,
                             scheduler_reserve_full_isl=not args.admit_by_chunk)
    vllm_config = engine_args.create_engine_config()
    vllm_config.cache_config.kv_cache_layout = "LBHNC"  # what the engine core resolves for our backends
    from inkling_vllm.demo.tiny import TINY_CONFIG

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _engine_sizing import tiny_layer_specs  # the tiny model's specs, as its layers emit them

    specs = tiny_layer_specs(int(vllm_config.cache_config.block_size), TINY_CONFIG["conv_kernel_size"], manager)
    try:
        (kv_config,) = get_kv_cache_configs(vllm_config, [specs], [1 << 30])
    except ValueError as exc:
        return {"refused": " ".join(str(exc).split())[:140]}
    # what EngineCore does after sizing
    vllm_config.cache_config.num_gpu_blocks = kv_config.num_blocks
    vllm_config.cache_config.block_size = min(
        g.kv_cache_spec.block_size for g in kv_config.kv_cache_groups if g.kv_cache_spec.prefix_cacheable
    )
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_config, vllm_config)
    kv_config.hash_block_size = hash_block_size
    kv_config.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
        kv_config, vllm_config, block_size, hash_block_size
    )
    scheduler = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_config,
                          structured_output_manager=StructuredOutputManager(vllm_config),
                          block_size=block_size, hash_block_size=hash_block_size, log_stats=True)
    hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(hash_block_size, hash_fn)
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    for i in range(args.prompts):
        prompt = [3 + (7 * i + 13 * j) % 256 for j in range(args.prompt_len)]
        scheduler.add_request(Request(f"r{i}", prompt, params, None, block_hasher=hasher))
    steps = most = running_sum = preemptions = 0
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        preemptions += len(out.preempted_req_ids or ())
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            request = scheduler.requests[rid]
            # a token is sampled once the step reaches the end of what the request holds
            reaches_end = request.num_computed_tokens + out.num_scheduled_tokens[rid] >= request.num_tokens
            sampled.append([7] if reaches_end else [])
        scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)}, sampled_token_ids=sampled))
        steps += 1
        most = max(most, len(scheduler.running))
        running_sum += len(scheduler.running)
    return {"most_running": most, "mean_running": running_sum / max(1, steps), "preemptions": preemptions,
            "steps": steps}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--budget", type=int, default=8192, help="tokens per step (max_num_batched_tokens)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--max-num-seqs", type=int, default=0, help="requests running at most (0: --prompts)")
    parser.add_argument("--admit-by-chunk", action="store_true",
                        help="scheduler_reserve_full_isl=False: admit on the first chunk's blocks, not the prompt's")
    parser.add_argument("--blocks", default="150,200,300", help="pool sizes to plan, comma-separated")
    args = parser.parse_args(argv)
    pools = [int(b) for b in args.blocks.split(",")]
    print("| blocks | conv state | most running | mean running | preemptions | steps |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = tiny_checkpoint(Path(tmp), args.max_model_len)
        for blocks in pools:
            for manager in ("window", "tail"):
                r = plan_one(checkpoint, manager, blocks, args)
                if "refused" in r:
                    print(f"| {blocks} | {manager} | refuses to start: {r['refused']} | | | |", flush=True)
                else:
                    print(f"| {blocks} | {manager} | {r['most_running']} | {r['mean_running']:.1f} "
                          f"| {r['preemptions']} | {r['steps']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
