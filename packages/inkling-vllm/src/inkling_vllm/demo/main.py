"""The main job: serve an Inkling checkpoint through vLLM with the inkling-vllm plugin
and check it against transformers.

    python -m inkling_vllm.demo.main [--model DIR] [--max-tokens N] [--eager] [--verbose]

(``hatch run main [options]`` runs it in the vllm environment.) Steps, each announced
as it starts: check the checkpoint folder (or build the tiny one), start vLLM, generate,
compare with transformers. Exit status 0 when parity holds, 1 when it does not, 2 when
the checkpoint folder cannot be served (one short message, before any engine starts), 3
when the vLLM engine does not start (one line; ``--verbose`` adds the traceback).
The ``--help`` text is :data:`DESCRIPTION`; the quiet default is :mod:`.quiet`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import quiet
from .tiny import default_cache_dir

__all__ = ["DESCRIPTION", "PROG", "default_cache_dir", "main", "tiny_checkpoint_dir"]

PROG = "python -m inkling_vllm.demo.main"

DESCRIPTION = """\
Serve an Inkling checkpoint through vLLM with the inkling-vllm plugin, send a few
prompts, and check the result against transformers' Inkling (the reference
implementation): greedy tokens must be identical and teacher-forced log-probabilities
within 1e-4 (float32). "hatch run main [options]" runs this in the vllm environment.

Without --model it uses a tiny random-weight Inkling with every feature on (relative
logits, log scaling, MoE with shared sink experts, a dense first layer, a padded
vocabulary; release layout), built on first run into the cache folder below. Its
completions are noise: the weights are random; the parity verdict is the point.

--model DIR serves your own checkpoint: a local folder holding config.json (model_type
inkling_mm_model or inkling_model: release layout; inkling_text: transformers' layout),
*.safetensors weights (not quantised: this runs float32) and their tokenizer
(tokenizer.json or tokenizer.model). The folder is checked first (config fields, the
plugin's settings, tensor names and shapes from the safetensors headers) and refused
with a short message if it cannot be served. Nothing is written into it: for a release-layout folder, the transformers-format
copy that the parity check loads goes to the cache folder.

Cache folder: ~/.cache/inkling-sconv ($INKLING_CACHE_DIR overrides it; $XDG_CACHE_HOME
moves ~/.cache). It holds the tiny checkpoint, transformers-format copies of release
checkpoints (transformers-reference/), and vLLM's compile cache (vllm/).

Exit status: 0 parity holds, 1 it does not, 2 the checkpoint cannot be served, 3 the
vLLM engine did not start.
"""

PROMPTS = [
    "Inkling keeps its short-convolution state",
    "a paged sliding-window cache",
    "Hello",
    "The quick brown fox jumps over the lazy dog, then over the sleepy cat, "
    "then over the wall and far away into the hills.",
]
LOGPROB_ATOL = 1e-4
STEPS = 4
#: exit status when the vLLM engine does not start
ENGINE_FAILED = 3

# Re-exported for scripts that import them from here.
QUIET_ENV = quiet.QUIET_ENV
CPU_NOTICES = quiet.CPU_NOTICES

quiet.apply_in_child()  # a process vLLM spawned for a quiet run imports this module again


def tiny_checkpoint_dir() -> Path:
    """Where the main job keeps the tiny checkpoint (the README's serving example uses it)."""
    from .tiny import TINY_FORMAT_VERSION

    return default_cache_dir() / f"tiny-inkling-release-v{TINY_FORMAT_VERSION}"


def _step(n: int, text: str) -> float:
    print(f"[{n}/{STEPS}] {text}", flush=True)
    return time.time()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", type=Path, default=None, metavar="DIR",
        help="local checkpoint folder (config.json + *.safetensors); default: the tiny model",
    )
    parser.add_argument("--max-tokens", type=_positive_int, default=16, metavar="N",
                        help="tokens generated per prompt (default 16)")
    parser.add_argument("--eager", action="store_true", help="skip torch.compile (vLLM's enforce_eager)")
    parser.add_argument("--verbose", action="store_true",
                        help="show vLLM's and transformers' own logs and shutdown messages in full")
    return parser


def checkpoint_features(spec: Any, longest_prompt: int) -> list[str]:
    """One line per Inkling feature the checkpoint of ``spec`` (an
    ``inkling_cache.InklingTextSpec``) uses, as served to prompts of up to
    ``longest_prompt`` tokens."""
    out = []
    sliding, full = spec.sliding_layers, spec.global_layers
    reach = "past" if longest_prompt > spec.sliding_window else "within"
    if sliding:
        out.append(f"sliding-window attention (window {spec.sliding_window}) on {len(sliding)} layers, "
                   f"global on {len(full)}; longest prompt {longest_prompt} tokens ({reach} the window)")
    else:
        out.append(f"global attention on all {len(full)} layers")
    rel = f"relative logits (d_rel {spec.d_rel}"
    out.append(rel + (f", reaching {spec.rel_extent} tokens back on global layers)" if full else ")"))
    if spec.log_scaling_n_floor is not None and full:
        out.append(f"log scaling of the global layers' logits from position {spec.log_scaling_n_floor} "
                   f"(alpha {spec.log_scaling_alpha})")
    if spec.moe_layers:
        out.append(f"MoE on {len(spec.moe_layers)} layers: {spec.n_routed_experts} routed experts, "
                   f"top-{spec.num_experts_per_tok}, {spec.n_shared_experts} shared sink experts; "
                   f"dense MLP on {len(spec.dense_layers)}")
    if spec.padded:
        out.append(f"padded vocabulary: {spec.vocab_size} rows, {spec.unpadded_vocab_size} sampled")
    out.append(f"short convs (kernel {spec.conv_kernel_size}) in every layer; checkpoint in the "
               f"{spec.layout} layout")
    return out


def _refuse(path: Path) -> int | None:
    """Exit status 2 with the folder's problems printed, or None when it can be served."""
    from .preflight import check_checkpoint_dir, format_problems

    problems = check_checkpoint_dir(
        path, quantised=False,
        absent_hint="--model takes a local checkpoint folder (config.json + *.safetensors); leave --model "
                    "out to run the built-in tiny model",
    )
    if not problems:
        return None
    print(format_problems(path, problems), file=sys.stderr, flush=True)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run the main job on ``argv`` (default: the command line); returns the exit status."""
    args = _build_parser().parse_args(argv)
    started = _step(1, "checking the checkpoint folder" if args.model else "preparing the tiny checkpoint")
    if args.model is not None:
        model_path = args.model.expanduser()
        refused = _refuse(model_path)
        if refused is not None:
            return refused
    else:
        model_path = tiny_checkpoint_dir()
        if not (model_path / "model.safetensors").exists() or not (model_path / "tokenizer.json").exists():
            from .tiny import build_tiny_checkpoint

            print(f"      building it in {model_path} (first run only) ...", flush=True)
            build_tiny_checkpoint(model_path, variant="release")
    from inkling_cache import text_spec

    spec = text_spec(model_path)
    print(f"      {model_path}: Inkling, {spec.num_hidden_layers} layers, hidden {spec.hidden_size} "
          f"({spec.layout} layout) [{time.time() - started:.1f} s]", flush=True)

    if not args.verbose:
        quiet.quiet_environment()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(default_cache_dir() / "vllm"))
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # LLM.apply_model below

    started = _step(2, "starting vLLM with the inkling-vllm plugin (about a minute on CPU"
                    + ("" if args.verbose else "; --verbose shows vLLM's logs") + ") ...")
    from vllm import LLM, SamplingParams

    from .diagnostics import describe_served_model, shutdown_llm
    from .parity import HfReference, compare_greedy, compare_logprobs

    try:
        llm = LLM(
            model=str(model_path), dtype="float32", max_model_len=512, seed=0, enforce_eager=args.eager,
            use_tqdm_on_load=args.verbose,
        )
    except Exception as exc:  # noqa: BLE001 - one line and exit status 3 (--verbose: the traceback too)
        if args.verbose:
            traceback.print_exc()
        print(f"the vLLM engine did not start: {type(exc).__name__}: {exc}"
              + ("" if args.verbose else " (--verbose shows vLLM's logs and the traceback)"),
              file=sys.stderr, flush=True)
        return ENGINE_FAILED
    served = llm.apply_model(describe_served_model)[0]
    print(f"      engine up [{time.time() - started:.1f} s]", flush=True)

    started = _step(3, f"generating: {len(PROMPTS)} prompts, {args.max_tokens} greedy tokens each ...")
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(PROMPTS, greedy, use_tqdm=False)
    teacher = llm.generate(
        PROMPTS[-1:], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1), use_tqdm=False
    )[0]
    ids = list(teacher.prompt_token_ids)
    vllm_lp = [float(entry[ids[i]].logprob) for i, entry in enumerate(teacher.prompt_logprobs) if i > 0]
    shutdown_llm(llm)
    print(f"      done [{time.time() - started:.1f} s]")
    print("\n=== completions (vLLM, greedy) ===")
    for out in outputs:
        print(f"{out.prompt!r}\n  -> {out.outputs[0].text!r}  tokens {list(out.outputs[0].token_ids)}")
    print(flush=True)

    started = _step(4, "checking parity against transformers (float32, without a KV cache; a line per prompt) ...")
    from .tiny import REFERENCE_DIR, reference_checkpoint

    reference = reference_checkpoint(model_path)
    if reference not in (model_path, model_path / REFERENCE_DIR):
        print(f"      transformers-format copy of the weights: {reference}", flush=True)
    ref = HfReference(reference)
    hf_tokens = []
    for i, o in enumerate(outputs):
        hf_tokens.append(ref.greedy(list(o.prompt_token_ids), len(o.outputs[0].token_ids)))
        print(f"      greedy {i + 1}/{len(outputs)} [{time.time() - started:.0f} s]", flush=True)
    tokens = compare_greedy([list(o.outputs[0].token_ids) for o in outputs], hf_tokens)
    logprobs = compare_logprobs([vllm_lp], [ref.token_logprobs(ids)], LOGPROB_ATOL)
    ok = tokens.ok and logprobs.ok

    managers = sorted({layer["conv_manager"] for layer in served["layers"]})
    longest = max(len(o.prompt_token_ids) for o in outputs)
    print("\n=== summary ===")
    if served["plugin"]:
        print(f"served by:        the inkling-vllm plugin ({served['class']}); conv state held by "
              f"the {'/'.join(managers)} manager")
    else:
        print(f"served by:        {served['class']} (NOT the inkling-vllm plugin: vLLM's in-tree model)")
    for i, line in enumerate(checkpoint_features(spec, longest)):
        print(f"{'features:' if i == 0 else '':<18}{line}")
    print(f"greedy tokens:    {'identical' if tokens.ok else 'MISMATCH'}: {tokens.detail}")
    print(f"teacher-forced:   {'OK' if logprobs.ok else 'MISMATCH'}: {logprobs.detail}")
    print(f"PARITY: {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    from .diagnostics import exit_without_teardown

    exit_without_teardown(main())
