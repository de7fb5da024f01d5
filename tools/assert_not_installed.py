"""Fail when any of the named modules is importable in the running environment.

Used by hatch environments that promise a package works without heavy
dependencies (``inkling-cache`` must run with no torch, numpy, triton or vllm).
"""

from __future__ import annotations

import importlib.util
import sys


def main(argv: list[str]) -> int:
    present = [name for name in argv if importlib.util.find_spec(name) is not None]
    if present:
        print(f"environment must not contain {', '.join(present)}", file=sys.stderr)
        return 1
    print(f"ok: none of {', '.join(argv)} is installed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
