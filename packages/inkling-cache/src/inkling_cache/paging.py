"""Paging math: addressing, sliding-window block lifetime, admission reserve, page unification.

Addressing (``N`` = block size)::

    slot(p)        = block_table_row[p // N] * N + p % N
    block, row     = slot // N, slot % N

Sliding-window lifetime (as vLLM's sliding-window manager frees blocks): once a
request has ``n`` computed tokens, the next token at position ``n`` needs positions
``>= n - (window - 1)``, so logical blocks ``< (n - window + 1) // N`` are freed
(replaced by a null block in the block table).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LOOKAHEAD_DRAFT_METHODS",
    "TOKEN_DRAFT_METHODS",
    "PageSpec",
    "UnifiedPage",
    "admission_reserve_blocks",
    "blocks_for_tokens",
    "cdiv",
    "conv_page_without_padding",
    "first_live_block",
    "freed_blocks",
    "live_blocks",
    "slot_of",
    "slot_to_block_row",
    "speculative_lookahead_tokens",
    "steady_state_blocks",
    "tail_conv_admission_blocks",
    "tail_conv_live_blocks",
    "tail_conv_steady_blocks",
    "unify_page_sizes",
]


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ``a`` and positive ``b``.

    Raises:
        TypeError: ``a`` or ``b`` is not an int (a bool is not accepted).
        ValueError: ``a < 0`` or ``b < 1``.
    """
    _int("cdiv dividend a", a, 0)
    _int("cdiv divisor b", b, 1)
    return -(-a // b)


# --------------------------------------------------------------------------- addressing


def slot_of(position: int, block_table_row: Sequence[int], block_size: int) -> int:
    """Flat cache slot of absolute ``position`` given one request's block-table row.

    Returns ``block_table_row[position // block_size] * block_size + position % block_size``.

    Raises:
        ValueError: negative position, or the row has no entry for the position's block.
    """
    _int("position", position, 0)
    _int("block_size", block_size, 1)
    index = position // block_size
    if index >= len(block_table_row):
        raise ValueError(
            f"position {position} needs block-table entry {index} but the row has "
            f"{len(block_table_row)} entries (block_size {block_size})"
        )
    block = block_table_row[index]
    _int(f"block_table_row[{index}]", block, 0)
    return block * block_size + position % block_size


def slot_to_block_row(slot: int, block_size: int) -> tuple[int, int]:
    """``(physical block, row in block)`` of a slot (``slot < 0`` marks a pad row: error)."""
    _int("block_size", block_size, 1)
    _int("slot", slot, 0)
    return slot // block_size, slot % block_size


# --------------------------------------------------------------------------- lifetime


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks that hold positions ``[0, num_tokens)``: ``cdiv(num_tokens, block_size)``."""
    _int("num_tokens", num_tokens, 0)
    _int("block_size", block_size, 1)
    return cdiv(num_tokens, block_size)


def first_live_block(num_computed_tokens: int, sliding_window: int, block_size: int) -> int:
    """First logical block still needed after ``num_computed_tokens`` tokens.

    The next token (position ``n = num_computed_tokens``) reads positions
    ``>= n - (sliding_window - 1)``; every block before that position's block is free.
    """
    _int("num_computed_tokens", num_computed_tokens, 0)
    _int("sliding_window", sliding_window, 1)
    _int("block_size", block_size, 1)
    return max(0, num_computed_tokens - sliding_window + 1) // block_size


def freed_blocks(num_computed_tokens: int, sliding_window: int, block_size: int) -> range:
    """Logical block indices the sliding window has freed after ``num_computed_tokens``."""
    return range(first_live_block(num_computed_tokens, sliding_window, block_size))


def live_blocks(
    num_computed_tokens: int, num_new_tokens: int, sliding_window: int, block_size: int
) -> range:
    """Logical blocks a request holds while computing ``num_new_tokens`` more tokens."""
    first = first_live_block(num_computed_tokens, sliding_window, block_size)
    _int("num_new_tokens", num_new_tokens, 0)
    end = cdiv(num_computed_tokens + num_new_tokens, block_size)
    return range(first, max(first, end))


def steady_state_blocks(sliding_window: int, block_size: int, num_new_tokens: int = 1) -> int:
    """Most blocks a long request holds per layer while decoding ``num_new_tokens`` a step.

    The live positions span ``sliding_window - 1 + num_new_tokens`` consecutive
    positions, which touch at most ``cdiv(span - 1, N) + 1`` blocks: 2 for the conv
    state (window ``W`` <= ``N + 1``) in plain decode.
    """
    _int("sliding_window", sliding_window, 1)
    _int("block_size", block_size, 1)
    _int("num_new_tokens", num_new_tokens, 1)
    span = sliding_window - 1 + num_new_tokens
    return cdiv(span - 1, block_size) + 1


def admission_reserve_blocks(
    sliding_window: int,
    block_size: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    extra_retained_tokens: int = 0,
) -> int:
    """Blocks vLLM reserves per request for a sliding-window group.

    ``cdiv(min(W - 1 + extra + max_in_flight, max_model_len), block) + 1``, where
    ``W`` is the window, ``max_in_flight`` the most tokens one step may schedule
    (``max_num_batched_tokens``, plus draft tokens under speculative decoding) and
    ``extra`` tokens the engine retains beyond the window. The ``+ 1`` covers a window
    that does not start on a block boundary.
    """
    _int("sliding_window", sliding_window, 1)
    _int("block_size", block_size, 1)
    _int("max_num_batched_tokens", max_num_batched_tokens, 1)
    _int("max_model_len", max_model_len, 1)
    _int("extra_retained_tokens", extra_retained_tokens, 0)
    tokens = min(sliding_window - 1 + extra_retained_tokens + max_num_batched_tokens, max_model_len)
    return cdiv(tokens, block_size) + 1


#: vLLM speculative methods whose drafter runs its own layers (own KV-cache groups) and
#: so has vLLM allocate ``k`` lookahead slots past every step in every group.
LOOKAHEAD_DRAFT_METHODS = ("eagle", "eagle3", "mtp", "draft_model")
#: vLLM speculative methods that propose drafts from the tokens alone: no lookahead slots.
TOKEN_DRAFT_METHODS = ("ngram", "suffix")
#: methods under which vLLM's prefix-cache hit search matches one block further and drops
#: it (the EAGLE block drop): a checkpoint also keeps the block after its boundary
_BLOCK_DROP_METHODS = ("eagle", "eagle3", "mtp")


def speculative_lookahead_tokens(speculative_method: str | None, spec_tokens: int) -> int:
    """Lookahead slots vLLM allocates past each step for a speculative method: ``k`` for
    a drafter with its own layers (:data:`LOOKAHEAD_DRAFT_METHODS`), 0 for token-based
    drafts (:data:`TOKEN_DRAFT_METHODS`) and without speculative decoding (``None``).

    Raises:
        ValueError: an unknown method, or a method with ``spec_tokens == 0``.
    """
    k = _int("spec_tokens", spec_tokens, 0)
    if speculative_method is None:
        return 0
    if speculative_method not in LOOKAHEAD_DRAFT_METHODS + TOKEN_DRAFT_METHODS:
        raise ValueError(
            f"speculative_method {speculative_method!r} is not known: choose one of "
            f"{', '.join(TOKEN_DRAFT_METHODS)} (drafts from the tokens, no lookahead slots) or "
            f"{', '.join(LOOKAHEAD_DRAFT_METHODS)} (a drafter with its own layers: k lookahead slots)"
        )
    if k == 0:
        raise ValueError(f"speculative_method {speculative_method!r} needs spec_tokens >= 1 (the drafts per step)")
    return k if speculative_method in LOOKAHEAD_DRAFT_METHODS else 0


def _check_lookahead_written(speculative_method: str | None, spec_tokens: int, lookahead_written: int) -> None:
    look = speculative_lookahead_tokens(speculative_method, spec_tokens)
    if _int("lookahead_written", lookahead_written, 0) > look:
        raise ValueError(
            f"lookahead_written {lookahead_written} exceeds the {look} lookahead slots vLLM allocates "
            f"for speculative_method {speculative_method!r} with spec_tokens {spec_tokens}"
        )


def tail_conv_live_blocks(
    kernel_size: int,
    block_size: int,
    *,
    max_concurrent_batches: int = 1,
    spec_tokens: int = 0,
    lookahead_written: int = 0,
) -> int:
    """Most blocks one request's live tails touch together under the tail-rows
    conv-state manager (``inkling_vllm.conv_manager``), per conv layer.

    With ``B`` batches in flight ``B + 1`` tails are live: the one the first unrun
    step reads and each unrun step's own. A tail ends at its step's end plus ``L``,
    the lookahead slots this group's layers write (0 unless a drafter runs conv layers
    of this group: lookahead slots nobody in the group writes get no block). It
    reaches back ``W - 1`` rows for a step without drafts (a
    *chunk* tail: a chunk ending inside the prefill, or a step scheduling more than
    ``1 + k`` tokens, whose successor starts at its end) and ``R = W - 1 + k * B`` rows
    otherwise (a *decode* tail: up to ``k`` drafts, and a rejection moves the next start
    back by up to ``k`` per step in flight).

    A run of ``r`` consecutive rows touches at most ``cdiv(r - 1, N) + 1`` blocks. A
    decode step schedules at most ``1 + k`` tokens from a start at or below the
    previous step's end, and ``R >= 1 + k``, so its tail reaches back over that end: a
    tail and the ``l`` decode tails after it form one run of at most
    ``R + l * (1 + k) + L`` rows (a lone decode tail: ``R + L``; a lone chunk tail:
    ``W - 1 + L``). A chunk tail may start a new run anywhere, also after decode tails:
    a streaming-input session (vLLM's resumable requests) decodes, stops, and
    continues with a chunk of new prompt tokens while it keeps its blocks. So the live
    tails are a sequence of runs, each a tail followed by decode tails, and every run
    after the first starts with a chunk tail; the bound is the worst such sequence of
    ``B + 1`` tails (the sum of its runs' blocks).
    """
    _int("kernel_size", kernel_size, 2)
    _int("block_size", block_size, 1)
    batches = _int("max_concurrent_batches", max_concurrent_batches, 1)
    _int("spec_tokens", spec_tokens, 0)
    _int("lookahead_written", lookahead_written, 0)

    def run(rows: int) -> int:
        return cdiv(rows - 1, block_size) + 1

    chunk_tail = run(kernel_size - 1 + lookahead_written)
    reach = kernel_size - 1 + spec_tokens * batches + lookahead_written

    def decode_run(decode_tails: int) -> int:  # a decode tail (or any tail) and l decode tails after it
        return run(reach + decode_tails * (1 + spec_tokens))

    # after[m]: the most blocks m tails take as runs that each start with a chunk tail
    after = [0]
    for m in range(1, batches + 1):
        after.append(max(
            (decode_run(size - 1) if size > 1 else chunk_tail) + after[m - size]
            for size in range(1, m + 1)
        ))
    # the first run may start with either kind; starting with a decode tail is never
    # smaller (R >= W - 1), so take that
    return max(decode_run(size - 1) + after[batches + 1 - size] for size in range(1, batches + 2))


def tail_conv_steady_blocks(
    kernel_size: int,
    block_size: int,
    *,
    max_concurrent_batches: int = 1,
    spec_tokens: int = 0,
    speculative_method: str | None = None,
    lookahead_written: int = 0,
) -> int:
    """Most blocks one long request holds per conv layer in steady decode under the
    tail-rows conv-state manager (``inkling_vllm.conv_manager``), with or without drafts.

    In decode the live rows are one run from ``W - 1`` rows below the settled tokens
    (every in-flight step starts at or above them; rows below are freed before the
    next allocation, and an allocation adds table entries only past the existing
    ones, so a decode tail reaching further back holds nothing more) to the newest
    step's end plus the written lookahead ``L``. Without drafts ``B`` one-token steps
    are in flight; with drafts a step needs its predecessor's sampled tokens to draft
    from, so one step of ``1 + k`` tokens is. The run spans
    ``S = W - 1 + b * (1 + k) + L`` rows (``b`` the steps in flight), which touch at
    most ``cdiv(S - 1, N) + 1`` blocks: 2 at ``W = N = 4`` without drafts, 3 with
    ``k = 3`` drafts of either style (lookahead slots of a drafter with its own layers
    are not held: ``L = 0``).
    """
    _int("kernel_size", kernel_size, 2)
    _int("block_size", block_size, 1)
    batches = _int("max_concurrent_batches", max_concurrent_batches, 1)
    k = _int("spec_tokens", spec_tokens, 0)
    _check_lookahead_written(speculative_method, k, lookahead_written)
    in_flight = 1 if k else batches
    span = kernel_size - 1 + in_flight * (1 + k) + lookahead_written
    return cdiv(span - 1, block_size) + 1


def tail_conv_admission_blocks(
    kernel_size: int,
    block_size: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    *,
    max_concurrent_batches: int = 1,
    spec_tokens: int = 0,
    speculative_method: str | None = None,
    lookahead_written: int = 0,
    retention_tokens: int = 0,
) -> int:
    """Blocks per request and conv layer under the tail-rows conv-state manager
    (``inkling_vllm.conv_manager``): its admission cap and startup-sizing bound.

    The live tails (:func:`tail_conv_live_blocks`), plus the prefix-cache checkpoints
    of ``cdiv(W - 1, N)`` blocks each (their boundaries are block-aligned): the prompt
    end's (a resend hits there) and the shared-prefix junction's that vLLM pins when
    another request already cached a longer prefix in its attention layers; with a
    retention interval ``R > 0`` also the checkpoints of the ``B`` unrun chunks
    (``max_num_batched_tokens // R + 1`` each). ``speculative_method`` (``None``, a
    :data:`TOKEN_DRAFT_METHODS` or :data:`LOOKAHEAD_DRAFT_METHODS` name) says where the
    ``spec_tokens`` drafts come from; lookahead slots count only as far as this
    group's layers write them (``lookahead_written``). Under ``eagle``, ``eagle3`` and
    ``mtp`` vLLM's hit search matches one block past a hit and drops it, so a
    checkpoint keeps that block too, and the prompt end has two (a resend and a longer
    sibling land one alignment unit apart on an aligned prompt). Never more than vLLM's
    plain sliding-window reserve (:func:`admission_reserve_blocks` with
    ``B * max_num_batched_tokens`` in flight).
    """
    _int("max_num_batched_tokens", max_num_batched_tokens, 1)
    _int("max_model_len", max_model_len, 1)
    _int("retention_tokens", retention_tokens, 0)
    _check_lookahead_written(speculative_method, spec_tokens, lookahead_written)
    batches = max_concurrent_batches
    blocks = tail_conv_live_blocks(
        kernel_size, block_size, max_concurrent_batches=batches,
        spec_tokens=spec_tokens, lookahead_written=lookahead_written,
    )
    per_checkpoint = cdiv(kernel_size - 1, block_size)
    if speculative_method in _BLOCK_DROP_METHODS:
        per_checkpoint += 1
        blocks += 3 * per_checkpoint  # two at the prompt end, one at the junction
    else:
        blocks += 2 * per_checkpoint
    if retention_tokens:
        blocks += batches * (max_num_batched_tokens // retention_tokens + 1) * per_checkpoint
    plain = admission_reserve_blocks(kernel_size, block_size, batches * max_num_batched_tokens, max_model_len)
    return min(blocks, plain)


# --------------------------------------------------------------------------- unification


@dataclass(frozen=True)
class PageSpec:
    """One kind of cache page before unification.

    Attributes:
        name: a label (e.g. ``"conv/global"``, ``"attn/sliding"``).
        block_size: tokens per page.
        bytes_per_token: bytes one token takes in the page (``page = block * this``).
    """

    name: str
    block_size: int
    bytes_per_token: int

    def __post_init__(self) -> None:
        _int("block_size", self.block_size, 1)
        _int("bytes_per_token", self.bytes_per_token, 1)

    @property
    def page_bytes(self) -> int:
        """``block_size * bytes_per_token``."""
        return self.block_size * self.bytes_per_token


@dataclass(frozen=True)
class UnifiedPage:
    """A page after unification.

    Attributes:
        name: the :class:`PageSpec` name.
        original_block_size: block size before unification.
        block_size: block size after (scaled by ``scale``; unchanged when padded).
        scale: the factor the block size grew by (1 when padded or already largest).
        page_bytes: bytes the tokens of one block use (``block_size * bytes_per_token``).
        physical_page_bytes: bytes one block occupies (the common page size).
        padded: the page was padded instead of scaled.
    """

    name: str
    original_block_size: int
    block_size: int
    scale: int
    page_bytes: int
    physical_page_bytes: int
    padded: bool

    @property
    def original_page_bytes(self) -> int:
        """Page bytes before unification."""
        return self.page_bytes // self.scale

    @property
    def padding_bytes(self) -> int:
        """Unused bytes per physical page."""
        return self.physical_page_bytes - self.page_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready)."""
        return {
            "name": self.name,
            "original_block_size": self.original_block_size,
            "block_size": self.block_size,
            "scale": self.scale,
            "original_page_bytes": self.original_page_bytes,
            "page_bytes": self.page_bytes,
            "physical_page_bytes": self.physical_page_bytes,
            "padded": self.padded,
        }


def unify_page_sizes(specs: Sequence[PageSpec], *, pad: bool = False) -> list[UnifiedPage]:
    """Give every page kind the same page size, as vLLM's hybrid KV-cache manager does.

    The largest page wins; a page that divides it multiplies its block size by the
    ratio. A page that does not divide it is an error, unless ``pad=True``: then it
    keeps its block size and its physical page is padded up to the largest (what vLLM
    allows for backends that index pages by stride).

    Returns:
        One :class:`UnifiedPage` per spec, in order.

    Raises:
        TypeError: ``specs`` is not a sequence of :class:`PageSpec`.
        ValueError: no specs, or a page does not divide the largest and ``pad`` is off.
    """
    if isinstance(specs, (PageSpec, str, bytes)) or not isinstance(specs, Iterable):
        raise TypeError(
            f"specs must be a list of PageSpec, got {type(specs).__name__} {specs!r}: "
            "pass [PageSpec(name, block_size, bytes_per_token), ...]"
        )
    specs = list(specs)
    for i, spec in enumerate(specs):
        if not isinstance(spec, PageSpec):
            raise TypeError(
                f"specs[{i}] must be a PageSpec, got {type(spec).__name__} {spec!r}: "
                "build it with PageSpec(name, block_size, bytes_per_token)"
            )
    if not specs:
        raise ValueError("unify_page_sizes needs at least one PageSpec")
    largest = max(specs, key=lambda s: s.page_bytes)
    target = largest.page_bytes
    out = []
    for spec in specs:
        if target % spec.page_bytes == 0:
            scale = target // spec.page_bytes
            out.append(
                UnifiedPage(spec.name, spec.block_size, spec.block_size * scale, scale,
                            target, target, False)
            )
        elif pad:
            out.append(
                UnifiedPage(spec.name, spec.block_size, spec.block_size, 1,
                            spec.page_bytes, target, True)
            )
        else:
            raise ValueError(
                f"page of {spec.name!r} ({spec.page_bytes} bytes at block {spec.block_size}) "
                f"does not divide the largest page, {largest.name!r} ({target} bytes): change "
                "the block size or the padding so one divides the other, or pad the page "
                "(pad=True / --pad-pages)"
            )
    return out


def conv_page_without_padding(
    conv_row_bytes: Sequence[int], other_page_bytes: Sequence[int], min_rows: int
) -> int:
    """The smallest page size that the conv states and the other caches share with
    no page padded.

    vLLM gives every KV-cache group one page size: the largest page wins and every
    other page must divide it (its block size is multiplied by the ratio), else
    vLLM pads that page. A conv page is ``rows * row_bytes`` (``row_bytes`` =
    ``H * D * dtype bytes`` on this rank); when ``D`` is not padded to a power of
    two (say ``D = 192`` or ``1792``) no small conv block divides a power-of-two
    attention page, so instead the returned page ``P`` is a common multiple of
    every conv row and every other page: each conv group then declares
    ``P // row_bytes`` rows per block, every other cache's page divides ``P``, and
    nothing is padded. ``P`` is the least common multiple times the smallest power
    of two that gives every conv block at least ``min_rows`` rows (the rows a conv
    step reads, ``W - 1``); with power-of-two pages it is the largest page (or the
    conv page at ``min_rows`` rounded up to a power of two, if larger).

    Args:
        conv_row_bytes: bytes of one conv row of each conv group (>= 1 each, at
            least one).
        other_page_bytes: the pages of every other cache (attention), any number.
        min_rows: the fewest rows a conv block may hold (>= 1).

    Returns:
        ``P`` in bytes; ``P % b == 0`` for every given row and page size.
    """
    rows = [_int("conv_row_bytes entry", r, 1) for r in conv_row_bytes]
    pages = [_int("other_page_bytes entry", p, 1) for p in other_page_bytes]
    _int("min_rows", min_rows, 1)
    if not rows:
        raise ValueError("conv_page_without_padding needs at least one conv row size")
    lcm = 1
    for size in (*rows, *pages):
        lcm = lcm * size // math.gcd(lcm, size)
    scale = 1
    while any(lcm * scale // r < min_rows for r in rows):
        scale *= 2
    return lcm * scale
