"""Draft with the MTP head only while its drafts are accepted.

Every drafted token costs a drafter step and a verification row of the target model;
when the head's drafts are rejected (a head trained for another model, random weights,
text it cannot predict) speculative decoding makes decoding slower. vLLM's scheduler
already chooses each step's draft count through a lookup by batch size (its dynamic
speculative decoding, ``num_speculative_tokens_per_batch_size``), and on a step given
0 drafts the proposer still runs its first forward, so the drafter's own KV cache and
conv state stay complete and drafting can resume at any step.

:class:`DraftGate` takes that lookup's place for engines drafting with the Inkling MTP
head: it answers the schedule's count while the drafts' recent acceptance (accepted /
drafted over the last :attr:`DraftGate.window` drafted tokens) is at least
``min_acceptance``, and 0 otherwise, except for one probe step in every
:attr:`DraftGate.probe_every` that drafts again to measure whether acceptance has come
back. It learns acceptance from vLLM's own per-request accounting of each verified
step. Greedy and sampled outputs are unchanged: only how many tokens are drafted is.

``INKLING_MTP_MIN_ACCEPTANCE`` sets the threshold (default
:data:`DEFAULT_MIN_ACCEPTANCE`; ``0`` keeps vLLM's behaviour, drafting at every step).

A step given 0 drafts verifies one row per request, not the ``1 + k`` of vLLM's
uniform decode batches, for which vLLM captures no full CUDA graph: under
``FULL_AND_PIECEWISE`` it would replay piecewise graphs, under ``FULL_DECODE_ONLY`` run
eagerly (3-6x the step time of drafting at every step on an H200: 16 released-width
layers, acceptance 0, decode of 1 and 64 requests). Gated engines therefore capture
full graphs for one-row decode batches too (:mod:`inkling_vllm.one_row_graphs`); an
engine that cannot (:func:`~inkling_vllm.one_row_graphs.one_row_graphs_wanted`) gets no
gate under ``FULL_DECODE_ONLY`` (:func:`paused_steps_lose_graphs`).
"""

from __future__ import annotations

import functools
import logging
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

__all__ = [
    "DEFAULT_MIN_ACCEPTANCE",
    "MIN_ACCEPTANCE_ENV",
    "DraftGate",
    "gate_for",
    "install_draft_gate_hook",
    "min_acceptance",
    "paused_steps_lose_graphs",
]

logger = logging.getLogger(__name__)

#: The environment variable that sets :class:`DraftGate`'s threshold.
MIN_ACCEPTANCE_ENV = "INKLING_MTP_MIN_ACCEPTANCE"
#: Below this share of accepted drafts the gate stops drafting. A step with k drafts
#: costs the drafter's k forwards and k more verification rows per request (one draft
#: a step at acceptance 0 cost 10-34 % of the decode throughput at 16 released-width
#: layers on an H200, more at fewer layers), which a quarter of the drafts accepted
#: about pays for; a working head (0.7-0.9 accepted) stays far above it.
DEFAULT_MIN_ACCEPTANCE = 0.25


def min_acceptance(environ: dict[str, str] | None = None) -> float:
    """The threshold from ``INKLING_MTP_MIN_ACCEPTANCE`` (default
    :data:`DEFAULT_MIN_ACCEPTANCE`); raises ``ValueError`` naming the variable for a
    value that is not a number in [0, 1]."""
    raw = (os.environ if environ is None else environ).get(MIN_ACCEPTANCE_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_MIN_ACCEPTANCE
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{MIN_ACCEPTANCE_ENV}={raw!r}: expected a share of accepted drafts in [0, 1] "
                         f"(0 drafts at every step)")
    return value


class DraftGate(Sequence[int]):
    """vLLM's per-batch-size draft count (``schedule[batch_size]``), or 0 while recent
    drafts are mostly rejected (see the module docstring).

    ``schedule``: the counts by batch size (index 0 unused), vLLM's dense lookup.
    :meth:`observe` takes each verified request-step (drafted, accepted);
    ``self[batch_size]`` is asked once per scheduled step. The estimate needs at least
    ``min_drafts`` drafted tokens before it may switch drafting off; switching off
    forgets the window, so the decision to switch back on rests on probe steps only.
    """

    def __init__(self, schedule: Sequence[int], min_acceptance: float, *, window: int = 128, min_drafts: int = 32,
                 probe_every: int = 16) -> None:
        if not 0.0 <= min_acceptance <= 1.0:
            raise ValueError(f"min_acceptance must be in [0, 1], got {min_acceptance}")
        if not 1 <= min_drafts <= window or probe_every < 1:
            raise ValueError(f"need 1 <= min_drafts ({min_drafts}) <= window ({window}) and probe_every >= 1 "
                             f"({probe_every})")
        self.schedule = list(schedule)
        self.min_acceptance = float(min_acceptance)
        self.window = window
        self.min_drafts = min_drafts
        self.probe_every = probe_every
        self.drafting = True
        self._seen: deque[tuple[int, int]] = deque()
        self._drafted = 0
        self._accepted = 0
        self._steps_off = 0
        #: scheduled steps given 0 drafts by the gate (not by the schedule)
        self.gated_steps = 0
        #: drafted and accepted tokens observed since the engine started
        self.total_drafted = 0
        self.total_accepted = 0

    # --- the lookup vLLM's scheduler reads ------------------------------------------
    def __len__(self) -> int:
        return len(self.schedule)

    def __getitem__(self, batch_size: Any) -> Any:
        if not isinstance(batch_size, int):
            return self.schedule[batch_size]
        k = self.schedule[batch_size]
        if self.drafting or k == 0:
            return k
        self._steps_off += 1
        if self._steps_off % self.probe_every == 0:
            return k  # a probe: measure whether drafts are accepted again
        self.gated_steps += 1
        return 0

    # --- what vLLM reports -----------------------------------------------------------
    @property
    def acceptance(self) -> float | None:
        """Accepted / drafted over the window (None before any draft)."""
        return self._accepted / self._drafted if self._drafted else None

    def observe(self, drafted: int, accepted: int) -> None:
        """One request's verified step: ``drafted`` tokens proposed, ``accepted`` of
        them kept."""
        if drafted <= 0:
            return
        accepted = min(max(accepted, 0), drafted)
        self.total_drafted += drafted
        self.total_accepted += accepted
        self._seen.append((drafted, accepted))
        self._drafted += drafted
        self._accepted += accepted
        while self._drafted - self._seen[0][0] >= self.window:
            d, a = self._seen.popleft()
            self._drafted -= d
            self._accepted -= a
        if self._drafted < self.min_drafts:
            return
        rate = self._accepted / self._drafted
        if self.drafting and rate < self.min_acceptance:
            logger.info("inkling-vllm: MTP drafts paused: %.2f of the last %d drafted tokens accepted (below %s=%.2f);"
                        " probing every %d steps", rate, self._drafted, MIN_ACCEPTANCE_ENV, self.min_acceptance,
                        self.probe_every)
            self.drafting = False
            self._steps_off = 0
            self._seen.clear()
            self._drafted = self._accepted = 0
        elif not self.drafting and rate >= self.min_acceptance:
            logger.info("inkling-vllm: MTP drafts resumed: %.2f of %d probed tokens accepted", rate, self._drafted)
            self.drafting = True


# --- vLLM side ---------------------------------------------------------------------
def paused_steps_lose_graphs(cudagraph_mode: Any) -> bool:
    """Whether a step without drafts would run without CUDA graphs in an engine whose
    mode is ``cudagraph_mode`` (vLLM's ``CUDAGraphMode``): full graphs for uniform
    decode batches and none for others (``FULL_DECODE_ONLY``)."""
    decode_mode, mixed_mode = getattr(cudagraph_mode, "decode_mode", None), getattr(cudagraph_mode, "mixed_mode", None)
    if decode_mode is None or mixed_mode is None:
        return False
    return decode_mode().name == "FULL" and mixed_mode().name == "NONE"


def gate_for(scheduler: Any, vllm_config: Any) -> DraftGate | None:
    """The :class:`DraftGate` a just-built vLLM scheduler should read, or None: no
    drafts, a threshold of 0, another drafter, or an engine whose steps without
    drafts would lose their CUDA graphs (:func:`paused_steps_lose_graphs`, unless its
    runner captures one-row graphs for them:
    :func:`~inkling_vllm.one_row_graphs.one_row_graphs_wanted`)."""
    from .drafting import uses_inkling_mtp
    from .one_row_graphs import one_row_graphs_wanted

    threshold = min_acceptance()
    k = int(getattr(scheduler, "num_spec_tokens", 0) or 0)
    if k <= 0 or threshold <= 0.0 or not uses_inkling_mtp(vllm_config):
        return None
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    if paused_steps_lose_graphs(mode) and not one_row_graphs_wanted(vllm_config):
        logger.info("inkling-vllm: MTP draft gate off under cudagraph_mode=%s: a step without drafts would run "
                    "without CUDA graphs; drafting at every step", getattr(mode, "name", mode))
        return None
    schedule = scheduler.dynamic_sd_lookup
    if schedule is None:  # the same count at every batch size
        schedule = [k] * (int(scheduler.scheduler_config.max_num_seqs) + 1)
    return DraftGate(schedule, threshold)


def install_draft_gate_hook() -> bool:
    """Give vLLM's scheduler a :class:`DraftGate` in engines that draft with the Inkling
    MTP head (idempotent; the threshold from :func:`min_acceptance`, read when an
    engine's scheduler is built; 0 installs no gate; see :func:`gate_for`). Returns False where the
    scheduler has no such hook point (another vLLM version)."""
    try:
        from vllm.v1.core.sched.scheduler import Scheduler
    except ImportError:
        return False
    init, stats = Scheduler.__init__, getattr(Scheduler, "make_spec_decoding_stats", None)
    if stats is None:
        return False
    if getattr(init, "_inkling_gate", False):
        return True

    @functools.wraps(init)
    def __init__(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        init(self, vllm_config, *args, **kwargs)
        gate = gate_for(self, vllm_config)
        if gate is not None:
            self.dynamic_sd_lookup = gate

    @functools.wraps(stats)
    def make_spec_decoding_stats(self: Any, spec_decoding_stats: Any, num_draft_tokens: int,
                                 num_accepted_tokens: int, num_invalid_spec_tokens: Any, request_id: str) -> Any:
        gate = getattr(self, "dynamic_sd_lookup", None)
        if isinstance(gate, DraftGate):
            invalid = (num_invalid_spec_tokens or {}).get(request_id, 0)
            gate.observe(num_draft_tokens - invalid, num_accepted_tokens)
        return stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                     request_id)

    __init__._inkling_gate = True  # type: ignore[attr-defined]
    Scheduler.__init__ = __init__  # type: ignore[method-assign]
    Scheduler.make_spec_decoding_stats = make_spec_decoding_stats  # type: ignore[method-assign]
    return True
