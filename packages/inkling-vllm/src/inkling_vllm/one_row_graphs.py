"""Full CUDA graphs for decode steps without drafts in engines drafting with the MTP head.

vLLM's GPU model runner (0.32, first generation) captures full decode graphs for
uniform batches only: every request with ``1 + k`` rows, ``k`` the engine's draft
count. A step the draft gate (:mod:`inkling_vllm.draft_gate`) gives no drafts has one
row per request, so vLLM's dispatcher finds no full graph for it: under
``FULL_AND_PIECEWISE`` it replays piecewise graphs (attention and the plugin's
metadata ops eager between them), under ``FULL_DECODE_ONLY`` it runs eagerly.

:func:`install_one_row_graphs` makes such a runner also capture full graphs for batches
of one row per request, one per CUDA-graph capture size up to ``max_num_seqs``, and
dispatch a step to them only when every request of the step has exactly one row. The
sizes are the engine's capture sizes as configured, not the multiples of ``1 + k``
vLLM rounds them up to for its own decode graphs
(``adjust_cudagraph_sizes_for_spec_decode``, recorded by
:func:`install_capture_size_record`): a paused step of ``n`` requests pads to the
batch an engine without drafts would run, not to the next multiple of ``1 + k`` (one
request would run 3 rows at ``k = 2``, 32 would run 33). The graphs are those vLLM
captures for the same batch in an engine without drafts; they live beside the
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

__all__ = ["install_capture_size_record", "install_one_row_graphs", "one_row_capture_sizes", "one_row_graphs_wanted"]

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


#: Where :func:`install_capture_size_record` keeps a compilation config's capture sizes
#: from before vLLM rounded them to multiples of ``1 + k``.
_SIZES_ATTR = "_inkling_capture_sizes_before_spec"


def install_capture_size_record() -> bool:
    """Make vLLM's ``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`` (the
    first-generation runner's rounding of the capture sizes to multiples of ``1 + k``
    in drafting engines) keep the sizes it was given, for
    :func:`one_row_capture_sizes` (idempotent). Returns False where vLLM has no such
    method."""
    try:
        from vllm.config import CompilationConfig
    except ImportError:
        return False
    original = getattr(CompilationConfig, "adjust_cudagraph_sizes_for_spec_decode", None)
    if original is None:
        return False
    if getattr(original, "_inkling_record", False):
        return True

    @functools.wraps(original)
    def adjust_cudagraph_sizes_for_spec_decode(self: Any, uniform_decode_query_len: int) -> Any:
        if getattr(self, _SIZES_ATTR, None) is None and self.cudagraph_capture_sizes:
            setattr(self, _SIZES_ATTR, sorted(set(self.cudagraph_capture_sizes)))
        return original(self, uniform_decode_query_len)

    adjust_cudagraph_sizes_for_spec_decode._inkling_record = True  # type: ignore[attr-defined]
    CompilationConfig.adjust_cudagraph_sizes_for_spec_decode = adjust_cudagraph_sizes_for_spec_decode
    return True


def one_row_capture_sizes(compilation_config: Any, max_num_seqs: int) -> list[int]:
    """The batch sizes of the one-row graphs: the capture sizes from before vLLM's
    rounding to multiples of ``1 + k`` (:func:`install_capture_size_record`; the current
    ones where none was recorded) up to ``max_num_seqs`` and the largest size vLLM
    graphs after rounding (``max_cudagraph_capture_size``; larger batches run without
    graphs)."""
    sizes = getattr(compilation_config, _SIZES_ATTR, None) or compilation_config.cudagraph_capture_sizes or []
    limit = min(int(max_num_seqs), int(compilation_config.max_cudagraph_capture_size or 0))
    return sorted({int(x) for x in sizes if 1 <= int(x) <= limit})


def _one_row_padding(table: list[int], sizes: list[int]) -> list[int]:
    """vLLM's batch-size -> padded-graph-size table with every batch up to the largest
    one-row size padded to the next one-row size (larger ones as ``table``)."""
    padded = list(table)
    at = 0
    for bs in range(1, min(len(padded), sizes[-1] + 1)):
        while sizes[at] < bs:
            at += 1
        padded[bs] = sizes[at]
    return padded


@contextlib.contextmanager
def _one_row(runner: Any, keys: frozenset[Any], padding: list[int] | None) -> Iterator[None]:
    """While inside: the runner and its dispatcher treat one row per request as the
    uniform decode batch, pad it to the one-row sizes (``padding``: the table of
    :func:`_one_row_padding`), and the one-row keys are full-graph keys."""
    from vllm.config import CUDAGraphMode

    dispatcher = runner.cudagraph_dispatcher
    full = dispatcher.cudagraph_keys[CUDAGraphMode.FULL]
    saved = runner.uniform_decode_query_len, dispatcher.uniform_decode_query_len
    table = dispatcher._bs_to_padded_graph_size
    added = keys - full
    runner.uniform_decode_query_len = dispatcher.uniform_decode_query_len = 1
    if padding is not None:
        dispatcher._bs_to_padded_graph_size = padding
    full |= added
    try:
        yield
    finally:
        full -= added
        dispatcher._bs_to_padded_graph_size = table
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
    if (dispatcher is None or not all(hasattr(runner, name) for name in needed)
            or not hasattr(dispatcher, "_bs_to_padded_graph_size")):
        return 0
    if not one_row_graphs_wanted(runner.vllm_config) or not getattr(dispatcher, "keys_initialized", False):
        return 0
    if dispatcher.cudagraph_mode.decode_mode() != CUDAGraphMode.FULL:  # (the mode the runner resolved)
        return 0
    sizes = one_row_capture_sizes(dispatcher.compilation_config, runner.vllm_config.scheduler_config.max_num_seqs)
    padding = _one_row_padding(dispatcher._bs_to_padded_graph_size, sizes) if sizes else None
    with _one_row(runner, frozenset(), padding):
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
            with _one_row(runner, keys, padding):
                return capture(descs, cudagraph_runtime_mode, *args, **kwargs)
        return capture(descs, cudagraph_runtime_mode, *args, **kwargs)

    @functools.wraps(determine)
    def _determine_batch_execution_and_padding(num_tokens: int, num_reqs: int, num_scheduled_tokens_np: Any,
                                               max_num_scheduled_tokens: int, *args: Any, **kwargs: Any) -> Any:
        if (kwargs.get("force_uniform_decode") is None and not args and max_num_scheduled_tokens == 1
                and num_tokens == num_reqs > 0):
            with _one_row(runner, keys, padding):
                return determine(num_tokens, num_reqs, num_scheduled_tokens_np, max_num_scheduled_tokens,
                                 **{**kwargs, "force_uniform_decode": True})
        return determine(num_tokens, num_reqs, num_scheduled_tokens_np, max_num_scheduled_tokens, *args, **kwargs)

    dispatcher.get_capture_descs = get_capture_descs
    runner._capture_cudagraphs = _capture_cudagraphs
    runner._determine_batch_execution_and_padding = _determine_batch_execution_and_padding
    logger.info("inkling-vllm: %d full CUDA graphs for decode steps without drafts (one row a request, %s "
                "requests) beside vLLM's %d-row ones", len(keys), sorted(k.num_reqs for k in keys),
                runner.uniform_decode_query_len)
    return len(keys)
