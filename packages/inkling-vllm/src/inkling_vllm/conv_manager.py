"""Conv state that holds only the rows a later step reads ("tail rows").

A conv layer's step reads, from the cache, the ``W - 1`` rows before its first new
token and nothing else (every other tap is in the step's own input). Declared as a
plain ``SlidingWindowSpec``, vLLM's sliding-window manager keeps a real block for
every position from ``processed - (W - 1)`` to the end of the scheduled chunk, so a
chunked prefill holds a block for every in-flight token, and admission and startup
sizing reserve ``cdiv(W - 1 + max_in_flight_tokens, N) + 1`` blocks per request.

:class:`ConvStateSpec` (a ``SlidingWindowSpec``) and :class:`ConvStateManager` (a
``SlidingWindowManager``) keep the position-indexed block table (so the kernels and
the worker's slot mapping do not change) but give a real block only to table
entries that hold a row some later step may read:

* the *tail* of each scheduled step: rows ``[end - (W - 1), end + L)`` for a
  step without drafts (a chunk ending inside the prefill, or scheduling more than
  ``1 + k`` tokens: the next step starts at its end), ``[end - (W - 1) - k * B, ...)``
  for a decode step (``k`` speculative tokens: a rejected draft moves the next start
  back by up to ``k``, per step in flight); it is released once the step after it
  has run, and rows below ``settled - (W - 1)`` are dropped before that (no unrun
  step starts below the settled tokens: vLLM's sliding window frees on that rule).
  ``L`` is the lookahead slots this group's layers write (``lookahead_written``, 0
  by default): the ``num_lookahead_tokens`` slots vLLM allocates past every step for
  an EAGLE-style drafter are written by the drafter's own layers, so this group
  gives them no table entry at all;
* *checkpoints* for prefix caching: the ``W - 1`` rows before the prompt's last
  hit-aligned boundary (so resending a conversation hits), before the shared-prefix
  junction vLLM pins for the request (``shared_prefix_boundary``: another request
  cached a longer prefix in the attention layers than in this group, so a third
  request sharing it hits there, as under the plain sliding window), and, with a
  retention interval ``R > 0``, before every multiple of ``R``; released once their
  chunk has run, they stay hashed in the free queue (evictable) like any freed
  cached block. Where vLLM's hit search uses the EAGLE block drop (it matches one
  block past a hit, then drops it), a checkpoint also keeps the block after its
  boundary, and the prompt end follows vLLM's EAGLE replay boundaries (one alignment
  unit lower, for a resend and for a longer sibling);
* the rows of a prefix-cache hit, until the first new step has run.

Every other entry is the null block; the metadata builder turns slots in it into
``-1`` ("do not store"), which the kernels honour. A real block is always real from
the step that first covers it, so every row in it was stored: a cached block is
complete, and a prefix hit (``cdiv(W - 1, N)`` cached blocks ending at it, the
sliding-window rule) reads only stored rows.

Per request at most ``B + 1`` tails are live (``B`` = batches in flight: the one
the next unrun step reads, each unrun step's own), plus checkpoints. The admission
cap and ``max_memory_usage_bytes`` are ``inkling_cache.tail_conv_admission_blocks``
(the derivation is in ``inkling_cache.tail_conv_live_blocks``): at ``W = N = 4``, 6
blocks with one batch in flight and 8 with two (7 and 9 with ``k = 3`` drafts; 11 and 13
under the EAGLE block drop), whatever the prompt length; steady decode holds
``inkling_cache.tail_conv_steady_blocks`` (2, or 3 with ``k = 3``). A streaming-input
session (vLLM's resumable requests) keeps its blocks between turns, so a chunk tail can
follow decode tails; the bound counts that.
The conv block (before vLLM's page unification scales it) is :func:`tail_block_size`,
the smallest power of two holding ``W - 1`` rows, so pages unify without padding.

Not supported: KV-connector (external) tokens; select the plain spec for those.

Which manager serves the conv layers is one switch (:data:`MANAGER_ENV` /
:data:`MANAGER_KEY`, ``tail`` by default, ``window`` for the plain spec); the
retention interval is :data:`RETENTION_ENV` / :data:`RETENTION_KEY`.

Registration: :func:`register_conv_state_spec` (idempotent) runs at import of this
module (so unpickling a spec in the engine core registers it) and from the plugin
(every vLLM process). It registers vLLM's built-in specs first: the registry fills
itself lazily only while empty, so a plugin registering first would leave
``FullAttentionSpec`` without a manager in that process.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from inkling_cache import tail_conv_admission_blocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
from vllm.v1.kv_cache_interface import KVCacheSpec, SlidingWindowSpec
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

from .options import (
    MANAGER_CHOICES,
    MANAGER_ENV,
    MANAGER_KEY,
    RETENTION_ENV,
    RETENTION_KEY,
    conv_retention_tokens,
    conv_state_manager,
)

__all__ = [
    "MANAGER_CHOICES",
    "MANAGER_ENV",
    "MANAGER_KEY",
    "RETENTION_ENV",
    "RETENTION_KEY",
    "ConvStateManager",
    "ConvStateSpec",
    "conv_state_manager",
    "conv_retention_tokens",
    "register_conv_state_spec",
    "tail_block_size",
]

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tail_block_size(kernel_size: int) -> int:
    """Rows per conv block under the tail manager: the smallest power of two that
    holds ``W - 1`` rows. The block no longer has to hold a whole window (tails may
    span blocks), and a power of two keeps the conv page (``N * H * D * bytes`` with
    power-of-two ``H`` and padded ``D``) a divisor or multiple of the attention pages,
    so vLLM's page unification scales block sizes instead of padding pages (a
    kernel-3 or kernel-5 window of 3 or 5 rows would be padded up to the largest page)."""
    if kernel_size < 2:
        raise ValueError(f"conv kernel size must be >= 2, got {kernel_size}")
    return 1 << (kernel_size - 2).bit_length()


@dataclass(frozen=True, kw_only=True)
class ConvStateSpec(SlidingWindowSpec):
    """A conv layer's state: a sliding window of ``W = sliding_window`` rows whose
    manager keeps only tail rows (see the module docstring).

    Fields beyond the sliding-window spec (all part of equality, so every conv
    layer of one engine shares them):

    spec_tokens: draft tokens per step (``k``); a rejection moves the next start
        back by up to ``k`` rows per step in flight, so tails keep ``W - 1 + k * B`` rows.
    lookahead_tokens: slots vLLM allocates past the scheduled tokens (EAGLE-style
        drafters; 0 for n-gram). This group gives them no block unless its own
        layers write them (``lookahead_written``).
    lookahead_written: how many of those slots this group's layers write: all of
        them for a drafter that runs Inkling decoder layers (MTP, a draft model: their
        conv states join this group), 0 for an EAGLE head (attention layers only),
        whose lookahead slots the conv never writes or reads.
    concurrent_batches: steps in flight (``B``; 2 with async scheduling).
    retention_tokens: prefix-cache checkpoint interval ``R`` (0: prompt end only).
    """

    spec_tokens: int = 0
    lookahead_tokens: int = 0
    lookahead_written: int = 0
    concurrent_batches: int = 1
    retention_tokens: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("spec_tokens", "lookahead_tokens", "lookahead_written", "retention_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"ConvStateSpec.{name} must be >= 0, got {getattr(self, name)}")
        if self.lookahead_written > self.lookahead_tokens:
            raise ValueError(
                f"ConvStateSpec.lookahead_written ({self.lookahead_written}) exceeds lookahead_tokens "
                f"({self.lookahead_tokens}): layers can write only slots vLLM allocates"
            )
        if self.concurrent_batches < 1:
            raise ValueError(f"ConvStateSpec.concurrent_batches must be >= 1, got {self.concurrent_batches}")
        if self.sliding_window < 2:
            raise ValueError(f"ConvStateSpec.sliding_window (the conv kernel) must be >= 2, got {self.sliding_window}")

    @property
    def tail_rows(self) -> int:
        """Rows before a decode step's end that a later step may read: ``W - 1 + k * B``
        (a step's rejected drafts move the next start back by up to ``k``; with ``B``
        steps in flight, corrections of the steps before it can add up)."""
        return self.sliding_window - 1 + self.spec_tokens * self.concurrent_batches

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int, max_model_len: int) -> int:
        """The most real blocks one request holds at any step (admission cap and,
        through ``max_memory_usage_bytes``, startup sizing):
        ``inkling_cache.tail_conv_admission_blocks`` (the live tails, the prompt-end
        checkpoint and, with ``R > 0``, the unrun chunks' checkpoints), which is never
        more than the plain sliding window would reserve."""
        batches = self.concurrent_batches
        method = ("eagle" if self.lookahead_tokens else "ngram") if self.spec_tokens else None
        blocks = tail_conv_admission_blocks(
            self.sliding_window, self.block_size, max(1, max_in_flight_tokens // batches), max_model_len,
            max_concurrent_batches=batches, spec_tokens=self.spec_tokens, speculative_method=method,
            lookahead_written=self.lookahead_written, retention_tokens=self.retention_tokens,
        )
        return min(blocks, super().max_admission_blocks_per_request(max_in_flight_tokens, max_model_len))


_Window = tuple[int, int, int]  # (first row, end row, released once processed >= this)


class ConvStateManager(SlidingWindowManager):  # type: ignore[misc]
    """Single-type manager of a :class:`ConvStateSpec` group: real blocks only
    under live windows (tails, checkpoints, a hit's rows), null elsewhere.

    The sliding-window parts it keeps: the prefix-cache hit search (a hit needs the
    ``cdiv(W - 1, N)`` cached blocks ending at it), the hit's null padding, the
    admission path of ``get_num_blocks_to_allocate``. What it replaces: which new
    table entries get a real block (:meth:`allocate_new_blocks`, predicted exactly
    by :meth:`get_num_blocks_to_allocate`, which for a request's first step adds
    room for a junction checkpoint vLLM may pin), which are freed
    (:meth:`remove_skipped_blocks`, skipping nulls), which are hashed (every
    real full block: :meth:`reachable_block_mask` returns ``None``), and the pinned
    shared-prefix junction (:meth:`cache_blocks`).
    """

    def __init__(self, kv_cache_spec: ConvStateSpec, **kwargs: Any) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        if not isinstance(kv_cache_spec, ConvStateSpec):
            raise TypeError(f"ConvStateManager serves ConvStateSpec groups, got {type(kv_cache_spec).__name__}")
        self.conv_spec = kv_cache_spec
        self.tail_rows = kv_cache_spec.tail_rows
        self.reach = kv_cache_spec.sliding_window - 1  # rows a step's first token reads
        self.retention_tokens = kv_cache_spec.retention_tokens
        self.lookahead_written = kv_cache_spec.lookahead_written
        # the most tokens a decode step schedules (1 + k): a longer step carries no drafts
        self._decode_tokens = 1 + kv_cache_spec.spec_tokens
        # one checkpoint's blocks (a hit boundary is block-aligned)
        self.checkpoint_blocks = _cdiv(self.reach, self.block_size)
        align = int(self.cache_hit_alignment_tokens)
        if self.retention_tokens % align:
            raise ValueError(
                f"{RETENTION_KEY}/{RETENTION_ENV} is {self.retention_tokens}: it must be a multiple "
                f"of the prefix-cache hit alignment ({align} tokens in this engine), or 0"
            )
        self._windows: dict[str, list[_Window]] = {}
        self._real: dict[str, set[int]] = {}
        self._extent: dict[str, int] = {}
        # the prompt length, from remove_skipped_blocks (vLLM's allocate_slots passes it
        # there before asking for blocks): where the prompt-end checkpoint goes
        self._prompt_len: dict[str, int] = {}
        # where the prefill ends (vLLM's admission call: prompt, or a resumed request's recompute)
        self._prefill_end: dict[str, int] = {}
        # the shared-prefix junction vLLM pins for the request (0: none), learnt in cache_blocks
        self._junction: dict[str, int] = {}
        # the newest step: (its first token, its main-model end, first new table index, new entries)
        self._newest: dict[str, tuple[int, int, int, list[KVCacheBlock]]] = {}

    # -- which rows must be real ------------------------------------------------

    def _checkpoint_ends(self, after: int, upto: int, prompt_len: int) -> list[int]:
        """Hit boundaries whose checkpoint rows the step over ``(after, upto]`` writes."""
        if not self.enable_caching or upto <= after:
            return []
        ends: set[int] = set()
        align = int(self.cache_hit_alignment_tokens)
        if prompt_len > 0:
            # a resend of the prompt (or a longer conversation) hits at the last
            # aligned boundary below the prompt's final token (vLLM recomputes it);
            # under the EAGLE block drop, one alignment unit lower (vLLM's replay
            # boundaries: for a resend and for a longer sibling)
            resend = (prompt_len - 1) // align * align
            if self.use_eagle:
                ends.update({max(resend - align, 0), max(prompt_len // align * align - align, 0)})
            else:
                ends.add(resend)
        step = self.retention_tokens
        if step > 0:
            first = max(0, after - self.block_size) // step * step
            ends.update(range(first, upto + 1, step))
        return sorted(end for end in ends if end > 0 and self._writes_checkpoint(after, upto, end))

    def _checkpoint_window(self, end: int, release: int) -> _Window:
        """The rows a hit at ``end`` reads from this group's cached blocks: the ``W - 1``
        before it, and under the EAGLE block drop (vLLM's hit search matches one block
        further, then drops it) the block after it too."""
        extra = self.block_size if self.use_eagle else 0
        return (max(0, end - self.reach), end + extra, release)

    def _writes_checkpoint(self, after: int, upto: int, end: int) -> bool:
        """Whether the step over ``(after, upto]`` completes a checkpoint at ``end`` (the
        rows before ``after`` are the previous step's tail, real already)."""
        if self.use_eagle:
            return after <= end and end + self.block_size <= upto
        return after < end <= upto

    def _step_windows(self, request_id: str, start: int, num_tokens: int, main_end: int) -> list[_Window]:
        """Windows a step adds: its tail, then its chunk's checkpoints.

        A step that carries no drafts keeps ``W - 1`` rows (its successor starts exactly
        at its end); a step with drafts keeps ``W - 1 + k * B``. vLLM reports, on every
        allocation, ``prefill_end = max(prompt, tokens - 1)``: a step ending at most one
        past it carries no drafts (a prompt chunk; the last chunk of a resumed request's
        recompute, which ends at ``tokens``; a decode step of the last sampled token
        alone, whose predecessors are settled, since the scheduler's count would be ahead
        of ``tokens`` otherwise), and neither does a step scheduling more than ``1 + k``
        tokens (a decode step schedules at most that)."""
        # (runs for every request and step: conditionals, not max/min calls)
        prompt_len = self._prompt_len.get(request_id, 0)
        prefill_end = self._prefill_end.get(request_id, 0)
        if prompt_len > prefill_end:
            prefill_end = prompt_len
        no_drafts = main_end <= prefill_end + 1 or main_end - start > self._decode_tokens
        lo = main_end - (self.reach if no_drafts else self.tail_rows)
        hi = main_end + self.lookahead_written
        windows = [(lo if lo > 0 else 0, num_tokens if num_tokens < hi else hi, main_end + 1)]
        if self.enable_caching:
            for end in self._checkpoint_ends(start, main_end, prompt_len):
                windows.append(self._checkpoint_window(end, main_end))
        junction = self._junction.get(request_id, 0)
        if junction > 0 and self._writes_checkpoint(start, main_end, junction):
            windows.append(self._junction_window(junction, main_end))
        return windows

    def _junction_window(self, junction: int, main_end: int) -> _Window:
        """The checkpoint rows of the pinned shared-prefix junction, held until the step
        covering them has run, then left cached in the free queue like any checkpoint."""
        return self._checkpoint_window(junction, main_end)

    def _table_end(self, num_tokens: int, num_tokens_main_model: int) -> int:
        """Table entries a step needs: up to its main-model end plus the lookahead slots
        this group's layers write; slots past that (an EAGLE-style drafter's, written
        into its own groups) get no entry."""
        written = num_tokens_main_model + self.lookahead_written
        return -(-(num_tokens if num_tokens < written else written) // self.block_size)

    def _indices(self, windows: Iterable[_Window]) -> set[int]:
        n = self.block_size
        live: set[int] = set()
        for lo, hi, _ in windows:
            if hi > lo:
                live.update(range(lo // n, _cdiv(hi, n)))
        return live

    # -- vLLM hooks -------------------------------------------------------------

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        if prefill_end > 0:
            # where the request's prefill (its prompt, or a resumed request's
            # recompute) ends; vLLM passes it on every call before allocating
            self._prefill_end[request_id] = int(prefill_end)
        if apply_admission_cap:
            # the sliding-window admission count, capped by this spec's small bound
            return int(
                super().get_num_blocks_to_allocate(
                    request_id, num_tokens, new_computed_blocks, total_computed_tokens,
                    num_local_computed_tokens, num_tokens_main_model,
                    apply_admission_cap=True, prefill_end=prefill_end,
                )
            )
        end_index = self._table_end(num_tokens, num_tokens_main_model)
        junction_allowance = 0
        if request_id in self._extent or request_id in self.num_cached_block:  # running: no new hits
            start_index = len(self.req_to_blocks.get(request_id, ()))
            if end_index <= start_index:  # most decode steps: no new table entry
                return 0
            windows = list(self._windows.get(request_id, ()))
            start = self._extent.get(request_id, 0)
            evictable = 0
        else:
            hit = total_computed_tokens
            start_index = len(new_computed_blocks) + len(self.req_to_blocks.get(request_id, ()))
            windows = [(max(0, hit - self.reach), hit, hit + 1)] if hit > 0 else []
            start = hit
            skipped = self.get_num_skipped_tokens(hit) // self.block_size
            evictable = self._get_num_evictable_blocks(new_computed_blocks[skipped:])
            if self.enable_caching and request_id not in self._junction:
                # vLLM tells the junction it pins only when it caches this first step
                # (cache_blocks), after the allocation: room for its checkpoint
                junction_allowance = self.checkpoint_blocks + (1 if self.use_eagle else 0)
        windows += self._step_windows(request_id, start, num_tokens, num_tokens_main_model)
        live = self._indices(windows)
        return evictable + junction_allowance + sum(1 for b in range(start_index, end_index) if b in live)

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        super().add_local_computed_blocks(
            request_id, new_computed_blocks, num_local_computed_tokens, num_external_computed_tokens
        )
        hit = num_local_computed_tokens + num_external_computed_tokens
        blocks = self.req_to_blocks[request_id]
        self._real[request_id] = {i for i, blk in enumerate(blocks) if not blk.is_null}
        self._windows[request_id] = [(max(0, hit - self.reach), hit, hit + 1)] if hit > 0 else []
        self._extent[request_id] = hit

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        if num_external_computed_tokens > 0:
            raise NotImplementedError(
                "inkling-vllm's conv-state manager does not load external (KV-connector) "
                f"tokens; select the plain sliding-window spec ({MANAGER_ENV}=window)"
            )

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        if request_id in self._partial_hit_reqs:  # sliding-window hits are block-aligned
            raise RuntimeError(f"unexpected partial prefix-cache hit for conv-state request {request_id}")
        blocks = self.req_to_blocks[request_id]
        start = self._extent.get(request_id, 0)
        step = self._step_windows(request_id, start, num_tokens, num_tokens_main_model)
        windows = self._windows.get(request_id)
        if windows is None:
            self._windows[request_id] = windows = step
        else:
            windows += step
        self._extent[request_id] = start if start > num_tokens_main_model else num_tokens_main_model
        first, end_index = len(blocks), self._table_end(num_tokens, num_tokens_main_model)
        # (read only by cache_blocks before it learns the request's junction)
        newest = self.enable_caching and request_id not in self._junction
        if end_index <= first:  # most decode steps: no new table entry
            if newest:
                self._newest[request_id] = (start, num_tokens_main_model, first, [])
            return []
        real = self._real.setdefault(request_id, set())
        live = self._indices(windows)
        wanted = [b for b in range(first, end_index) if b in live]
        fresh = iter(self.block_pool.get_new_blocks(len(wanted)))
        new_blocks: list[KVCacheBlock] = []
        for b in range(first, end_index):
            if b in live:
                new_blocks.append(next(fresh))
                real.add(b)
            else:
                new_blocks.append(self._null_block)
        blocks.extend(new_blocks)
        if self._record_new_block_ids:
            self.new_block_ids.extend(b.block_id for b in new_blocks if not b.is_null)
        if newest:
            self._newest[request_id] = (start, num_tokens_main_model, first, new_blocks)
        return new_blocks

    def cache_blocks(
        self,
        request: Any,
        num_tokens: int,
        retention_interval: int | None = None,
        *,
        replay_boundaries: Sequence[int],
    ) -> None:
        """Hash every real full block, after honouring vLLM's pinned shared-prefix
        junction (``request.shared_prefix_boundary``, set when the request is
        scheduled from zero computed tokens): the ``W - 1`` rows before it are kept as
        a checkpoint, so a later request sharing that prefix hits there as it would
        under the plain sliding window. vLLM calls this right after the allocation of
        the step, before handing its blocks to the worker: a junction inside that step
        turns its null entries into real blocks in place (counted by
        :meth:`get_num_blocks_to_allocate`); a junction in a later chunk is a window
        of that chunk."""
        rid = request.request_id
        if rid not in self._junction:
            # a hit lands only on the hit alignment: the rows before the aligned floor
            align = int(self.cache_hit_alignment_tokens)
            junction = int(getattr(request, "shared_prefix_boundary", 0) or 0) // align * align
            self._junction[rid] = junction
            if junction and rid in self._newest:
                self._keep_junction(rid, junction)
        super().cache_blocks(request, num_tokens, retention_interval, replay_boundaries=replay_boundaries)

    def _keep_junction(self, request_id: str, junction: int) -> None:
        start, main_end, first, new_blocks = self._newest[request_id]
        if not self._writes_checkpoint(start, main_end, junction):
            return  # a later chunk covers it (see _step_windows), or it is below the hit
        window = self._junction_window(junction, main_end)
        self._windows.setdefault(request_id, []).append(window)
        blocks = self.req_to_blocks[request_id]
        real = self._real.setdefault(request_id, set())
        # entries below ``first`` were handed out by earlier steps: the rows there are
        # the previous tail or the hit's, real already
        wanted = [b for b in sorted(self._indices([window])) if b >= first and blocks[b].is_null]
        for b, block in zip(wanted, self.block_pool.get_new_blocks(len(wanted))):
            blocks[b] = block
            new_blocks[b - first] = block
            real.add(b)
            if self._record_new_block_ids:
                self.new_block_ids.append(block.block_id)

    def remove_skipped_blocks(
        self,
        request_id: str,
        processed_computed_tokens: int,
        num_prompt_tokens: int | None = None,
    ) -> None:
        """Free every real block no live window covers. A window is live until the
        step that reads it has run (``processed_computed_tokens`` counts only
        settled tokens, so in-flight steps keep theirs); nulls are skipped."""
        if num_prompt_tokens is not None:
            self._prompt_len[request_id] = int(num_prompt_tokens)
        if request_id not in self.req_to_blocks:
            return
        # Every unsettled or later step starts at or after the settled tokens, so no
        # step reads a row below ``processed - (W - 1)`` again (vLLM's sliding window
        # frees on the same rule). Checkpoints of unrun chunks end above ``processed``
        # and a hit's rows end at it: trimming only cuts tails' rows that are past.
        # (called for every running request and step: plain loops, no generators)
        floor = processed_computed_tokens - self.reach
        windows = []
        for lo, hi, release in self._windows.get(request_id, ()):
            if processed_computed_tokens < release:
                windows.append((lo if lo > floor else floor, hi, release))
        self._windows[request_id] = windows
        real = self._real.get(request_id)
        if not real:
            return
        n = self.block_size
        # a real block is dead when no window's rows [lo, hi) reach into it (a request
        # holds a few real blocks and windows, so this beats building the live set)
        dead = []
        for b in real:
            start, end = b * n, (b + 1) * n
            for lo, hi, _ in windows:
                if lo < end and hi > start and hi > lo:
                    break
            else:
                dead.append(b)
        if not dead:
            return
        dead.sort(reverse=True)
        blocks = self.req_to_blocks[request_id]
        freed = []
        for b in dead:
            freed.append(blocks[b])
            blocks[b] = self._null_block
            real.discard(b)
        self.block_pool.free_blocks(freed)

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        for state in (
            self._windows, self._real, self._extent, self._prompt_len, self._prefill_end,
            self._junction, self._newest,
        ):
            state.pop(request_id, None)
        return list(super().pop_blocks_for_free(request_id))

    @classmethod
    def reachable_block_mask(cls, *args: Any, **kwargs: Any) -> list[bool] | None:
        # Only real blocks exist to hash (nulls are skipped), and each is complete:
        # hash them all; which boundaries keep rows is decided at allocation.
        return None

    def held_blocks(self, request_id: str) -> int:
        """Real blocks the request holds now (for measurements and tests)."""
        return len(self._real.get(request_id, ()))


_registered = False


def register_conv_state_spec() -> None:
    """Map :class:`ConvStateSpec` to :class:`ConvStateManager` in vLLM's
    ``KVCacheSpecRegistry`` (idempotent; vLLM's built-ins are registered first)."""
    global _registered
    if _registered:
        return
    KVCacheSpecRegistry._ensure_registered()
    KVCacheSpecRegistry.register(ConvStateSpec, ConvStateManager, uniform_type_base_spec=SlidingWindowSpec)
    _registered = True


def spec_kind(spec: KVCacheSpec) -> str:
    """``tail`` or ``window``: which conv-state manager a spec selects."""
    return "tail" if isinstance(spec, ConvStateSpec) else "window"


register_conv_state_spec()
