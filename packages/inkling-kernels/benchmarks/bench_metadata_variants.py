"""Tuning sweep for the per-step metadata ops (H200): ``sconv_seq_metadata`` by block, ``sconv_tap_map`` by hazard tiles, with the peer's seq metadata as the
yardstick. CUDA-graph replay medians, like bench_sconv.py.

    PYTHONPATH=packages/inkling-kernels/src python3 packages/inkling-kernels/benchmarks/bench_metadata_variants.py \
        --peer-dir .peer --json variants.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_sconv as bs  # noqa: E402  (the case builders and the timer)

from inkling_kernels import SconvBatch, sconv_tap_map_ref  # noqa: E402
from inkling_kernels.seq_metadata.kernel import sconv_seq_metadata_triton  # noqa: E402
from inkling_kernels.tap_map import kernel as tap_map_module  # noqa: E402


def seq_variants(peer: Any, reps: int) -> list[dict[str, Any]]:
    out = []
    for name, lens, pad in [*bs.METADATA_CASES, ("decode 1024", [1] * 1024, 0)]:
        qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        na, r = sum(lens), len(lens)
        npad = na + pad
        seq = torch.empty(npad, dtype=torch.int32, device="cuda")
        qs = torch.empty_like(seq)
        row: dict[str, Any] = dict(case=name, R=r, T=npad)
        for block in (16, 32, 64, 128, 256):
            row[f"block {block}"] = bs.time_graph(
                [lambda b=block: sconv_seq_metadata_triton(qsl, r, na, seq, qs, npad, block=b)] * 20, reps)
        row["default"] = bs.time_graph([lambda: sconv_seq_metadata_triton(qsl, r, na, seq, qs, npad)] * 20, reps)
        if peer is not None:
            ps, pq = torch.empty_like(seq), torch.empty_like(seq)
            row["peer"] = bs.time_graph([lambda: peer.sconv_seq_metadata(qsl, r, na, ps, pq, npad)] * 20, reps)
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def map_variants(reps: int) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    tiles = [(64, 128, 512), (64, 128, 1024), (128, 64, 1024), (128, 64, 2048), (256, 32, 1024),
             (64, 64, 256), (32, 128, 512)]
    default = tap_map_module.hazard_tiles
    out = []
    for case in bs.cases():
        if case.name.startswith("prefill 8192, ATTN") or "tp8" in case.name or "K (global)" in case.name:
            continue  # same metadata as another case
        _, _, sets = bs.build(case, 4, gen)
        row: dict[str, Any] = dict(case=case.name, T=sets[0].x.shape[0])
        want = torch.empty_like(sets[0].tap_map.cpu())
        sconv_tap_map_ref(SconvBatch(*[m.cpu() for m in sets[0].meta], bs.N, bs.W), want)
        for t in [None, *tiles]:
            tap_map_module.hazard_tiles = default if t is None else (lambda n, t=t: t)
            try:
                us = bs.time_graph([lambda s=s: bs.sconv_tap_map(s.batch, s.tap_map) for s in sets], reps)
                ok = torch.equal(sets[0].tap_map.cpu(), want)
                row["default" if t is None else "x".join(map(str, t))] = us if ok else f"WRONG {us:.1f}"
            finally:
                tap_map_module.hazard_tiles = default
        out.append(row)
        print(json.dumps(row), flush=True)
        del sets
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-dir", type=pathlib.Path, default=None)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    peer = bs.load_peer(args.peer_dir)
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               seq_metadata=seq_variants(peer, args.reps), tap_map=map_variants(args.reps))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
