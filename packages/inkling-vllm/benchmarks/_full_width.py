"""Full-width parity check: a 4-layer random Inkling at the released layer widths,
served through the inkling-vllm plugin on CPU, against transformers.

    python3 packages/inkling-vllm/benchmarks/run.py full-width \\
        [--out DIR] [--keep-checkpoint] [--smoke] [--lengths 1100,640,24,5]

Too slow for CI (about 2.6 B float32 parameters, 9.7 GiB); the last run is recorded
in ``packages/inkling-vllm/RESULTS.md``.

The model (:func:`full_width_config`): hidden 6144; 64 query heads of 128 on every
layer, 8 KV heads on global layers and 16 on sliding ones; ``d_rel`` 16 reaching
``rel_extent`` 1024 tokens back on global layers and the 512-token window on sliding
ones; log scaling from position 64 (alpha 0.1); short convs of kernel 4; dense MLP
width 24576; MoE layers with 8 routed experts of width 3072, top-6, 2 shared sink
experts, ``route_scale`` 8; layers dense-sliding, dense-global, MoE-sliding,
MoE-global; a padded vocabulary (4096 rows, 4000 real); logits divided by 24.

Phases (each prints a progress line with its time):

1. build: the transformers model is created on the meta device (so its parameter
   names and shapes are transformers' own), then one piece at a time (the embedding
   and head, then each decoder layer) is materialised in float32, filled by the tiny
   checkpoint's weight drawer (:mod:`inkling_vllm.demo.tiny`: unit-scale activations, a
   sharp unembedding whose padded rows would win if kept; the unembedding is scaled
   up by the ratio of the logit multipliers so the logits spread as widely as the tiny
   model's) and written twice: in transformers' format to ``REFERENCE_DIR`` (what
   :func:`inkling_vllm.demo.tiny.reference_checkpoint` returns) and in the release layout
   (``inkling_mm_model``, ``model.llm.*`` through
   :func:`inkling_model.checkpoint.transformers_to_release`), one safetensors shard per
   piece, so at most one layer (~2.5 GiB) and its release copy are in memory.
2. vLLM (float32, eager, no tokenizer: prompts are token ids): greedy
   ``--max-tokens`` tokens per prompt, with the logprob of every prompt token
   (teacher-forced) and of every generated token; then the engine is shut down.
3. transformers (``InklingForCausalLM`` from the reference copy, float32, no cache):
   one forward per prompt over prompt + vLLM's tokens gives the teacher-forced
   logprobs of both and the argmax at every generated position (identical argmaxes
   mean identical greedy sequences; on a mismatch the transformers greedy sequence is
   recomputed token by token for the report).

Passes when the greedy tokens are identical and every logprob is within ``--atol``.
Writes ``results.json`` (everything measured) to ``--out``; the checkpoint (~19 GiB
for both copies) is deleted at the end unless ``--keep-checkpoint`` (a kept one with
the same config and seed is reused by the next run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: Bumped when the drawn weights or the files written change (kept builds are keyed on it).
BUILD_VERSION = 1
BUILD_MARKER = "full_width_build.json"

#: transformers ``InklingTextConfig`` fields of the released widths, 4 layers.
FULL_WIDTH: dict[str, Any] = {
    "vocab_size": 4096,
    "unpadded_vocab_size": 4000,
    "hidden_size": 6144,
    "num_hidden_layers": 4,
    "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
    "mlp_layer_types": ["dense", "dense", "sparse", "sparse"],
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "swa_num_attention_heads": 64,
    "swa_num_key_value_heads": 16,
    "swa_head_dim": 128,
    "sliding_window_size": 512,
    "rel_extent": 1024,
    "d_rel": 16,
    "log_scaling_n_floor": 64,
    "log_scaling_alpha": 0.1,
    "intermediate_size": 24576,
    "moe_intermediate_size": 3072,
    "n_routed_experts": 8,
    "num_experts_per_tok": 6,
    "n_shared_experts": 2,
    "route_scale": 8.0,
    "max_position_embeddings": 4096,
    "conv_kernel_size": 4,
    "logits_mup_width_multiplier": 24.0,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

#: ``--smoke``: the same layer pattern and vocabulary at small widths (a minute's run,
#: to try the script itself).
SMOKE_OVERRIDES: dict[str, Any] = {
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 4,
    "swa_head_dim": 64,
    "sliding_window_size": 32,
    "rel_extent": 64,
    "d_rel": 4,
    "log_scaling_n_floor": 4,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
}

MAX_MODEL_LEN = 2048


def full_width_config(smoke: bool = False) -> dict[str, Any]:
    """The transformers config fields of the checked model."""
    return {**FULL_WIDTH, **(SMOKE_OVERRIDES if smoke else {})}


def default_lengths(config: dict[str, Any]) -> list[int]:
    """Prompt lengths: past the global layers' relative extent, past the sliding
    window (but inside the extent), and two short ones."""
    window, extent = config["sliding_window_size"], config["rel_extent"]
    return [extent + 76, window + 128, 24, 5]


# --- progress and memory -------------------------------------------------------------
class Monitor:
    """Prints timed progress lines and samples memory every 0.5 s: the resident set of
    this process plus all its descendants (vLLM's engine core runs in a child), and
    the machine's used memory (total - available), with a peak per phase."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._me = psutil.Process()
        self.start = time.time()
        self.phase = "start"
        self.phase_start = self.start
        self.phases: dict[str, dict[str, float]] = {}
        self._peak_tree = 0
        self._peak_used = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _tree_rss(self) -> int:
        total = 0
        procs = [self._me]
        try:
            procs += self._me.children(recursive=True)
        except self._psutil.Error:
            pass
        for proc in procs:
            try:
                total += proc.memory_info().rss
            except self._psutil.Error:
                pass
        return total

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            tree = self._tree_rss()
            vm = self._psutil.virtual_memory()
            with self._lock:
                self._peak_tree = max(self._peak_tree, tree)
                self._peak_used = max(self._peak_used, vm.total - vm.available)

    def log(self, message: str) -> None:
        print(f"[{time.time() - self.start:8.1f} s] {message}", flush=True)

    def begin(self, phase: str, message: str) -> None:
        self.phase, self.phase_start = phase, time.time()
        with self._lock:
            self._peak_tree = self._tree_rss()
            vm = self._psutil.virtual_memory()
            self._peak_used = vm.total - vm.available
        self.log(message)

    def end(self, message: str = "") -> float:
        elapsed = time.time() - self.phase_start
        with self._lock:
            tree, used = self._peak_tree, self._peak_used
        self.phases[self.phase] = {
            "seconds": round(elapsed, 1),
            "peak_rss_gib": round(tree / 2**30, 2),
            "peak_machine_used_gib": round(used / 2**30, 2),
        }
        self.log(
            f"{self.phase} done in {elapsed:.1f} s{': ' + message if message else ''} "
            f"(peak RSS of this process tree {tree / 2**30:.2f} GiB, machine used {used / 2**30:.2f} GiB)"
        )
        return elapsed

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


# --- phase 1: the checkpoint ---------------------------------------------------------
def _holder(path: str, module: Any) -> Any:
    """An empty module holding ``module`` at the dotted ``path``, so its parameters
    carry their full transformers names (``model.layers.2.mlp...``)."""
    from torch import nn

    root = nn.Module()
    parent = root
    parts = path.split(".")
    for part in parts[:-1]:
        child = nn.Module()
        parent.add_module(part, child)
        parent = child
    parent.add_module(parts[-1], module)
    return root


def _release_config(config: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """config.json of the release layout (``inkling_mm_model``, text model only)."""
    from inkling_cache import text_spec

    ids = {k: fields[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    text = text_spec(config).to_release_config()
    return {
        "model_type": "inkling_mm_model",
        "architectures": ["InklingForConditionalGeneration"],
        "dtype": "float32",
        **ids,
        "text_config": {**text, **ids, "dtype": "float32"},
    }


def build_checkpoint(path: Path, fields: dict[str, Any], seed: int, mon: Monitor) -> Path:
    """Write the release-layout checkpoint to ``path`` and its transformers-format copy
    to ``path / REFERENCE_DIR``; returns ``path``. Reuses a complete earlier build of
    the same fields and seed."""
    import torch
    from safetensors.torch import save_file
    from transformers import InklingForCausalLM, InklingTextConfig

    from inkling_model.checkpoint import transformers_to_release
    from inkling_vllm.demo.tiny import REFERENCE_DIR, TINY_CONFIG, draw_weights

    marker = {"version": BUILD_VERSION, "seed": seed, "config": fields}
    marker_file = path / BUILD_MARKER
    if marker_file.exists() and json.loads(marker_file.read_text()) == marker:
        mon.log(f"reusing the checkpoint already built in {path}")
        return path
    if path.exists():
        shutil.rmtree(path)
    reference = path / REFERENCE_DIR
    reference.mkdir(parents=True)

    config = InklingTextConfig(**fields)
    config.architectures = ["InklingForCausalLM"]
    config.dtype = "float32"
    with torch.device("meta"):
        skeleton = InklingForCausalLM(config)
    n_params = sum(p.numel() for p in skeleton.parameters())
    mon.log(f"model: {n_params / 1e9:.3f} B parameters, {n_params * 4 / 2**30:.2f} GiB in float32")

    top = ["model.embed_tokens", "model.norm", "lm_head"]
    layers = [f"model.layers.{i}" for i in range(config.num_hidden_layers)]
    pieces = [top] + [[name] for name in layers]
    n_shards = len(pieces)
    gen = torch.Generator().manual_seed(seed)
    # the tiny drawer aims the logits at a spread of 3 / its multiplier; keep that spread
    head_gain = float(fields["logits_mup_width_multiplier"]) / float(TINY_CONFIG["logits_mup_width_multiplier"])
    maps: dict[str, dict[str, str]] = {"reference": {}, "release": {}}
    sizes = {"reference": 0, "release": 0}
    shapes: dict[str, tuple[int, ...]] = {}
    for index, names in enumerate(pieces, start=1):
        t0 = time.time()
        shard = f"model-{index:05d}-of-{n_shards:05d}.safetensors"
        state: dict[str, torch.Tensor] = {}
        for name in names:
            module = skeleton.get_submodule(name)
            module.to_empty(device="cpu")
            holder = _holder(name, module)
            draw_weights(holder, gen, unpadded_vocab=fields["unpadded_vocab_size"])
            if name == "lm_head":
                with torch.no_grad():
                    module.weight.mul_(head_gain)
            state.update({k: v.detach().to(torch.float32).contiguous() for k, v in holder.state_dict().items()})
        shapes.update({k: tuple(v.shape) for k, v in state.items()})
        save_file(state, str(reference / shard), metadata={"format": "pt"})
        release = {k: v.contiguous() for k, v in transformers_to_release(state).items()}
        save_file(release, str(path / shard), metadata={"format": "pt"})
        for kind, tensors in (("reference", state), ("release", release)):
            maps[kind].update({k: shard for k in tensors})
            sizes[kind] += sum(t.numel() * t.element_size() for t in tensors.values())
        del state, release
        for name in names:  # back to meta: free the piece
            skeleton.get_submodule(name).to(device="meta")
        mon.log(f"  shard {index}/{n_shards} ({', '.join(names)}) written in {time.time() - t0:.1f} s")

    expected = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    written = {k: tuple(v) for k, v in shapes.items()}
    if written != expected:  # every tensor of transformers' model, at its shape
        raise AssertionError(
            f"the reference shards differ from InklingForCausalLM's state dict: missing "
            f"{sorted(set(expected) - set(written))[:5]}, extra {sorted(set(written) - set(expected))[:5]}, "
            f"shapes {[k for k in expected if k in written and written[k] != expected[k]][:5]}"
        )
    for kind, folder in (("reference", reference), ("release", path)):
        index_data = {"metadata": {"total_size": sizes[kind]}, "weight_map": dict(sorted(maps[kind].items()))}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index_data, indent=2))
    config.save_pretrained(str(reference))
    (path / "config.json").write_text(json.dumps(_release_config(config, fields), indent=2))
    marker_file.write_text(json.dumps(marker, indent=2))
    return path


# --- phase 2: vLLM -------------------------------------------------------------------
def random_prompts(seed: int, lengths: list[int], vocab: int) -> list[list[int]]:
    """Random token-id prompts (ids 3..vocab-1: no pad/bos/eos)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def run_vllm(path: Path, prompts: list[list[int]], max_tokens: int, mon: Monitor) -> list[dict[str, Any]]:
    """Greedy tokens, prompt logprobs (positions 1..) and generated-token logprobs."""
    mon.begin("vllm_start", "starting the vLLM engine (float32, eager) ...")
    from vllm import LLM, SamplingParams

    from inkling_vllm.demo.diagnostics import shutdown_llm

    llm = LLM(
        model=str(path),
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=4,
        seed=0,
        enforce_eager=True,
        skip_tokenizer_init=True,
        tokenizer_mode="hf",  # token-id prompts: no tokenizer (the Inkling renderer needs one)
    )
    mon.end("engine up")
    mon.begin("vllm_generate", f"generating: {len(prompts)} prompts of {[len(p) for p in prompts]} tokens, "
                               f"greedy {max_tokens} tokens + prompt logprobs ...")
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, prompt_logprobs=1, logprobs=1, detokenize=False
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    records = []
    for prompt, out in zip(prompts, outputs):
        gen = out.outputs[0]
        tokens = list(gen.token_ids)
        records.append(
            {
                "prompt_len": len(prompt),
                "tokens": tokens,
                "prompt_logprobs": [float(out.prompt_logprobs[i][prompt[i]].logprob) for i in range(1, len(prompt))],
                "gen_logprobs": [float(gen.logprobs[i][t].logprob) for i, t in enumerate(tokens)],
            }
        )
    mon.end(f"tokens {[r['tokens'] for r in records]}")
    mon.begin("vllm_shutdown", "shutting the engine down ...")
    shutdown_llm(llm)
    del llm, outputs
    import gc

    gc.collect()
    time.sleep(2)
    mon.end()
    return records


# --- phase 3: transformers -----------------------------------------------------------
def run_reference(path: Path, prompts: list[list[int]], records: list[dict[str, Any]], mon: Monitor) -> dict[str, Any]:
    """transformers' logprobs and greedy tokens for the same sequences, and the verdict
    inputs."""
    import torch

    from inkling_vllm.demo.parity import HfReference
    from inkling_vllm.demo.tiny import reference_checkpoint

    mon.begin("reference_load", "loading the transformers reference (float32) ...")
    ref = HfReference(reference_checkpoint(path))
    mon.end()
    mon.begin("reference_forward", "reference forwards (no cache, one per prompt over prompt + vLLM tokens) ...")
    results = []
    for prompt, rec in zip(prompts, records):
        t0 = time.time()
        gen = rec["tokens"]
        seq = list(prompt) + list(gen)
        logits = ref.logits(seq)
        logp = torch.log_softmax(logits, dim=-1)
        targets = torch.tensor(seq[1:], dtype=torch.long)
        lp = logp[:-1].gather(1, targets[:, None])[:, 0].tolist()
        n = len(prompt)
        rows = logits[n - 1 : n - 1 + len(gen)]
        argmax = rows.argmax(dim=-1).tolist()
        top2 = rows.topk(2, dim=-1).values
        margins = [float(a - b) for a, b in top2.tolist()]
        if argmax == list(gen):
            hf_tokens = list(gen)  # each greedy step agrees, so the whole sequence does
        else:
            mon.log(f"  prompt of {n} tokens: argmax {argmax} differs from vLLM {gen}: recomputing "
                    "transformers' own greedy sequence ...")
            hf_tokens = ref.greedy(prompt, len(gen))
        results.append(
            {
                "hf_tokens": hf_tokens,
                "hf_prompt_logprobs": lp[: n - 1],
                "hf_gen_logprobs": lp[n - 1 :],
                "greedy_margins": margins,
            }
        )
        mon.log(f"  prompt of {n} tokens done in {time.time() - t0:.1f} s")
    mon.end()
    return {"per_prompt": results}


def _max_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder: the checkpoint and results.json (default: <inkling cache>/full-width)")
    parser.add_argument("--keep-checkpoint", action="store_true",
                        help="keep the checkpoint (~19 GiB) after the run; a kept one is reused")
    parser.add_argument("--smoke", action="store_true", help="small widths, same layout (tries the script)")
    parser.add_argument("--lengths", type=str, default=None, help="comma-separated prompt lengths")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--atol", type=float, default=1e-3, help="logprob tolerance")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from inkling_vllm.demo.main import default_cache_dir

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(default_cache_dir() / "vllm"))
    fields = full_width_config(args.smoke)
    out = args.out or default_cache_dir() / ("full-width-smoke" if args.smoke else "full-width")
    out.mkdir(parents=True, exist_ok=True)
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else default_lengths(fields)
    if max(lengths) + args.max_tokens > MAX_MODEL_LEN:
        parser.error(f"prompt length + max tokens must fit max_model_len {MAX_MODEL_LEN}")
    prompts = random_prompts(args.seed + 1, lengths, fields["unpadded_vocab_size"])

    mon = Monitor()
    import torch
    import transformers
    import vllm

    versions = {"vllm": vllm.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                "python": sys.version.split()[0], "cpus": os.cpu_count()}
    mon.log(f"versions {versions}; output {out}")
    checkpoint = out / "checkpoint"
    mon.begin("build", f"building the checkpoint in {checkpoint} ...")
    build_checkpoint(checkpoint, fields, args.seed, mon)
    mon.end()

    records = run_vllm(checkpoint, prompts, args.max_tokens, mon)
    (out / "vllm_records.json").write_text(json.dumps(records))
    reference = run_reference(checkpoint, prompts, records, mon)

    from inkling_vllm.demo.parity import compare_greedy, compare_logprobs

    per = reference["per_prompt"]
    tokens = compare_greedy([r["tokens"] for r in records], [p["hf_tokens"] for p in per])
    vllm_lp = [r["prompt_logprobs"] + r["gen_logprobs"] for r in records]
    hf_lp = [p["hf_prompt_logprobs"] + p["hf_gen_logprobs"] for p in per]
    logprobs = compare_logprobs(vllm_lp, hf_lp, args.atol)
    summary = []
    for prompt, rec, p in zip(prompts, records, per):
        summary.append(
            {
                "prompt_len": len(prompt),
                "vllm_tokens": rec["tokens"],
                "hf_tokens": p["hf_tokens"],
                "tokens_identical": rec["tokens"] == p["hf_tokens"],
                "max_dlogprob_prompt": _max_diff(rec["prompt_logprobs"], p["hf_prompt_logprobs"]),
                "max_dlogprob_generated": _max_diff(rec["gen_logprobs"], p["hf_gen_logprobs"]),
                "min_greedy_margin": min(p["greedy_margins"], default=math.nan),
                "mean_abs_prompt_logprob": sum(abs(x) for x in p["hf_prompt_logprobs"])
                / max(1, len(p["hf_prompt_logprobs"])),
            }
        )
    worst = max(max(s["max_dlogprob_prompt"], s["max_dlogprob_generated"]) for s in summary)
    ok = tokens.ok and logprobs.ok
    mon.close()
    result = {
        "ok": ok,
        "smoke": args.smoke,
        "config": fields,
        "seed": args.seed,
        "max_tokens": args.max_tokens,
        "atol": args.atol,
        "versions": versions,
        "phases": mon.phases,
        "total_seconds": round(time.time() - mon.start, 1),
        "greedy": tokens.detail,
        "logprobs": logprobs.detail,
        "max_abs_dlogprob": worst,
        "per_prompt": summary,
    }
    (out / "results.json").write_text(json.dumps(result, indent=2))

    print("\n=== parity with transformers (float32, released widths) ===")
    for s in summary:
        print(
            f"prompt {s['prompt_len']:5d} tokens: tokens {'identical' if s['tokens_identical'] else 'DIFFER'} "
            f"{s['vllm_tokens']}; max |dlogprob| prompt {s['max_dlogprob_prompt']:.2e}, "
            f"generated {s['max_dlogprob_generated']:.2e}; min greedy margin {s['min_greedy_margin']:.3f}"
        )
    print(f"greedy tokens:            {'OK' if tokens.ok else 'MISMATCH'}  {tokens.detail}")
    print(f"teacher-forced logprobs:  {'OK' if logprobs.ok else 'MISMATCH'}  {logprobs.detail}")
    print(f"phases: {json.dumps(mon.phases)}")
    print(f"results: {out / 'results.json'}")
    print(f"PARITY: {'PASS' if ok else 'FAIL'}")

    if not args.keep_checkpoint:
        shutil.rmtree(checkpoint, ignore_errors=True)
        print(f"removed {checkpoint} (use --keep-checkpoint to keep it)")
    return 0 if ok else 1


if __name__ == "__main__":
    from inkling_vllm.demo.diagnostics import exit_without_teardown

    exit_without_teardown(main())
