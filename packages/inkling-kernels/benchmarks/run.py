"""The inkling-kernels benchmark: every op against vLLM 0.33.0's peer, one table.

Run from the repository root on a GPU machine::

    python3 packages/inkling-kernels/benchmarks/run.py [--only SUBSTR] [--peer DIR] [--out FILE]

(with the packages installed, or ``PYTHONPATH=packages/inkling-cache/src:packages/inkling-kernels/src``).
Cases (``--list`` prints them; ``_cases.py`` builds them), Inkling 975B shapes, bf16:

- ``sconv``: ``fused_sconv`` on the step's batch with its tap map (decode, speculative
  verify, prefill, chunked prefill, mixed batches in both orders; ATTN / K streams);
- ``sconv_seq_metadata``: the per-step metadata op;
- ``sconv_kv``: ``fused_sconv_kv`` (K and V in one launch on the slices of qkv), global
  and sliding layers at TP 1 and the TP 8 shard;
- ``sconv_add_rmsnorm``: ``fused_sconv_add_rmsnorm`` (ATTN conv + residual add + RMSNorm);
- ``layer``: one decoder layer's conv work (K+V, ATTN and MLP with their add + norm; at
  TP > 1 ``fused_sconv_add`` and the norm of the gathered row, collectives excluded),
  the step's tap map build amortised over the 11 layers sharing it;
- ``layer+gather``: the TP 8 layer with each side's all-gather work on the GPU besides
  the transfer: ours reads the gathered ``[tp, T, S]`` pieces (``gathered_rms_norm``, the
  served model's path), the peer first copies them into rows as vLLM's
  ``all_gather(dim=-1)`` does;
- ``gathered_rms_norm``: the norm of all-gathered pieces at TP 2 and 8;
- ``rel_attention``: ``paged_rel_attention_triton`` at long context, prefill, mixed and
  sliding-window shapes.

The peer is vLLM 0.33.0's in-tree Inkling Triton module (``fused_sconv``,
``sconv_seq_metadata``), extracted from the official wheel by ``fetch_peer.py`` into an
ignored folder (``--peer``, default ``.peer`` at the repository root) and timed in the
same process; the sequences it would run where it has no fused op (two launches and the
``.contiguous()`` copies for K+V, the unfused add + RMSNorm: the faster of ``F.rms_norm``
and a torch.compile'd one; a layer at TP > 1 in both arrangements, the add + RMSNorm of
full rows and ours, the add on the shard and the RMSNorm of the gathered row, the faster
reported). Attention's peer column is torch's flash SDPA without the
bias (the floor; vLLM has no relative-logit attention), and for a sliding-window decode
batch also a compiled FlexAttention with the bias as a ``score_mod`` on each window
gathered dense (the faster of the two reported). Without the peer module the conv
cases' peer columns stay empty.

Timing: each case builds several independent input sets (>= 256 MB in all, beyond the
60 MB L2), captures one CUDA graph launching the op once per set, and reports the median
over ``--reps`` replays (CUDA events) divided by the number of sets; ``--hot`` replays
one set instead (L2-resident when it fits). The copy baseline is a plain loop of
``copy_`` calls over a 2 GiB bf16 buffer between CUDA events (read + write bytes; its
rate heads each results file); "of copy" is the case's minimum bytes per second over it. Every
case checks our output on its first set against the fp32 reference before timing; a
case that fails (or raises) is marked FAIL and the exit status is 1.

``--attention-config FIELD=VALUE,...`` (repeatable) makes the ``rel_attention`` cases
also time each given ``RelAttentionConfig`` tiling, after checking its output against
the reference: a tile sweep on the runner's own inputs. Each tiling's time is printed
and kept in the JSON (``ours_variants_us``); the table reports the fastest.

``--host`` times the host instead: the median wall-clock µs per eager call over
back-to-back calls of the case's launches (no graph, no synchronisation inside a pass),
ours and the peer's sequence: what an engine pays for each launch it makes from Python
(between the pieces of a piecewise-captured graph, in an eager drafter). With ``--smoke``
on CPU, the Triton launches are replaced by no-ops after each case's check, so only the
Python work up to the launch is timed (the interpreter would dominate otherwise).

On CPU, ``--smoke`` runs tiny shapes of every group with the Triton kernels under the
interpreter (``TRITON_INTERPRET=1``, set here), wall-clock timed: it exercises the cases,
not the device.

Results go to ``--out`` (``.json`` for JSON, else markdown), by default
``packages/inkling-kernels/benchmarks/out/results-<UTC time>.md`` (ignored by git).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Optional

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]

if "--smoke" in sys.argv:  # before Triton is imported: the kernels run under the interpreter
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["INKLING_KERNELS_CPU_BACKEND"] = "triton"

import torch  # noqa: E402

sys.path.insert(0, str(HERE))
import _cases  # noqa: E402

PEER_MODULE = "vllm_sconv_peer.py"  # written by fetch_peer.py
COPY_BYTES = 2 << 30  # the copy baseline's buffer (bf16)
COPY_LOOP, COPY_LOOPS = 20, 5  # copies between one pair of events, loops (median)


def load_peer(peer_dir: Optional[pathlib.Path]) -> tuple[Any, str]:
    """The peer module from ``peer_dir`` and its provenance line, or ``(None, why)``."""
    if peer_dir is None:
        return None, "none"
    path = peer_dir / PEER_MODULE
    if not path.exists():
        return None, f"none ({path} not found: run fetch_peer.py)"
    spec = importlib.util.spec_from_file_location("vllm_sconv_peer", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    prov = peer_dir / "PROVENANCE.txt"
    return mod, ("; ".join(prov.read_text().split("\n")).strip("; ") if prov.exists() else PEER_MODULE)


# ----------------------------------------------------------------------------- timing


def time_graph(launches: list[Callable[[], Any]], reps: int, fresh: bool = False) -> float:
    """Median µs per launch over ``reps`` replays of one CUDA graph holding every launch
    (CUDA events around each replay), after a warm-up outside the capture: on the
    capturing stream, or (``fresh``) on the default stream with the capture on another
    stream that ran nothing before it, as an engine that picks its own capture stream."""
    s = torch.cuda.Stream()
    warm = torch.cuda.current_stream() if fresh else s
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for f in launches:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    if fresh:
        s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for f in launches:
            f()
    for _ in range(3):
        g.replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    ms = statistics.median(a.elapsed_time(b) for a, b in ev)
    del g
    return ms * 1000.0 / len(launches)


def time_wall(launches: list[Callable[[], Any]], reps: int) -> float:
    """CPU (smoke): median wall-clock µs per launch over ``reps`` passes."""
    for f in launches:
        f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for f in launches:
            f()
        times.append((time.perf_counter() - t0) * 1e6 / len(launches))
    return statistics.median(times)


def time_host(launches: list[Callable[[], Any]], reps: int) -> float:
    """Host µs per eager call: median over ``reps`` passes of the wall clock of calling
    every launch back to back (at least 200 calls a pass); the device is synchronised
    between passes, not inside one."""
    calls = launches * max(1, -(-200 // len(launches)))
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    for f in calls:
        f()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for f in calls:
            f()
        times.append((time.perf_counter() - t0) * 1e6 / len(calls))
    if cuda:
        torch.cuda.synchronize()
    return statistics.median(times)


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def without_triton_launches() -> Callable[[], None]:
    """Replace every Triton kernel of the loaded ``inkling_kernels`` modules with
    :class:`_NoLaunch`; returns the function that puts them back."""
    from triton.runtime.jit import KernelInterface  # compiled and interpreted kernels alike

    saved = []
    for name, module in list(sys.modules.items()):
        if name.startswith("inkling_kernels") and module is not None:
            for attr, value in list(vars(module).items()):
                if isinstance(value, KernelInterface):
                    saved.append((module, attr, value))
                    setattr(module, attr, _NoLaunch())

    def restore() -> None:
        for module, attr, value in saved:
            setattr(module, attr, value)

    return restore


def copy_baseline(cuda: bool) -> float:
    """GB/s (read + write) of ``b.copy_(a)``: COPY_LOOPS loops of COPY_LOOP copies of a
    2 GiB bf16 buffer, each loop between CUDA events (no graph: a captured copy becomes a
    copy-engine node, slower than the copy kernel), the median loop. CPU: 8 MiB, wall clock."""
    nbytes = COPY_BYTES if cuda else 8 << 20
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda" if cuda else "cpu")
    a.view(torch.uint8).random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    us = []
    for _ in range(COPY_LOOPS):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(COPY_LOOP):
                b.copy_(a)
            end.record()
            torch.cuda.synchronize()
            us.append(start.elapsed_time(end) * 1000.0 / COPY_LOOP)
        else:
            t0 = time.perf_counter()
            for _ in range(COPY_LOOP):
                b.copy_(a)
            us.append((time.perf_counter() - t0) * 1e6 / COPY_LOOP)
    del a, b
    if cuda:
        torch.cuda.empty_cache()
    return 2 * nbytes / (statistics.median(us) * 1e-6) / 1e9


# ----------------------------------------------------------------------------- running


def run_case(case: _cases.Case, env: _cases.Env, timer: Callable[..., float], reps: int, hot: bool,
             copy_gbps: float, stub_launches: bool = False) -> dict[str, Any]:
    """Build, check and time one case; a failure is recorded, not raised.
    ``stub_launches``: time with the Triton launches replaced by no-ops (after the check)."""
    row: dict[str, Any] = dict(case=case.name, group=case.group, peer_label=case.peer_label, ok=False)
    restore: Callable[[], None] = lambda: None  # noqa: E731
    prep: Optional[_cases.Prepared] = None
    try:
        prep = case.prepare(env)
        row["sets"] = len(prep.ours)
        if stub_launches:
            restore = without_triton_launches()

        def t(launches: list[Callable[[], Any]]) -> float:
            return timer([launches[0]] * 16 if hot else launches, reps)

        ours = {"default": t(prep.ours), **{k: t(v) for k, v in prep.ours_alt.items()}}
        row["ours_variants_us"] = ours
        row["ours_variant"] = min(ours, key=ours.__getitem__)
        row["ours_us"] = ours[row["ours_variant"]]
        if prep.amortised is not None:
            row["amortised_us"] = t(prep.amortised)
            row["ours_us"] += row["amortised_us"] / prep.amortise_over
            row["amortise_over"] = prep.amortise_over
        if prep.peer and not stub_launches:  # (a stubbed run times no peer: its torch ops would compute)
            peer = {k: t(v) for k, v in prep.peer.items()}
            row["peer_variant"] = min(peer, key=peer.__getitem__)
            row["peer_us"] = peer[row["peer_variant"]]
            row["ratio"] = row["peer_us"] / row["ours_us"]
        row["bytes"] = prep.nbytes
        row["of_copy"] = None if copy_gbps <= 0 else prep.nbytes / (row["ours_us"] * 1e-6) / 1e9 / copy_gbps
        row["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported in the table, exit status 1
        row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        traceback.print_exc()
    finally:
        restore()
    if env.device.type == "cuda":
        # the case's inputs and graphs sit in reference cycles (the launch closures):
        # collect them before the next case allocates, or its inputs land beside them
        # (the 17 GB sliding-decode cache then read 15 % slower through its pages)
        prep = None
        gc.collect()
        torch.cuda.empty_cache()
    return row


def _f(v: Any, fmt: str) -> str:
    return "—" if v is None else fmt.format(v)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | µs | peer µs | peer / ours | of copy | peer |", "|---|---|---|---|---|---|"]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['case']} | **FAIL** | | | | {r.get('error', '')} |")
            continue
        lines.append(f"| {r['case']} | {r['ours_us']:.2f} | {_f(r.get('peer_us'), '{:.2f}')} | "
                     f"{_f(r.get('ratio'), '{:.2f}x')} | {_f(r.get('of_copy'), '{:.2f}')} | "
                     f"{r.get('peer_variant', '—')} |")
    return "\n".join(lines)


def versions() -> dict[str, str]:
    import triton

    out = dict(python=platform.python_version(), torch=torch.__version__, triton=triton.__version__,
               cuda=str(torch.version.cuda))
    try:
        import inkling_kernels

        out["inkling_kernels"] = inkling_kernels.__version__
    except AttributeError:
        pass
    return out


def attention_config(spec: str) -> Any:
    """A ``RelAttentionConfig`` from ``"field=value,..."`` (integers, ``true`` /
    ``false``, ``none``, or text such as ``bias=row``); raises ValueError naming what is
    wrong."""
    import dataclasses

    from inkling_kernels.rel_attention.kernel import RelAttentionConfig

    known = {f.name for f in dataclasses.fields(RelAttentionConfig)}
    fields: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(f"{item!r} is not FIELD=VALUE with FIELD one of {', '.join(sorted(known))}")
        text = value.strip()
        low = text.lower()
        fields[name] = (None if low == "none" else low == "true" if low in ("true", "false")
                        else int(text) if text.lstrip("-").isdigit() else text)
    try:
        return RelAttentionConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{spec!r}: {exc}") from None


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="substring of case names ('|' separates alternatives)")
    ap.add_argument("--peer", type=pathlib.Path, default=REPO / ".peer",
                    help="folder holding vllm_sconv_peer.py (fetch_peer.py writes it; default: .peer at the "
                         "repository root)")
    ap.add_argument("--out", type=pathlib.Path, default=None, help="results file (.json or markdown)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the inputs and the cache blocks' placement")
    ap.add_argument("--reps", type=int, default=None, help="graph replays per timing (default 50; smoke 3)")
    ap.add_argument("--hot", action="store_true", help="replay one input set (L2-resident when it fits)")
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile'd norms (peer and TP > 1 ours)")
    ap.add_argument("--capture", choices=["warmed", "fresh"], default="warmed",
                    help="fresh: capture on a stream that ran nothing before (warm-up on another)")
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, tiny shapes")
    ap.add_argument("--host", action="store_true",
                    help="time the host's µs per eager call (with --smoke: launches replaced by no-ops)")
    ap.add_argument("--attention-config", action="append", default=[], metavar="FIELD=VALUE,...",
                    help="a RelAttentionConfig tiling the rel_attention cases also time, after checking its "
                         "output (e.g. block_q=1,block_n=32,bias=row,num_warps=4); repeat for several: each "
                         "time is printed and kept in the JSON, the fastest of the default and them reported")
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    args = ap.parse_args(argv)
    try:
        tilings = {spec: attention_config(spec) for spec in args.attention_config}
    except ValueError as exc:
        ap.error(f"--attention-config: {exc}")
    sizes = _cases.SMOKE if args.smoke else _cases.FULL
    cases = [c for c in _cases.registry(sizes)
             if not args.only or any(part in c.name for part in args.only.split("|"))]
    if args.list:
        print("\n".join(f"{c.name}   [peer: {c.peer_label}]" for c in cases))
        return 0
    if not cases:
        ap.error(f"--only {args.only!r} matches no case (--list prints them)")
    cuda = not args.smoke
    if cuda and not torch.cuda.is_available():
        ap.error("no CUDA device: run on a GPU machine, or --smoke on CPU")
    torch.manual_seed(args.seed)
    peer, provenance = load_peer(args.peer) if cuda else (None, "none (smoke)")
    env = _cases.Env(sizes, torch.device("cuda" if cuda else "cpu"), peer,
                     torch.Generator().manual_seed(args.seed), compile_norm=cuda and not args.no_compile,
                     attention_configs=tilings)
    reps = args.reps or (50 if cuda else 3)
    meta: dict[str, Any] = dict(
        device=torch.cuda.get_device_name() if cuda else "cpu (smoke: Triton interpreter)",
        versions=versions(), peer=provenance,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command="python3 packages/inkling-kernels/benchmarks/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        seed=args.seed, reps=reps, hot=args.hot, capture=args.capture)
    meta["copy_GBps"] = 0.0 if args.host else copy_baseline(cuda)
    meta["host"] = args.host
    print(f"{meta['device']}; {meta['versions']}; peer: {provenance}; copy {meta['copy_GBps']:.0f} GB/s"
          + ("; host time per eager call" if args.host else ""), flush=True)
    rows = []
    if args.host:
        timer: Callable[..., float] = time_host
    else:
        timer = functools.partial(time_graph, fresh=args.capture == "fresh") if cuda else time_wall
    for case in cases:
        r = run_case(case, env, timer, reps, args.hot, meta["copy_GBps"], stub_launches=args.host and not cuda)
        rows.append(r)
        print(f"{case.name}: " + (f"{r['ours_us']:.2f} µs" + (f", peer {r['peer_us']:.2f} ({r['ratio']:.2f}x)"
                                                              if "peer_us" in r else "") if r["ok"]
                                  else f"FAIL {r.get('error')}"), flush=True)
        variants = r.get("ours_variants_us", {})
        if len(variants) > 1:
            for label, us in variants.items():
                print(f"    {label}: {us:.2f} µs", flush=True)
    md = table(rows)
    print(md)
    out = args.out or HERE / "out" / f"results-{meta['date'].replace(':', '')[:15]}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".json":
        out.write_text(json.dumps(dict(meta, cases=rows), indent=1))
    else:
        head = [f"- device: {meta['device']}",
                "- versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
                f"- peer: {provenance}", f"- date: {meta['date']}", f"- command: `{meta['command']}`",
                (f"- copy baseline: {meta['copy_GBps']:.0f} GB/s (read + write)" if not args.host else
                 "- host time per eager call" + ("" if cuda else " (Triton launches replaced by no-ops)")),
                f"- timing: {'one set replayed (hot)' if args.hot else 'input sets beyond L2 (cold)'}, "
                f"median of {reps} {'passes' if args.host else 'replays'}",
                f"- capture: {'on a fresh stream' if args.capture == 'fresh' else 'on the warmed-up stream'}"]
        out.write_text("\n".join(head) + "\n\n" + md + "\n")
    print(f"results: {out}")
    failed = [r["case"] for r in rows if not r["ok"]]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
