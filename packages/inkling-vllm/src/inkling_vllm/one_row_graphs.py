"""Full CUDA graphs for decode steps without drafts in engines drafting with the MTP head.

vLLM's GPU model runner (0.32, first generation) captures full decode graphs for
uniform batches only: every request with ``1 + k`` rows, ``k`` the engine's draft
count. A step the draft gate (:mod:`inkling_vllm.draft_gate`) gives no drafts has one
row per request, so vLLM's dispatcher finds no full graph for it: under
``FULL_AND_PIECEWISE`` it replays piecewise graphs (attention and the plugin's
metadata ops eager between them), under ``FULL_DECODE_ONLY`` it runs eagerly.

:func:`install_one_row_graphs` makes such a runner also capture full graphs for batches
of one row per request, one per CUDA-graph capture size up to ``max_num_seqs`` (the
batches a model without drafts gets its decode graphs for), and dispatch a step to
them only when every request of the step has exactly one row. The graphs are those
vLLM captures for the same batch in an engine without drafts; they live beside the
``1 + k`` ones (their keys differ in the request count), so capture takes more time
and graph memory: one more full graph per capture size up to ``max_num_seqs``.

Only engines that gate their drafts get them (:func:`one_row_graphs_wanted`): without
the gate a decode step with one row per request is rare.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import Any

__all__ = ["install_one_row_graphs", "one_row_graphs_wanted"]

logger = logging.getLogger(__name__)


def one_row_graphs_wanted(vllm_config: Any) -> bool:
    """Whether an engine's GPU runner should capture full graphs for one-row decode
    batches: it drafts with the Inkling MTP head behind the draft gate (a threshold
    above 0), captures full decode graphs in a routine of their own (``FULL_DECODE_ONLY``,
    ``FULL_AND_PIECEWISE``), runs the first-generation runner, without LoRA and
    without data parallelism (whose ranks agree on one graph per step)."""
    from .draft_gate import min_acceptance
    from .drafting import uses_inkling_mtp

    if not uses_inkling_mtp(vllm_config) or min_acceptance() <= 0.0:
        return False
    k = int(getattr(vllm_config.speculative_config, "num_speculative_tokens", 0) or 0)
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    if k < 1 or mode is None or getattr(vllm_config, "use_v2_model_runner", False):
        return False
    if getattr(vllm_config, "lora_config", None) is not None:
        return False
    if int(getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_size", 1) or 1) != 1:
        return False
    return mode.decode_mode().name == "FULL" and bool(mode.separate_routine())


@contextlib.contextmanager
def _one_row(runner: Any, keys: frozenset[Any]) -> Iterator[None]:
    """While inside: the runner and its dispatcher treat one row per request as the
    uniform decode batch, and the one-row keys are full-graph keys."""
    from vllm.config import CUDAGraphMode

    dispatcher = runner.cudagraph_dispatcher
    full = dispatcher.cudagraph_keys[CUDAGraphMode.FULL]
    saved = runner.uniform_decode_query_len, dispatcher.uniform_decode_query_len
    added = keys - full
    runner.uniform_decode_query_len = dispatcher.uniform_decode_query_len = 1
    full |= added
    try:
        yield
    finally:
        full -= added
        runner.uniform_decode_query_len, dispatcher.uniform_decode_query_len = saved


def install_one_row_graphs(runner: Any) -> int:
    """Give vLLM's GPU model runner full graphs for one-row decode batches (see the
    module docstring), before it captures its graphs. Returns the number of one-row
    graphs it will capture: 0 where the engine does not want them
    (:func:`one_row_graphs_wanted`) or the runner lacks the hook points; idempotent."""
    keys = getattr(runner, "_inkling_one_row_keys", None)
    if keys is not None:
        return len(keys)
    from vllm.config import CUDAGraphMode

    dispatcher = getattr(runner, "cudagraph_dispatcher", None)
    needed = ("_capture_cudagraphs", "_determine_batch_execution_and_padding", "uniform_decode_query_len")
    if dispatcher is None or not all(hasattr(runner, name) for name in needed):
        return 0
    if not one_row_graphs_wanted(runner.vllm_config) or not getattr(dispatcher, "keys_initialized", False):
        return 0
    if dispatcher.cudagraph_mode.decode_mode() != CUDAGraphMode.FULL:  # (the mode the runner resolved)
        return 0
    max_reqs = int(runner.vllm_config.scheduler_config.max_num_seqs)
    sizes = [x for x in dispatcher.compilation_config.cudagraph_capture_sizes or [] if x <= max_reqs]
    with _one_row(runner, frozenset()):
        keys = frozenset(dispatcher._create_padded_batch_descriptor(x, True, False, 0) for x in sizes)
    runner._inkling_one_row_keys = keys
    if not keys:
        return 0
    capture_descs, capture, determine = (dispatcher.get_capture_descs, runner._capture_cudagraphs,
                                         runner._determine_batch_execution_and_padding)

    @functools.wraps(capture_descs)
    def get_capture_descs() -> list[tuple[Any, list[Any]]]:
        descs = capture_descs()
        if descs:  # after vLLM's own, largest first (vLLM's order: smaller graphs reuse the pool)
            descs.append((CUDAGraphMode.FULL, sorted(keys, key=lambda d: d.num_tokens, reverse=True)))
        return descs

    @functools.wraps(capture)
    def _capture_cudagraphs(batch_descriptors: Any, cudagraph_runtime_mode: Any, *args: Any, **kwargs: Any) -> Any:
        descs = list(batch_descriptors)
        if descs and all(d in keys for d in descs):
            with _one_row(runner, keys):
                return capture(descs, cudagraph_runtime_mode, *args, **kwargs)
        return capture(descs, cudagraph_runtime_mode, *args, **kwargs)

    @functools.wraps(determine)
    def _determine_batch_execution_and_padding(num_tokens: int, num_reqs: int, num_scheduled_tokens_np: Any,
                                               max_num_scheduled_tokens: int, *args: Any, **kwargs: Any) -> Any:
        if (kwargs.get("force_uniform_decode") is None and not args and max_num_scheduled_tokens == 1
                and num_tokens == num_reqs > 0):
            with _one_row(runner, keys):
                return determine(num_tokens, num_reqs, num_scheduled_tokens_np, max_num_scheduled_tokens,
                                 **{**kwargs, "force_uniform_decode": True})
        return determine(num_tokens, num_reqs, num_scheduled_tokens_np, max_num_scheduled_tokens, *args, **kwargs)

    dispatcher.get_capture_descs = get_capture_descs
    runner._capture_cudagraphs = _capture_cudagraphs
    runner._determine_batch_execution_and_padding = _determine_batch_execution_and_padding
    logger.info("inkling-vllm: %d full CUDA graphs for decode steps without drafts (one row a request, up to %d "
                "requests) beside vLLM's %d-row ones", len(keys), max(k.num_reqs for k in keys),
                runner.uniform_decode_query_len)
    return len(keys)
