"""Compile every Triton kernel the Inkling model launches before the first request.

Triton compiles a kernel the first time it meets a new set of compile-time values;
the model's kernels take theirs from host-side tile rules over the batch's shape
(rows, requests, the longest context), so a server that meets a new shape class
while serving stalls for the compile. vLLM warms its own kernels and captures its
CUDA graphs at start-up; :func:`warm_up_kernels` adds one eager forward of the model
(no graph, metadata built by the model's own backends, every slot ``-1``: nothing is
written to the caches) for each shape class the tile rules distinguish, right after
vLLM's own kernel warm-up and before its graph capture and JIT monitor. Like vLLM's
own, it runs only while ``kernel_config.enable_jit_warmup`` is on (vLLM's default;
``enforce_eager`` turns it off). The conv kernels' classes are the items of their own
tile rules at the model's widths (:func:`conv_classes`), the attention's its tile
config per layer kind: about 20 forwards for a small engine, about 100 at the released
widths with an 8192-token budget. A first start on a machine compiles their kernels
(minutes at the released widths); later starts find them in Triton's on-disk cache. It
logs its progress.

The forwards also compile vLLM's Triton fused MoE for every compile class its
launches meet (:class:`FusedMoeShape`): its tile config changes with the token count,
and Triton compiles again when an integer argument (the token-expert pairs, the padded
row count) changes between divisible by 16 and not. :func:`moe_batches` adds a forward
for each class no other warm-up forward reaches.

The plugin installs it (:func:`install_warmup_hook`); :func:`warmup_batches` is the
pure shape-class logic (tested on the CPU against the tile rules and against vLLM's
own fused-MoE launch code).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inkling_kernels import PREFILL_MIN_ROWS

__all__ = [
    "ConvLaunches",
    "FusedMoeShape",
    "WarmupBatch",
    "attention_signature",
    "candidate_batches",
    "conv_classes",
    "fused_moe_shape",
    "shape_classes",
    "install_warmup_hook",
    "jit_warmup_enabled",
    "moe_batches",
    "triton_int_class",
    "v2_runnable",
    "warm_up_kernels",
    "warmup_batches",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmupBatch:
    """One dummy forward of ``num_tokens`` rows over ``num_reqs`` requests, each with a
    context of ``seq_len`` tokens (this step's rows included), shared as vLLM's dummy
    runs share them (``kind``):

    * ``"even"``: equal rows per request, the remainder on the last one;
    * ``"uniform"``: a uniform decode batch (every request the same decode length), the
      shape of vLLM's full-graph decode steps;
    * ``"mixed"``: ``num_reqs - 1`` one-row decodes, then one prompt of the rest.
    """

    num_tokens: int
    num_reqs: int
    seq_len: int
    kind: str = "even"

    @property
    def max_query_len(self) -> int:
        if self.kind == "mixed":
            return self.num_tokens - (self.num_reqs - 1)
        return self.num_tokens // self.num_reqs + self.num_tokens % self.num_reqs

    @property
    def prompt_rows(self) -> int:
        """The conv kernels' prefill hint for this forward, as the plugin's metadata
        builder counts it (``inkling_kernels.prefill_token_count``): the rows of the
        requests that bring more than ``PREFILL_MIN_ROWS`` rows."""
        t, r, most = self.num_tokens, self.num_reqs, PREFILL_MIN_ROWS
        if self.kind == "mixed":  # r - 1 one-row decodes, one prompt
            return self.max_query_len if self.max_query_len > most else 0
        each, last = t // r, self.max_query_len  # r - 1 requests of `each` rows, the last of the remainder too
        return (r - 1) * each * (each > most) + last * (last > most)


def _sizes(limit: int) -> list[int]:
    """1 to 16, every ``2**k`` and ``3 * 2**k`` up to ``limit``, and ``limit``."""
    out = {*range(1, min(16, limit) + 1), limit}
    k = 1
    while k <= limit:
        out.update(s for s in (k, 3 * k) if s <= limit)
        k *= 2
    return sorted(out)


def candidate_batches(max_tokens: int, max_reqs: int, max_seq_len: int, decode_len: int = 1) -> list[WarmupBatch]:
    """Batches spanning the shapes an engine serves. Request counts: every count up to
    66 (the attention's split rules look at exact small counts), then every ``2**k``
    and ``3 * 2**k`` up to ``max_reqs``; rows per request: 1 to 17, then ``2**k``,
    ``2**k + 1`` and ``3 * 2**k`` up to ``max_tokens``, with and without a remainder on
    the last request; uniform decodes of ``decode_len`` rows; one prompt after one
    decode or after as many decodes as it has rows. Each with the shortest context it
    allows and with contexts of every ``2**k`` and ``3 * 2**k`` from 64 to
    ``max_seq_len`` (and ``max_seq_len``): the key-split rule's thresholds lie between
    them."""
    for name, value in (("max_tokens", max_tokens), ("max_reqs", max_reqs), ("max_seq_len", max_seq_len),
                        ("decode_len", decode_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    contexts = [s for s in _sizes(max_seq_len) if s >= 64]
    counts = sorted({*range(1, min(66, max_reqs) + 1), *(s for s in _sizes(max_reqs))})
    per_request = sorted({*range(1, 18), *_sizes(max_tokens), *(s + 1 for s in _sizes(max_tokens))})
    shapes: set[tuple[int, int, str]] = set()
    for r in counts:
        for q in per_request:
            for t in (r * q, r * q + r - 1):
                if r <= t <= max_tokens:
                    shapes.add((t, r, "even"))
        if r * decode_len <= max_tokens:
            shapes.add((r * decode_len, r, "uniform"))
    for t in _sizes(max_tokens):
        shapes.update((t, d + 1, "mixed") for d in (1, min(max_reqs - 1, t // 2)) if t >= 4 and 1 <= d <= t // 2)
    out: set[WarmupBatch] = set()
    for t, r, kind in shapes:
        shortest = WarmupBatch(t, r, 1, kind).max_query_len
        for s in {shortest, *contexts}:
            if shortest <= s <= max_seq_len:
                out.add(WarmupBatch(t, r, s, kind))
    return sorted(out, key=_order)


def _order(b: WarmupBatch) -> tuple[int, int, int, str]:
    return (b.num_tokens, b.num_reqs, b.seq_len, b.kind)


@dataclass(frozen=True)
class ConvLaunches:
    """The conv kernels' launches in one forward of a model (:func:`conv_classes`):
    per conv layer kind on this rank, ``(num_heads, K/V width, ATTN width, MLP width,
    kernel_size)``; the tensor-parallel size; whether the sublayer tails are fused (conv
    + add + RMSNorm at TP 1, conv + add on the shard at TP > 1) or plain (a conv launch
    per stream). Every launch takes the step's tap map (the plugin's builders make one
    per step on CUDA)."""

    kinds: tuple[tuple[int, int, int, int, int], ...]
    tp_size: int = 1
    fused: bool = True

    @classmethod
    def of(cls, layouts: Sequence[Any], fused: bool = True) -> ConvLaunches:
        """From ``inkling_cache.ConvStateLayout`` s (one per layer; duplicates merge)."""
        from inkling_cache import Stream

        kinds = sorted({(lay.num_heads, lay.stream_width(Stream.K), lay.stream_width(Stream.ATTN),
                         lay.stream_width(Stream.MLP), lay.kernel_size) for lay in layouts})
        tps = {lay.tp_size for lay in layouts}
        if len(tps) > 1:
            raise ValueError(f"conv layouts of several tensor-parallel sizes: {sorted(tps)}")
        return cls(tuple(kinds), tps.pop() if tps else 1, fused)


def conv_classes(batch: WarmupBatch, launches: ConvLaunches) -> set[Hashable]:
    """What the conv kernels compile for one forward of ``batch``, from their own tile
    rules (their integer arguments are not specialised): the sequence metadata's and
    the tap map's tiles, and per layer kind the K+V launch's and each sublayer's
    (:class:`ConvLaunches`). A CPU test checks that each item comes with one set of
    Triton compile keys of the real launches. Only the rows, the requests and the
    prompt rows matter (the context does not), so the items are computed once each."""
    return set(_conv_items(batch.num_tokens, batch.num_reqs, batch.prompt_rows, launches))


@functools.lru_cache(maxsize=1 << 16)
def _conv_items(t: int, r: int, hint: int, launches: ConvLaunches) -> frozenset[Hashable]:
    from inkling_kernels.sconv.kernel import choose_config
    from inkling_kernels.sconv_add_rmsnorm.kernel import choose_add_config, choose_norm_config
    from inkling_kernels.seq_metadata.kernel import seq_metadata_block
    from inkling_kernels.tap_map.kernel import hazard_tiles

    out: set[Hashable] = {("metadata", seq_metadata_block(t)), ("tap map", hazard_tiles(t))}
    for h, kv, attn, mlp, kernel_size in launches.kinds:
        out.add(("kv", h, kv, choose_config(t, h, kv, True, one_load=False, num_requests=r, num_prefill_tokens=hint)))
        for w in (attn, mlp):
            if not launches.fused:
                out.add(("conv", h, w, choose_config(t, h, w, True, num_requests=r, num_prefill_tokens=hint)))
            elif launches.tp_size == 1:
                out.add(("norm", h, w, choose_norm_config(t, h, w, True, r, hint)))
            else:
                out.add(("add", h, w, choose_add_config(t, h, w, True, kernel_size, r, hint)))
    return frozenset(out)


def attention_signature(problems: Sequence[Any], device: Any) -> Callable[[WarmupBatch], tuple[Hashable, ...]]:
    """A batch's relative-attention shape classes, one per layer kind: the tile config
    the kernels' rule (``inkling_kernels.rel_attention.kernel.choose_rel_attention_config``)
    picks for each of ``problems`` (``RelAttentionProblem`` templates: the model's
    global and sliding layers) at the batch's rows, requests and longest context."""
    import dataclasses

    from inkling_kernels.rel_attention.kernel import choose_rel_attention_config

    def signature(batch: WarmupBatch) -> tuple[Hashable, ...]:
        return tuple(
            choose_rel_attention_config(
                dataclasses.replace(p, num_rows=batch.num_tokens, num_reqs=batch.num_reqs), device, batch.seq_len
            )
            for p in problems
        )

    return signature


def triton_int_class(value: int) -> str:
    """How Triton (3.x) specialises an integer kernel argument, which is part of its
    compile key: the value 1 becomes a constant; other values are typed ``i32`` or
    ``i64`` by range, and marked ``D`` when divisible by 16."""
    if value == 1:
        return "1"
    width = "i32" if -(2**31) <= value < 2**31 else "i64"
    return width + ("D" if value % 16 == 0 else "")


@dataclass(frozen=True)
class FusedMoeShape:
    """One MoE layer shape as vLLM's Triton fused MoE launches it, and
    :meth:`compile_class`: what its two ``fused_moe_kernel`` launches (gate/up, then
    down) compile for a forward of ``num_tokens`` rows.

    ``config(num_tokens)`` is vLLM's tile config for the count (its tuned table for the
    device when one exists, else its default rule); ``num_experts`` the experts vLLM
    aligns the token-expert pairs over (the rank's own, or every expert under expert
    parallelism, ``expert_map``)."""

    top_k: int
    num_experts: int
    expert_map: bool
    config: Callable[[int], Mapping[str, Any]]

    def compile_class(self, num_tokens: int) -> Hashable:
        """The tile config, whether vLLM skips the pairs' block alignment (few pairs
        per expert), and Triton's class of each launch's padded row count ``EM`` and
        pair count: as ``invoke_fused_moe_triton_kernel`` derives them, the first
        launch with ``num_tokens`` rows of ``top_k`` pairs, the second with one row per
        pair."""
        config = self.config(num_tokens)
        block_m = int(config["BLOCK_SIZE_M"])
        pairs = num_tokens * self.top_k
        naive = not self.expert_map and pairs * 4 <= self.num_experts
        if naive:  # no sorted ids: EM = pairs * BLOCK_SIZE_M for both launches
            padded = (pairs * block_m, pairs * block_m)
        else:  # the sorted ids' length, clipped for launches of fewer rows than a tile
            sorted_len = pairs + self.num_experts * (block_m - 1)
            if pairs < self.num_experts:
                sorted_len = min(pairs * block_m, sorted_len)
            padded = tuple(
                min(sorted_len, rows * k * block_m) if rows < block_m else sorted_len
                for rows, k in ((num_tokens, self.top_k), (pairs, 1))
            )
        return (tuple(sorted(config.items())), naive, *(triton_int_class(v) for v in (*padded, pairs)))


def moe_batches(max_tokens: int, shapes: Sequence[FusedMoeShape]) -> list[WarmupBatch]:
    """One single-request forward of the fewest rows for each fused-MoE compile class
    (:meth:`FusedMoeShape.compile_class`) a forward of 1 to ``max_tokens`` rows meets:
    the MoE sees every row of a forward, so the row count alone decides its class."""
    first: dict[Hashable, int] = {}
    for t in range(1, max_tokens + 1):
        for i, shape in enumerate(shapes):
            first.setdefault((i, shape.compile_class(t)), t)
    return [WarmupBatch(t, 1, t) for t in sorted(set(first.values()))]


def shape_classes(
    batch: WarmupBatch,
    signature: Callable[[WarmupBatch], tuple[Hashable, ...]],
    moe: Sequence[FusedMoeShape] = (),
    conv: ConvLaunches | None = None,
) -> set[Hashable]:
    """What one forward of ``batch`` compiles: each layer kind's attention config, the
    conv kernels' classes (:func:`conv_classes`; per batch kind: uniform decodes are
    the graphs' shape; ``None``: left out) and each MoE shape's fused-MoE class."""
    items: set[Hashable] = {("attention", i, cfg) for i, cfg in enumerate(signature(batch))}
    if conv is not None:
        uniform = batch.kind == "uniform"
        items.update(("conv", item, uniform) for item in conv_classes(batch, conv))
    items.update(("moe", i, shape.compile_class(batch.num_tokens)) for i, shape in enumerate(moe))
    return items


def warmup_batches(
    candidates: Sequence[WarmupBatch],
    signature: Callable[[WarmupBatch], tuple[Hashable, ...]],
    moe: Sequence[FusedMoeShape] = (),
    conv: ConvLaunches | None = None,
) -> list[WarmupBatch]:
    """A cover of every shape class the candidates reach (:func:`shape_classes`): the
    candidates in order (fewest rows, then requests, then context), each kept when it
    compiles something no kept one does."""
    covered: set[Hashable] = set()
    chosen = []
    for batch in sorted(set(candidates), key=_order):
        items = shape_classes(batch, signature, moe, conv)
        if not items <= covered:
            covered |= items
            chosen.append(batch)
    return chosen


# --- vLLM side ---------------------------------------------------------------------
def _attention_problems(model: Any) -> list[Any]:
    """``RelAttentionProblem`` templates of the model's attention layer kinds (one per
    distinct shape: global and sliding layers)."""
    from inkling_kernels.rel_attention.kernel import RelAttentionProblem
    from inkling_model import InklingRelAttention

    problems = set()
    for module in model.modules():
        if isinstance(module, InklingRelAttention) and module.owner.is_bound:
            o = module.owner
            problems.add(RelAttentionProblem(
                num_rows=1, num_reqs=1, num_q_heads=o.num_heads, num_kv_heads=o.num_kv_heads,
                head_dim=o.head_dim, d_rel=module.d_rel, extent=module.extent, block_size=o.block_size,
                scale=o.scale, window=o.window, log_scaling=o.log_scaling,
            ))
    return sorted(problems, key=repr)


def _conv_launches(model: Any) -> ConvLaunches:
    """The model's :class:`ConvLaunches`: its conv-state layers' layouts and whether
    its sublayer tails are fused."""
    from .conv_state import InklingConvStateLayer

    layouts = [m.layout for m in model.modules() if isinstance(m, InklingConvStateLayer)]
    inner = getattr(model, "model", model)
    return ConvLaunches.of(layouts, bool(getattr(inner, "fused", True)))


def fused_moe_shape(w13_shape: Sequence[int], w2_shape: Sequence[int], top_k: int, dtype: Any,
                    global_experts: int | None = None) -> FusedMoeShape:
    """The :class:`FusedMoeShape` of routed experts with weights ``w13 [E, 2N, K]`` and
    ``w2 [E, K, N]`` of ``dtype`` (unquantized), with vLLM's own tile-config lookup;
    ``global_experts``: the experts of every rank under expert parallelism (vLLM then
    aligns over all of them), ``None`` without."""
    from vllm.model_executor.layers.fused_moe.config import _get_config_dtype_str
    from vllm.model_executor.layers.fused_moe.fused_moe import try_get_optimal_moe_config

    config = functools.lru_cache(maxsize=None)(functools.partial(
        try_get_optimal_moe_config, tuple(w13_shape), tuple(w2_shape), top_k, _get_config_dtype_str(dtype=dtype)))
    expert_map = global_experts is not None
    return FusedMoeShape(top_k, global_experts if expert_map else int(w13_shape[0]), expert_map, config)


def _fused_moe_shapes(model: Any) -> list[FusedMoeShape]:
    """The distinct shapes of the model's MoE layers on vLLM's Triton fused MoE
    (:func:`fused_moe_shape`). Layers with quantized expert weights (vLLM runs other
    kernels for them) are left out."""
    import torch

    from .moe import InklingMoE

    shapes: dict[tuple[Any, ...], FusedMoeShape] = {}
    for module in model.modules():
        if not isinstance(module, InklingMoE):
            continue
        experts = module.experts.routed_experts
        w13, w2 = experts.w13_weight, experts.w2_weight
        if w13.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            continue
        global_experts = module.n_routed_experts if int(module.experts.moe_config.ep_size) > 1 else None
        key = (tuple(w13.shape), tuple(w2.shape), module.top_k, w13.dtype, global_experts)
        if key not in shapes:
            shapes[key] = fused_moe_shape(w13.shape, w2.shape, module.top_k, w13.dtype, global_experts)
    return list(shapes.values())


@contextlib.contextmanager
def _request_limit(owner: Any, attribute: str, value: int) -> Iterator[None]:
    """vLLM's dummy runs spread their rows over ``min(rows, limit)`` requests."""
    saved = getattr(owner, attribute)
    setattr(owner, attribute, value)
    try:
        yield
    finally:
        setattr(owner, attribute, saved)


def _runs_v2(runner: Any) -> bool:
    """vLLM's second-generation GPU model runner (``vllm.v1.worker.gpu``): its dummy
    runs take a context length and spread rows evenly; it cannot run a mixed batch."""
    return "context_len" in inspect.signature(runner._dummy_run).parameters


def v2_runnable(candidates: Sequence[WarmupBatch]) -> list[WarmupBatch]:
    """The batches the second-generation runner's dummy runs can form: rows shared
    evenly over the requests (or a uniform decode), no mixed batch."""
    return [b for b in candidates if b.kind != "mixed" and (b.kind == "uniform" or b.num_tokens % b.num_reqs == 0)]


def _dummy_forward(runner: Any, batch: WarmupBatch) -> None:
    from vllm.config import CUDAGraphMode

    if _runs_v2(runner):
        with _request_limit(runner, "max_num_reqs", batch.num_reqs):
            # is_profile: run eager (never replay or capture a graph for the size)
            runner._dummy_run(batch.num_tokens, uniform_decode=batch.kind == "uniform", skip_eplb=True,
                              is_profile=True, context_len=batch.seq_len - batch.max_query_len)
        return
    with _request_limit(runner.scheduler_config, "max_num_seqs", batch.num_reqs):
        runner._dummy_run(  # is_profile: eager, and every row a real (unpadded) token
            batch.num_tokens,
            is_profile=True,
            cudagraph_runtime_mode=CUDAGraphMode.NONE,
            force_attention=True,
            uniform_decode=batch.kind == "uniform",
            create_mixed_batch=batch.kind == "mixed",
            skip_eplb=True,
            remove_lora=False,
            profile_seq_lens=batch.seq_len,
        )


def warm_up_kernels(runner: Any) -> int:
    """Run one eager dummy forward of the Inkling model per shape class (see the
    module docstring) on vLLM's GPU model runner; returns the forwards run (0 when the
    model is not the plugin's Inkling or the device is not CUDA)."""
    from .model import InklingForCausalLM

    if runner.device.type != "cuda" or not isinstance(runner.get_model(), InklingForCausalLM):
        return 0
    if not jit_warmup_enabled(runner):
        logger.info("inkling-vllm: kernel warm-up skipped, as vLLM's own (kernel_config.enable_jit_warmup is "
                    "off; enforce_eager turns it off): kernels compile when a step first needs them")
        return 0
    model = runner.get_model()
    problems = _attention_problems(model)
    if not problems:
        return 0
    v2 = _runs_v2(runner)
    max_reqs = int(runner.max_num_reqs if v2 else runner.scheduler_config.max_num_seqs)
    decode_len = int(getattr(runner, "decode_query_len", 0) or getattr(runner, "uniform_decode_query_len", 1) or 1)
    max_tokens = int(runner.max_num_tokens)
    candidates = candidate_batches(max_tokens, max_reqs, int(runner.max_model_len), decode_len)
    if v2:
        candidates = v2_runnable(candidates)
    moe = _fused_moe_shapes(model)
    candidates += moe_batches(max_tokens, moe)
    batches = warmup_batches(candidates, attention_signature(problems, runner.device), moe, _conv_launches(model))
    logger.info("inkling-vllm: kernel warm-up: %d shape classes (of %d candidate batches); a first start compiles "
                "their kernels, later ones load them from Triton's cache", len(batches), len(candidates))
    start = last = time.perf_counter()
    took = []
    for i, batch in enumerate(batches):
        t0 = time.perf_counter()
        _dummy_forward(runner, batch)
        now = time.perf_counter()
        took.append((now - t0, batch))
        if now - last >= PROGRESS_EVERY_S:
            logger.info("inkling-vllm: kernel warm-up: %d/%d shape classes, %.0f s", i + 1, len(batches), now - start)
            last = now
    runner._inkling_warmed = len(batches)
    slowest = ", ".join(f"{b.num_tokens} rows/{b.num_reqs} requests/{b.seq_len} context ({b.kind}) {t:.1f} s"
                        for t, b in sorted(took, key=lambda x: -x[0])[:3])
    logger.info("inkling-vllm: kernel warm-up: %d shape classes in %.1f s (slowest: %s)",
                len(batches), time.perf_counter() - start, slowest)
    return len(batches)


#: Seconds between the warm-up's progress lines.
PROGRESS_EVERY_S = 15.0


def jit_warmup_enabled(runner: Any) -> bool:
    """Whether the engine warms its kernels up: vLLM's ``kernel_config.enable_jit_warmup``
    (on by default, off with ``enforce_eager``), which the plugin's warm-up follows as
    vLLM's own does."""
    config = getattr(getattr(runner, "vllm_config", None), "kernel_config", None)
    return bool(getattr(config, "enable_jit_warmup", True))


def install_warmup_hook() -> bool:
    """Make vLLM's GPU worker run :func:`warm_up_kernels` after its own kernel warm-up,
    then, before it captures its CUDA graphs,
    :func:`inkling_vllm.one_row_graphs.install_one_row_graphs` (idempotent). Returns False where the worker module or its hook point is missing
    (CPU builds, other vLLM versions): the engine then serves without it."""
    try:
        from vllm.v1.worker import gpu_worker
    except Exception:  # CPU builds may not import the CUDA worker
        return False
    original = getattr(gpu_worker, "kernel_warmup", None)
    if original is None:
        return False
    if getattr(original, "_inkling_warmup", False):
        return True

    @functools.wraps(original)
    def kernel_warmup(worker: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(worker, *args, **kwargs)
        warm_up_kernels(worker.model_runner)
        from .one_row_graphs import install_one_row_graphs

        install_one_row_graphs(worker.model_runner)  # (before the worker captures its graphs)
        return result

    kernel_warmup._inkling_warmup = True  # type: ignore[attr-defined]
    gpu_worker.kernel_warmup = kernel_warmup
    return True
