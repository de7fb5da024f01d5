"""Count the Triton kernel launches of a process, so that an e2e scenario can show it
took the GPU code path (the conv kernels with the step's tap map, the fused sublayer
tails, the attention) rather than the PyTorch references.

:func:`install` wraps the kernels' launchers in this process; the counts live in
:data:`LAUNCHES`. An engine whose model runs here (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
one rank) installs it before the engine starts. Tensor-parallel ranks are worker
processes: the runner calls ``llm.apply_model(install_in_worker)`` once and
``llm.apply_model(snapshot_in_worker)`` around each scenario; the functions are
pickled by reference, so this module must be importable in the workers (the runner
puts its folder on ``PYTHONPATH`` before the engine starts).
"""

from __future__ import annotations

from typing import Any

LAUNCHES = {
    "fused_sconv": 0, "fused_sconv_mapped": 0, "fused_sconv_kv": 0, "fused_sconv_kv_mapped": 0,
    "fused_add_norm": 0, "fused_add_norm_mapped": 0, "fused_add": 0, "fused_add_mapped": 0,
    "gathered_norm": 0, "sconv_tap_map": 0, "rel_attention": 0, "rel_attention_engine_meta": 0, "write_kv": 0,
}
_installed = False


def install() -> None:
    """Wrap the launchers (once per process); every call is counted, then made."""
    global _installed
    if _installed:
        return
    _installed = True
    from inkling_kernels.gathered_rmsnorm import kernel as gathered_kernel
    from inkling_kernels.rel_attention import kernel as attention
    from inkling_kernels.sconv import kernel as sconv_kernel
    from inkling_kernels.sconv_add_rmsnorm import kernel as add_norm_kernel
    from inkling_kernels.sconv_kv import kernel as sconv_kv_kernel
    from inkling_kernels.tap_map import kernel as tap_map_kernel

    def counted(module: Any, name: str, key: str, batch_at: int | None = None, meta_kw: str | None = None) -> None:
        real = getattr(module, name)

        def launch(*args: Any, **kwargs: Any) -> Any:
            LAUNCHES[key] += 1
            if batch_at is not None:  # the launch's SconvBatch: did it carry the step's map?
                LAUNCHES[f"{key}_mapped"] += args[batch_at].tap_map is not None
            if meta_kw is not None:  # the adapter's builder hands on vLLM's device metadata
                LAUNCHES[f"{key}_engine_meta"] += kwargs.get(meta_kw) is not None
            return real(*args, **kwargs)

        setattr(module, name, launch)

    counted(sconv_kernel, "launch_fused_sconv", "fused_sconv", batch_at=2)
    counted(sconv_kv_kernel, "launch_fused_sconv_kv", "fused_sconv_kv", batch_at=3)
    counted(add_norm_kernel, "launch_sconv_add_rmsnorm", "fused_add_norm", batch_at=4)
    counted(add_norm_kernel, "launch_sconv_add", "fused_add", batch_at=4)
    counted(gathered_kernel, "launch_gathered_rms_norm", "gathered_norm")
    counted(tap_map_kernel, "launch_sconv_tap_map", "sconv_tap_map")
    counted(attention, "paged_rel_attention_triton", "rel_attention", meta_kw="max_seq_len")
    counted(attention, "write_kv_triton", "write_kv")


def snapshot() -> dict[str, int]:
    return dict(LAUNCHES)


def install_in_worker(model: Any) -> bool:
    """``llm.apply_model`` form of :func:`install` (the model is not used)."""
    install()
    return True


def snapshot_in_worker(model: Any) -> dict[str, int]:
    """``llm.apply_model`` form of :func:`snapshot`: this rank's counts so far."""
    return snapshot()


def difference(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}
