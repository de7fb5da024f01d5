"""The MTP draft gate's decisions (inkling_vllm.draft_gate), against a brute-force
model of its window; the engine-level checks are in tests/e2e/test_mtp.py."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inkling_vllm import draft_gate
from inkling_vllm.draft_gate import DraftGate


def _steps(gate: DraftGate, n: int, batch: int = 4) -> list[int]:
    return [gate[batch] for _ in range(n)]


def test_schedule_passes_through_while_drafts_are_accepted() -> None:
    schedule = [0, 3, 3, 2, 0, 0]  # vLLM's dense lookup: index = batch size, 0 drafts above 3
    gate = DraftGate(schedule, 0.25)
    for _ in range(50):
        gate.observe(3, 2)
    assert gate.drafting and gate.acceptance == pytest.approx(2 / 3)
    assert [gate[b] for b in range(1, 6)] == [3, 3, 2, 0, 0]
    assert gate.gated_steps == 0 and len(gate) == len(schedule)
    assert gate[1:3] == [3, 3]  # slices read the schedule


def test_rejected_drafts_pause_drafting_with_one_probe_in_probe_every() -> None:
    gate = DraftGate([0] + [2] * 8, 0.25, window=64, min_drafts=16, probe_every=8)
    for _ in range(7):  # 14 drafted tokens: too few to judge
        gate.observe(2, 0)
    assert gate.drafting
    gate.observe(2, 0)  # 16: paused
    assert not gate.drafting and gate.acceptance is None  # the window starts again
    counts = _steps(gate, 32)
    assert counts == ([0] * 7 + [2]) * 4  # a probe every 8th step
    assert gate.gated_steps == 28
    # a schedule entry of 0 is the schedule's, not a gated step
    zero = DraftGate([0, 0, 2], 0.25, min_drafts=1)
    zero.observe(1, 0)
    assert zero[1] == 0 and zero.gated_steps == 0


def test_accepted_probes_resume_drafting() -> None:
    gate = DraftGate([0] + [3] * 4, 0.5, window=32, min_drafts=8, probe_every=4)
    for _ in range(3):
        gate.observe(3, 0)
    assert not gate.drafting
    gate.observe(3, 3)  # 3 probed tokens: too few
    assert not gate.drafting
    gate.observe(3, 2)
    gate.observe(3, 3)  # 9 probed, 8 accepted
    assert gate.drafting and gate.acceptance == pytest.approx(8 / 9)
    assert _steps(gate, 5) == [3] * 5


def _window(history: list[tuple[int, int]], window: int) -> tuple[int, int]:
    """(drafted, accepted) over the shortest suffix of observations holding at least
    ``window`` drafted tokens (all of them when fewer)."""
    drafted = accepted = 0
    for d, a in reversed(history):
        if drafted >= window:
            break
        drafted += d
        accepted += a
    return drafted, accepted


@settings(max_examples=200, deadline=None)
@given(
    obs=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=120),
    threshold=st.sampled_from([0.0, 0.2, 0.5, 0.9]),
    window=st.integers(4, 40),
    data=st.data(),
)
def test_window_and_decisions_match_a_brute_force_model(obs: list[tuple[int, int]], threshold: float, window: int,
                                                         data: st.DataObject) -> None:
    min_drafts = data.draw(st.integers(1, window))
    gate = DraftGate([0, 2], threshold, window=window, min_drafts=min_drafts, probe_every=3)
    history: list[tuple[int, int]] = []  # observations since the last pause
    drafting = True
    for d, a in obs:
        gate.observe(d, a)
        if d > 0:
            history.append((d, min(a, d)))
            drafted, accepted = _window(history, window)
            if drafted >= min_drafts:
                if drafting and accepted < threshold * drafted:
                    drafting, history = False, []
                elif not drafting and accepted >= threshold * drafted:
                    drafting = True
        assert gate.drafting == drafting
        drafted, accepted = _window(history, window)
        assert gate.acceptance == (pytest.approx(accepted / drafted) if drafted else None)
    assert gate.total_drafted == sum(d for d, _ in obs if d > 0)
    assert gate.total_accepted == sum(min(a, d) for d, a in obs if d > 0)


def test_random_rejections_keep_the_drafted_share_near_one_probe_in_probe_every() -> None:
    """At acceptance 0, after the first ``min_drafts`` tokens the gate drafts on one
    step in ``probe_every``."""
    rng = random.Random(0)
    gate = DraftGate([0] + [1] * 64, 0.25, probe_every=16)
    drafted_steps = 0
    for _ in range(4000):
        batch = rng.randint(1, 64)
        k = gate[batch]
        if k:
            drafted_steps += 1
            for _ in range(batch):
                gate.observe(k, 0)
    assert drafted_steps <= 4000 / 16 + 32


@pytest.mark.parametrize("raw, want", [(None, draft_gate.DEFAULT_MIN_ACCEPTANCE), ("", 0.25), ("0", 0.0),
                                       ("0.5", 0.5), ("1", 1.0)])
def test_threshold_from_the_environment(raw: str | None, want: float) -> None:
    env = {} if raw is None else {draft_gate.MIN_ACCEPTANCE_ENV: raw}
    assert draft_gate.min_acceptance(env) == want


@pytest.mark.parametrize("raw", ["-0.1", "1.5", "half", "nan"])
def test_a_bad_threshold_is_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(ValueError, match=draft_gate.MIN_ACCEPTANCE_ENV):
        draft_gate.min_acceptance({draft_gate.MIN_ACCEPTANCE_ENV: raw})


@pytest.mark.parametrize("kwargs", [dict(min_acceptance=1.5), dict(min_acceptance=0.2, window=8, min_drafts=9),
                                    dict(min_acceptance=0.2, probe_every=0)])
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DraftGate([0, 1], **kwargs)  # type: ignore[arg-type]


def test_the_hook_is_installed_once_and_wraps_vllms_scheduler() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    assert draft_gate.install_draft_gate_hook()
    init, stats = Scheduler.__init__, Scheduler.make_spec_decoding_stats
    assert draft_gate.install_draft_gate_hook()  # idempotent
    assert Scheduler.__init__ is init and Scheduler.make_spec_decoding_stats is stats
    assert getattr(init, "_inkling_gate", False)


def test_vllms_accounting_reaches_the_gate() -> None:
    """vLLM's per-request accounting (``make_spec_decoding_stats``) feeds the gate,
    less the drafts vLLM marks invalid, and still returns vLLM's own statistics."""
    from vllm.v1.core.sched.scheduler import Scheduler

    draft_gate.install_draft_gate_hook()
    sched = object.__new__(Scheduler)
    sched.log_stats, sched.num_spec_tokens = False, 3
    sched.dynamic_sd_lookup = gate = DraftGate([0, 3], 0.25)
    assert sched.make_spec_decoding_stats(None, 3, 1, {"r": 1}, "r") is None  # log_stats off: vLLM's None
    assert (gate.total_drafted, gate.total_accepted) == (2, 1)
    sched.dynamic_sd_lookup = [0, 3]  # vLLM's own lookup: nothing to feed
    sched.make_spec_decoding_stats(None, 3, 1, None, "r")
    assert gate.total_drafted == 2


def test_a_bad_threshold_is_refused_while_vllm_reads_the_speculative_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft config vLLM asks for (before any weight is loaded or block allocated)
    checks the variable; other models' configs do not."""
    from transformers import InklingTextConfig

    from inkling_vllm.drafting import mtp_draft_config

    monkeypatch.setenv(draft_gate.MIN_ACCEPTANCE_ENV, "2")
    with pytest.raises(ValueError, match=draft_gate.MIN_ACCEPTANCE_ENV):
        mtp_draft_config(InklingTextConfig(num_mtp_layers=1, mtp_local_layer_ids=[0]))

    class Other:
        model_type = "llama"

    assert mtp_draft_config(Other()) is not None
    monkeypatch.setenv(draft_gate.MIN_ACCEPTANCE_ENV, "0.5")
    assert mtp_draft_config(InklingTextConfig(num_mtp_layers=1, mtp_local_layer_ids=[0])).num_nextn_predict_layers == 1


def _engine(mode_name: str | None, method: str = "mtp") -> tuple[Any, Any]:
    """A just-built scheduler (k = 2, vLLM's fixed schedule) and the vllm_config of an
    engine drafting with the Inkling MTP head under ``mode_name``."""
    from types import SimpleNamespace

    from vllm.config import CUDAGraphMode

    from inkling_vllm.drafting import MTP_ARCHITECTURE

    draft = SimpleNamespace(hf_config=SimpleNamespace(architectures=[MTP_ARCHITECTURE]))
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(method=method, draft_model_config=draft),
        compilation_config=SimpleNamespace(cudagraph_mode=None if mode_name is None else CUDAGraphMode[mode_name]))
    sched = SimpleNamespace(num_spec_tokens=2, dynamic_sd_lookup=None, scheduler_config=SimpleNamespace(max_num_seqs=4))
    return sched, config


@pytest.mark.parametrize(("mode", "gated"), [("FULL_AND_PIECEWISE", True), ("PIECEWISE", True), ("FULL", True),
                                             ("NONE", True), (None, True), ("FULL_DECODE_ONLY", False)])
def test_no_gate_where_steps_without_drafts_lose_their_graphs(mode: str | None, gated: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``FULL_DECODE_ONLY`` a step without drafts (one row a request, not vLLM's
    uniform 1 + k) would run eagerly, slower than drafting: no gate there unless the
    runner captures one-row graphs (tests/test_one_row_graphs.py; this engine's
    speculative config names no draft count, so it does not); every other mode keeps one
    (its paused steps replay piecewise or full graphs, or nothing runs in graphs)."""
    monkeypatch.delenv(draft_gate.MIN_ACCEPTANCE_ENV, raising=False)
    sched, config = _engine(mode)
    gate = draft_gate.gate_for(sched, config)
    assert (gate is not None) == gated
    if gated:
        assert isinstance(gate, DraftGate) and list(gate) == [2] * 5
    monkeypatch.setenv(draft_gate.MIN_ACCEPTANCE_ENV, "0")
    assert draft_gate.gate_for(sched, config) is None
    monkeypatch.delenv(draft_gate.MIN_ACCEPTANCE_ENV)
    assert draft_gate.gate_for(*_engine(mode, method="ngram")) is None
