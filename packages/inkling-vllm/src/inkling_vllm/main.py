"""The main job: serve a tiny Inkling through vLLM with this plugin, check it
against transformers.

    python -m inkling_vllm.main [--model DIR] [--max-tokens N] [--eager]

Builds the tiny checkpoint (random weights, see :mod:`inkling_vllm.tiny`) into a
cache folder on first run, starts a vLLM engine on it (the plugin registers the
model), sends a few prompts, prints the completions, then prints the parity verdict
against transformers (greedy tokens identical, teacher-forced logprobs within
tolerance). Exit status 0 only when parity holds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

PROMPTS = [
    "Inkling keeps its short-convolution state",
    "a paged sliding-window cache",
    "Hello",
    "The quick brown fox jumps over the lazy dog, then over the sleepy cat, "
    "then over the wall and far away into the hills.",
]
LOGPROB_ATOL = 1e-4


def default_cache_dir() -> Path:
    root = os.environ.get("INKLING_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "inkling-sconv"
    )
    return Path(root)


def ensure_checkpoint(path: Path | None) -> Path:
    """The given checkpoint, or the tiny one (built on first use)."""
    if path is not None:
        return path
    from .tiny import build_tiny_checkpoint

    target = default_cache_dir() / "tiny-inkling"
    if not (target / "model.safetensors").exists() or not (target / "tokenizer.json").exists():
        print(f"building the tiny Inkling checkpoint in {target} ...", flush=True)
        build_tiny_checkpoint(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the tiny model)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--eager", action="store_true", help="enforce_eager (skip torch.compile)")
    args = parser.parse_args(argv)

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(default_cache_dir() / "vllm"))
    model_path = ensure_checkpoint(args.model)

    from vllm import LLM, SamplingParams

    from .diagnostics import shutdown_llm
    from .parity import HfReference, compare_greedy, compare_logprobs

    started = time.time()
    llm = LLM(model=str(model_path), dtype="float32", max_model_len=512, seed=0, enforce_eager=args.eager)
    print(f"vLLM engine up in {time.time() - started:.1f} s (model {model_path})", flush=True)
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(PROMPTS, greedy, use_tqdm=False)
    print("\n=== completions (vLLM, greedy; random weights, so the text is noise) ===")
    for out in outputs:
        print(f"{out.prompt!r}\n  -> {out.outputs[0].text!r}  tokens {list(out.outputs[0].token_ids)}")

    teacher = llm.generate(
        PROMPTS[-1:], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1), use_tqdm=False
    )[0]
    ids = list(teacher.prompt_token_ids)
    vllm_lp = [float(entry[ids[i]].logprob) for i, entry in enumerate(teacher.prompt_logprobs) if i > 0]
    shutdown_llm(llm)

    ref = HfReference(model_path)
    hf_tokens = [ref.greedy(list(o.prompt_token_ids), len(o.outputs[0].token_ids)) for o in outputs]
    tokens = compare_greedy([list(o.outputs[0].token_ids) for o in outputs], hf_tokens)
    logprobs = compare_logprobs([vllm_lp], [ref.token_logprobs(ids)], LOGPROB_ATOL)
    ok = tokens.ok and logprobs.ok
    print("\n=== parity with transformers (float32) ===")
    print(f"greedy tokens:            {'OK' if tokens.ok else 'MISMATCH'}  {tokens.detail}")
    print(f"teacher-forced logprobs:  {'OK' if logprobs.ok else 'MISMATCH'}  {logprobs.detail}")
    print(f"PARITY: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    from .diagnostics import exit_without_teardown

    exit_without_teardown(main())
