"""Full graphs for one-row decode steps in MTP engines (inkling_vllm.one_row_graphs),
on vLLM's own dispatcher and its runner's batch-execution decision; the GPU engine
runs in tests/e2e (its graph replay counts in inkling-vllm RESULTS)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from inkling_vllm import draft_gate, one_row_graphs
from inkling_vllm.drafting import MTP_ARCHITECTURE

CAPTURE_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64]
MAX_SEQS = 20


def _config(mode: str, k: int = 2, method: str = "mtp", rounded: bool = False, **over: Any) -> Any:
    """``rounded``: the capture sizes rounded to multiples of ``1 + k`` as vLLM's
    first-generation runner does in drafting engines, with the plugin's record of the
    sizes before."""
    from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode

    compilation = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=CUDAGraphMode[mode],
                                    cudagraph_capture_sizes=list(CAPTURE_SIZES))
    compilation.set_splitting_ops_for_v1(all2all_backend="naive")  # (attention split: piecewise graphs)
    compilation.max_cudagraph_capture_size = max(CAPTURE_SIZES)
    if rounded:
        assert one_row_graphs.install_capture_size_record()
        compilation.adjust_cudagraph_sizes_for_spec_decode(1 + k)
        assert compilation.cudagraph_capture_sizes != CAPTURE_SIZES  # (vLLM rounded them)
    draft = SimpleNamespace(hf_config=SimpleNamespace(architectures=[MTP_ARCHITECTURE]))
    fields = dict(
        speculative_config=SimpleNamespace(method=method, draft_model_config=draft, num_speculative_tokens=k),
        compilation_config=compilation, num_speculative_tokens=k, lora_config=None,
        scheduler_config=SimpleNamespace(max_num_seqs=MAX_SEQS), use_v2_model_runner=False,
        parallel_config=SimpleNamespace(data_parallel_size=1),
        observability_config=SimpleNamespace(cudagraph_metrics=False),
        model_config=SimpleNamespace(is_encoder_decoder=False))
    fields.update(over)
    return SimpleNamespace(**fields)


def _runner(config: Any) -> Any:
    """vLLM's dispatcher and the runner's own batch-execution decision on a stand-in
    runner; its capture records what vLLM's dummy run would dispatch for each graph."""
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    class Runner:
        _is_uniform_decode = staticmethod(GPUModelRunner._is_uniform_decode)
        _determine_batch_execution_and_padding = GPUModelRunner._determine_batch_execution_and_padding

        def __init__(self) -> None:
            self.vllm_config = config
            self.model_config = config.model_config
            self.parallel_config = config.parallel_config
            self.input_batch = SimpleNamespace(lora_id_to_lora_request={})
            self.uniform_decode_query_len = 1 + config.num_speculative_tokens
            self.cudagraph_dispatcher = CudagraphDispatcher(config)
            self.cudagraph_dispatcher.initialize_cudagraph_keys(config.compilation_config.cudagraph_mode,
                                                                self.uniform_decode_query_len)
            self.captured: list[tuple[Any, Any, Any]] = []

        def _capture_cudagraphs(self, batch_descriptors: Any, cudagraph_runtime_mode: Any) -> None:
            # vLLM's _dummy_run(num_tokens, mode, uniform_decode=desc.uniform): the rows a
            # request from the runner's uniform length, then the dispatch
            for desc in batch_descriptors:
                q = self.uniform_decode_query_len if desc.uniform else desc.num_tokens
                reqs = min(MAX_SEQS, -(-desc.num_tokens // q)) if desc.uniform else min(desc.num_tokens, MAX_SEQS)
                lens = np.full(reqs, q if desc.uniform else desc.num_tokens // reqs, dtype=np.int32)
                mode, got = self._determine_batch_execution_and_padding(
                    num_tokens=desc.num_tokens, num_reqs=reqs, num_scheduled_tokens_np=lens,
                    max_num_scheduled_tokens=q, force_uniform_decode=desc.uniform)[:2]
                self.captured.append((desc, mode, got, tuple(lens)))

    return Runner()


def _step(runner: Any, lens: list[int]) -> tuple[Any, Any]:
    lens_np = np.array(lens, dtype=np.int32)
    mode, desc = runner._determine_batch_execution_and_padding(
        num_tokens=int(lens_np.sum()), num_reqs=len(lens), num_scheduled_tokens_np=lens_np,
        max_num_scheduled_tokens=int(lens_np.max()), use_cascade_attn=False, num_encoder_reqs=0,
        allow_microbatching=True)[:2]
    return mode, desc


def _capture(runner: Any) -> None:
    for mode, descs in runner.cudagraph_dispatcher.get_capture_descs():
        runner._capture_cudagraphs(descs, mode)


@pytest.fixture(autouse=True)
def _default_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(draft_gate.MIN_ACCEPTANCE_ENV, raising=False)


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("rounded", [False, True])
def test_one_row_steps_replay_full_graphs_and_nothing_else_does(mode: str, k: int, rounded: bool) -> None:
    """One-row steps pad to the configured capture sizes (not vLLM's multiples of
    ``1 + k``) and replay full graphs; no other batch shape takes them."""
    from vllm.config import CUDAGraphMode

    runner = _runner(_config(mode, k, rounded=rounded))
    before = {n: _step(runner, [1] * n) for n in range(1, MAX_SEQS + 1)}
    assert all(m != CUDAGraphMode.FULL for m, _ in before.values())  # vLLM alone: no full graph for them
    full_keys = set(runner.cudagraph_dispatcher.cudagraph_keys[CUDAGraphMode.FULL])

    n_graphs = one_row_graphs.install_one_row_graphs(runner)
    sizes = [x for x in CAPTURE_SIZES if x <= MAX_SEQS]
    assert n_graphs == len(sizes) and one_row_graphs.install_one_row_graphs(runner) == n_graphs

    _capture(runner)
    one_row = [c for c in runner.captured if c[0].num_reqs == c[0].num_tokens and c[0].uniform]
    assert sorted(c[0].num_tokens for c in one_row) == sizes
    for desc, got_mode, got, lens in one_row:  # each captured on one row per request, as a full graph
        assert got_mode == CUDAGraphMode.FULL and got == desc and lens == (1,) * desc.num_tokens
    for desc, got_mode, got, lens in runner.captured:
        if desc not in {c[0] for c in one_row}:  # vLLM's own graphs keep their batches
            assert got == desc and (not desc.uniform or set(lens) == {1 + k})

    for n in range(1, MAX_SEQS + 1):
        got_mode, desc = _step(runner, [1] * n)
        pad = min(x for x in sizes if x >= n) if n <= max(sizes) else None
        if pad is None:  # above the largest one-row graph: as before
            assert (got_mode, desc) == before[n]
        else:
            assert got_mode == CUDAGraphMode.FULL and (desc.num_tokens, desc.num_reqs, desc.uniform) == (pad, pad, True)
        # the same token count in any other shape never takes a one-row graph
        for lens in ([2] + [1] * (n - 2), [1 + k] * max(1, n // (1 + k))):
            if sum(lens) <= max(CAPTURE_SIZES) and len(lens) >= 1:
                other_mode, other = _step(runner, lens)
                assert not (other_mode == CUDAGraphMode.FULL and other.num_reqs == other.num_tokens)
    # nothing leaks out of a step: vLLM's keys and the runner's decode length
    assert runner.cudagraph_dispatcher.cudagraph_keys[CUDAGraphMode.FULL] == full_keys
    assert runner.uniform_decode_query_len == runner.cudagraph_dispatcher.uniform_decode_query_len == 1 + k
    # a uniform 1 + k decode step still takes vLLM's full graph
    got_mode, desc = _step(runner, [1 + k] * 4)
    assert got_mode == CUDAGraphMode.FULL and desc.num_reqs == 4 and desc.num_tokens == 4 * (1 + k)


@pytest.mark.parametrize(("change", "wanted"), [
    ({}, True),
    (dict(mode="FULL_AND_PIECEWISE"), True),
    (dict(mode="PIECEWISE"), False),
    (dict(mode="FULL"), False),  # (mixed full graphs: one routine for every batch)
    (dict(mode="NONE"), False),
    (dict(k=0), False),
    (dict(method="ngram"), False),
    (dict(use_v2_model_runner=True), False),
    (dict(lora_config=object()), False),
    (dict(parallel_config=SimpleNamespace(data_parallel_size=2)), False),
    (dict(threshold="0"), False),
])
def test_which_engines_want_one_row_graphs(change: dict[str, Any], wanted: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    change = dict(change)
    if "threshold" in change:
        monkeypatch.setenv(draft_gate.MIN_ACCEPTANCE_ENV, change.pop("threshold"))
    kw = {key: change.pop(key) for key in ("mode", "k", "method") if key in change}
    config = _config(kw.pop("mode", "FULL_DECODE_ONLY"), **kw, **change)
    assert one_row_graphs.one_row_graphs_wanted(config) == wanted
    # the scheduler gates drafts under FULL_DECODE_ONLY exactly where the runner gets the graphs
    sched = SimpleNamespace(num_spec_tokens=config.num_speculative_tokens, dynamic_sd_lookup=None,
                            scheduler_config=SimpleNamespace(max_num_seqs=MAX_SEQS))
    if config.compilation_config.cudagraph_mode.name == "FULL_DECODE_ONLY" and config.num_speculative_tokens:
        assert (draft_gate.gate_for(sched, config) is not None) == wanted


def test_engines_without_them_are_left_alone() -> None:
    runner = _runner(_config("PIECEWISE"))
    determine = runner._determine_batch_execution_and_padding
    assert one_row_graphs.install_one_row_graphs(runner) == 0
    assert runner._determine_batch_execution_and_padding == determine
    assert all(d.num_reqs != d.num_tokens or not d.uniform
               for _, descs in runner.cudagraph_dispatcher.get_capture_descs() for d in descs)
