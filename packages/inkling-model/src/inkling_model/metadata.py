"""Framework-neutral per-forward metadata for the paged short convolution.

The conv layers' metadata *is* the kernels' batch type: :data:`SconvMetadata` is
``inkling_kernels.SconvBatch`` (positions, block table, seq_idx, slot mapping,
query start, block size, kernel size, tap map), built and validated once per step and
KV-cache group and handed unchanged to every conv launch of the group.

Every paged engine already has, per step, a ``query_start_loc`` (request row
offsets into the flat token batch), a ``slot_mapping`` (the cache slot of every
token, ``-1`` for pad rows), a ``block_table`` and the tokens' positions.
:class:`SconvMetadataBuilder` turns those into a batch: ``seq_idx`` (the token's
request row) and ``query_start`` (the first flat row of that request) in one launch,
into buffers allocated once for ``max_num_tokens`` rows, so the tensors handed to the
kernel keep their addresses across steps and a CUDA graph captured on one step
replays on the next. Given the conv kernel size ``W`` it also fills the step's *tap
map* (``inkling_kernels.sconv_tap_map``) into a persistent ``[max_num_tokens, W - 1]``
int64 buffer, shared by every conv launch of the group (on CUDA it saves each launch
the block-table lookups and the same-step hazard search).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inkling_kernels import SconvBatch, sconv_seq_metadata, sconv_tap_map, uses_triton

__all__ = ["RelAttentionMetadata", "SconvMetadata", "SconvMetadataBuilder"]

#: The conv layers' per-step metadata: the kernels' batch type.
SconvMetadata = SconvBatch


@dataclass
class RelAttentionMetadata:
    """What one forward pass of the paged relative-logit attention needs, for the
    layers of one KV-cache group.

    Attributes:
        block_table: ``[num_reqs, max_blocks]`` int32/int64 (device), physical block of
            each request's logical block (blocks outside a sliding window may be a
            null block: never read).
        slot_mapping: ``[T]`` int64 (device), flat cache slot of each token's K/V
            (``block * block_size + row``); ``-1`` marks a pad row (no write).
        query_start_loc_cpu: ``[num_reqs + 1]`` host int tensor, first flat row of
            each request (rows from ``query_start_loc_cpu[-1]`` on are padding).
        seq_lens_cpu: ``[num_reqs]`` host int tensor, tokens in each request's
            context including this step's.
        block_size: tokens per block the slot mapping was computed with, when known;
            the layers check it against the bound cache.
        query_start_loc, seq_lens: optional copies of the two host tensors on the
            model's device (an engine's persistent buffers). The Triton path (GPU, or
            CPU under ``INKLING_KERNELS_CPU_BACKEND=triton``) reads them and never
            synchronises; without them it copies the host tensors each layer.
        max_seq_len: optional host bound on ``seq_lens`` (limits the key split of
            decode batches).
    """

    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_size: int | None = None
    query_start_loc: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    max_seq_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_table", "slot_mapping", "query_start_loc_cpu", "seq_lens_cpu"):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"RelAttentionMetadata.{name} must be a torch.Tensor, got {type(value).__name__}"
                )
        for name in ("query_start_loc", "seq_lens"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"RelAttentionMetadata.{name} must be a torch.Tensor or None, got {type(value).__name__}"
                )

    @property
    def num_tokens(self) -> int:
        """Rows of the flat batch this metadata describes (pad rows included)."""
        return int(self.slot_mapping.shape[0])


class SconvMetadataBuilder:
    """Builds the step's :class:`~inkling_kernels.SconvBatch` into persistent buffers.

    Args:
        max_num_tokens: the most (padded) tokens one forward may hold; the buffers
            are sized for it once and never reallocated.
        device: where the buffers live (the model's device).
        kernel_size: ``W`` of the layers that read this metadata (recorded in the
            batch, and needed for the tap map; ``None``: unknown, no map).
        tap_map: whether :meth:`build` fills a tap map. ``None`` (auto): when
            ``kernel_size`` is given and the ops run the Triton kernels on the device
            (``inkling_kernels.uses_triton``: CUDA, or CPU under
            ``INKLING_KERNELS_CPU_BACKEND=triton``; the CPU reference does not use the
            map); ``True``: always (needs ``kernel_size``; useful to test the map on
            CPU); ``False``: never.
    """

    def __init__(
        self,
        max_num_tokens: int,
        device: torch.device | str = "cpu",
        *,
        kernel_size: int | None = None,
        tap_map: bool | None = None,
    ) -> None:
        if not isinstance(max_num_tokens, int) or isinstance(max_num_tokens, bool):
            raise TypeError(f"max_num_tokens must be an int, got {type(max_num_tokens).__name__}")
        if max_num_tokens < 1:
            raise ValueError(f"max_num_tokens must be >= 1, got {max_num_tokens}")
        if kernel_size is not None:
            if not isinstance(kernel_size, int) or isinstance(kernel_size, bool):
                raise TypeError(f"kernel_size must be an int or None, got {type(kernel_size).__name__}")
            if kernel_size < 2:
                raise ValueError(f"kernel_size must be >= 2 (the conv width W), got {kernel_size}")
        if tap_map is not None and not isinstance(tap_map, bool):
            raise TypeError(f"tap_map must be True, False or None (auto), got {tap_map!r}")
        if tap_map is True and kernel_size is None:
            raise ValueError(
                "tap_map=True needs kernel_size: pass the layers' conv kernel size W "
                "(the map has W - 1 columns)"
            )
        self.kernel_size = kernel_size
        self.max_num_tokens = max_num_tokens
        self.seq_idx_buffer = torch.zeros(max_num_tokens, dtype=torch.int32, device=device)
        self.query_start_buffer = torch.zeros(max_num_tokens, dtype=torch.int32, device=device)
        # Used only when the caller's slot mapping is shorter than the padded
        # batch (it then holds the real tokens only): pad rows get -1 here.
        self.slot_mapping_buffer = torch.full((max_num_tokens,), -1, dtype=torch.int64, device=device)
        # "cuda" and "cuda:0" compare unequal: keep the resolved device.
        self.device = self.seq_idx_buffer.device
        if tap_map is None:
            tap_map = kernel_size is not None and uses_triton(self.device)
        #: The persistent ``[max_num_tokens, W - 1]`` tap-map buffer (``None``: the
        #: map is disabled).
        self.tap_map_buffer: torch.Tensor | None = None
        if tap_map and kernel_size is not None:
            self.tap_map_buffer = torch.full(
                (max_num_tokens, kernel_size - 1), -1, dtype=torch.int64, device=self.device
            )

    @property
    def builds_tap_map(self) -> bool:
        """Whether :meth:`build` fills a tap map."""
        return self.tap_map_buffer is not None

    def build(
        self,
        query_start_loc: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_table: torch.Tensor,
        num_reqs: int,
        num_actual_tokens: int,
        num_padded_tokens: int,
        *,
        block_size: int,
        positions: torch.Tensor,
        num_prefill_tokens: int | None = None,
    ) -> SconvBatch:
        """Build the batch of one forward (validated once, here).

        Args:
            query_start_loc: ``[>= num_reqs + 1]`` int32/int64 request row offsets
                (``query_start_loc[i]`` is request ``i``'s first flat row and
                ``query_start_loc[num_reqs] == num_actual_tokens``).
            slot_mapping: int64 slots, at least ``num_actual_tokens`` of them. With
                ``>= num_padded_tokens`` entries (pad rows already ``-1``) it is used
                as a view, no copy; a shorter one is copied into a persistent buffer
                whose remaining rows are set to ``-1``.
            block_table: ``[num_reqs or more, max_blocks]`` int32.
            num_reqs: requests in this forward.
            num_actual_tokens: real tokens (``query_start_loc[num_reqs]``).
            num_padded_tokens: rows of the padded batch (``>= num_actual_tokens``).
            block_size: the runtime block size of the group's caches (the slot
                mapping's; every launch checks it against its cache).
            positions: ``[>= num_padded_tokens]`` int64 absolute position of each row
                (pad rows: any value), on the builder's device.
            num_prefill_tokens: rows of the prompt requests, when the caller knows them
                on the host (``inkling_kernels.prefill_token_count`` of the requests'
                row counts): a hint for the kernel choice of prefill-sized launches
                (``SconvBatch.num_prefill_tokens``), never for the result.

        Returns:
            A batch whose ``seq_idx``/``query_start`` (and ``tap_map``) are views of
            this builder's buffers (valid until the next ``build``).
        """
        for name, value in (
            ("num_reqs", num_reqs),
            ("num_actual_tokens", num_actual_tokens),
            ("num_padded_tokens", num_padded_tokens),
        ):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if num_padded_tokens > self.max_num_tokens:
            raise ValueError(
                f"num_padded_tokens {num_padded_tokens} exceeds the builder's max_num_tokens "
                f"{self.max_num_tokens}: build the SconvMetadataBuilder with a larger max_num_tokens"
            )
        for name, value in (
            ("query_start_loc", query_start_loc),
            ("slot_mapping", slot_mapping),
            ("block_table", block_table),
            ("positions", positions),
        ):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if positions.dim() != 1 or positions.shape[0] < num_padded_tokens:
            raise ValueError(
                f"positions must be 1-D with at least num_padded_tokens ({num_padded_tokens}) "
                f"entries (pad rows: any value), got shape {tuple(positions.shape)}"
            )
        if block_table.dim() == 2 and block_table.shape[0] < num_reqs:
            raise ValueError(f"block_table has {block_table.shape[0]} rows, fewer than num_reqs {num_reqs}")
        given = int(slot_mapping.shape[0]) if slot_mapping.dim() == 1 else -1
        if given >= num_padded_tokens:
            slots = slot_mapping[:num_padded_tokens]
        elif given >= num_actual_tokens:
            if slot_mapping.dtype != torch.int64 or slot_mapping.device != self.device:
                raise TypeError(f"slot_mapping must be int64 on {self.device}, got {slot_mapping.dtype} on {slot_mapping.device}")
            slots = self.slot_mapping_buffer[:num_padded_tokens]
            slots[:given].copy_(slot_mapping)
            slots[given:].fill_(-1)
        else:
            raise ValueError(
                f"slot_mapping must be 1-D with at least num_actual_tokens ({num_actual_tokens}) "
                f"entries (a slot for every real token, pad rows -1), got shape {tuple(slot_mapping.shape)}"
            )
        # The batch checks every field once (shapes, dtypes, devices: it reads no
        # values, so it is built before the launches fill the buffers it views).
        batch = SconvBatch(
            positions=positions[:num_padded_tokens],
            # (its rows past num_reqs are never read; cut, the table's rows count the
            # requests, which fused_sconv's tiling reads: choose_config's num_requests)
            block_table=block_table[: max(num_reqs, 1)] if block_table.dim() == 2 else block_table,
            seq_idx=self.seq_idx_buffer[:num_padded_tokens],
            slot_mapping=slots,
            query_start=self.query_start_buffer[:num_padded_tokens],
            block_size=block_size,
            kernel_size=self.kernel_size,
            num_actual_tokens=num_actual_tokens,
            num_prefill_tokens=num_prefill_tokens,
        )
        sconv_seq_metadata(  # checks query_start_loc and the counts
            query_start_loc,
            num_reqs,
            num_actual_tokens,
            self.seq_idx_buffer,
            self.query_start_buffer,
            num_padded_tokens,
        )
        if self.tap_map_buffer is not None:
            batch = sconv_tap_map(batch, self.tap_map_buffer)
        return batch
