"""Drive InklingShortConv layers through the standalone runtime with random schedules.

A schedule mixes, per step and per request (in a random batch order): prefill
chunks of random length, single-token decodes, speculative rounds (the verified
token plus drafts, of which a random number is rejected: rejected rows carry garbage
inputs and are overwritten on the next step), preemption (all blocks freed, the
request recomputed from position 0) and pad rows at the end of the batch.

Every layer is fed the same schedule; outputs of accepted positions are kept, so a
test compares the collected outputs with a full-sequence reference.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from inkling_model import InklingShortConv, PagedConvRuntime, forward_metadata


@dataclass
class Feed:
    """One layer and, per sequence, its true inputs ``[L_i, dim]``."""

    conv: InklingShortConv
    inputs: Sequence[torch.Tensor]


@dataclass
class ScheduleStats:
    steps: int = 0
    prefill_chunks: int = 0
    decodes: int = 0
    spec_rounds: int = 0
    rejected: int = 0
    preemptions: int = 0
    padded_steps: int = 0
    max_batch: int = 0


def run_schedule(
    runtime: PagedConvRuntime,
    feeds: Sequence[Feed],
    *,
    seed: int,
    spec: bool = True,
    preempt: bool = True,
    pad: bool = True,
    max_chunk: int = 9,
) -> tuple[list[list[torch.Tensor]], ScheduleStats]:
    """Run every sequence to its end; returns ``outputs[feed][seq]`` ``[L_i, dim]``."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    lengths = [int(x.shape[0]) for x in feeds[0].inputs]
    for feed in feeds:
        if [int(x.shape[0]) for x in feed.inputs] != lengths:
            raise ValueError("every feed needs the same sequence lengths")
    outputs = [
        [torch.full_like(x, float("nan")) for x in feed.inputs] for feed in feeds
    ]
    pos = [0] * len(lengths)
    preempted_once = [False] * len(lengths)
    stats = ScheduleStats()
    while any(p < n for p, n in zip(pos, lengths)):
        active = [i for i, (p, n) in enumerate(zip(pos, lengths)) if p < n]
        rng.shuffle(active)
        batch = active[: rng.randint(1, len(active))]
        chunks = []  # (seq, start, total rows, accepted rows)
        for i in batch:
            remaining = lengths[i] - pos[i]
            if preempt and pos[i] > 0 and not preempted_once[i] and rng.random() < 0.15:
                runtime.preempt(i)
                preempted_once[i] = True
                stats.preemptions += 1
                pos[i] = 0
                remaining = lengths[i]
            mode = rng.random()
            if pos[i] == 0 or mode < 0.35:
                n = rng.randint(1, min(max_chunk, remaining))
                chunks.append((i, pos[i], n, n))
                stats.prefill_chunks += 1
            elif not spec or mode < 0.65:
                chunks.append((i, pos[i], 1, 1))
                stats.decodes += 1
            else:
                drafts = rng.randint(1, 3)
                accepted = rng.randint(0, min(drafts, remaining - 1))
                chunks.append((i, pos[i], drafts + 1, accepted + 1))
                stats.spec_rounds += 1
                stats.rejected += drafts - accepted
        num_tokens = sum(c[2] for c in chunks)
        pad_rows = rng.randint(1, 3) if pad and rng.random() < 0.3 else 0
        stats.padded_steps += pad_rows > 0
        stats.steps += 1
        stats.max_batch = max(stats.max_batch, len(chunks))
        step = runtime.step(
            [(i, start, n) for i, start, n, _ in chunks], pad_to=num_tokens + pad_rows
        )
        for f, feed in enumerate(feeds):
            parts = []
            for i, start, n, accepted in chunks:
                true = feed.inputs[i][start : start + accepted]
                rejected = n - accepted
                if rejected:
                    # Rejected drafts: inputs the true sequence never has.
                    garbage = torch.randn(rejected, true.shape[1], generator=gen).to(true.device, true.dtype) * 3
                    true = torch.cat([true, garbage])
                parts.append(true)
            if pad_rows:
                parts.append(
                    torch.randn(pad_rows, feed.inputs[0].shape[1], generator=gen).to(
                        feed.inputs[0].device, feed.inputs[0].dtype
                    )
                )
            x = torch.cat(parts)
            with forward_metadata(step.metadata):
                y = feed.conv(x, step.positions)
            row = 0
            for i, start, n, accepted in chunks:
                outputs[f][i][start : start + accepted] = y[row : row + accepted]
                row += n
        for i, start, n, accepted in chunks:
            pos[i] = start + accepted
    return outputs, stats
