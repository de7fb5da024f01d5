"""Framework-neutral per-forward metadata for the paged short convolution.

Every paged engine already has, per step, a ``query_start_loc`` (request row
offsets into the flat token batch), a ``slot_mapping`` (the cache slot of every
token, ``-1`` for pad rows) and a ``block_table``. :class:`SconvMetadataBuilder`
turns those into what ``inkling_kernels.fused_sconv`` needs per token
(``seq_idx``: the token's request row; ``query_start``: the first flat row of that
request) in one launch, into buffers allocated once for ``max_num_tokens`` rows, so
the tensors handed to the kernel keep their addresses across steps and a CUDA graph
captured on one step replays on the next.

Given the conv kernel size ``W`` and the step's token positions, the builder also
fills the step's *tap map* (``inkling_kernels.sconv_tap_map``: where each of a
token's ``W - 1`` earlier taps comes from) into a persistent ``[max_num_tokens,
W - 1]`` int64 buffer. It is built once per step and shared by every
``fused_sconv`` launch of the group (all streams of all layers); on CUDA it saves
each launch the block-table lookups and the same-step hazard search.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inkling_kernels import sconv_seq_metadata, sconv_tap_map, uses_triton

__all__ = ["RelAttentionMetadata", "SconvMetadata", "SconvMetadataBuilder"]


@dataclass
class SconvMetadata:
    """What one forward pass of the paged short convolution needs.

    All tensors have one row per (padded) token of the flat batch, except
    ``block_table``.

    Attributes:
        block_table: ``[num_reqs, max_blocks]`` int32, physical block of each
            request's logical block (entries out of the window may hold a null or
            stale block; they are never read).
        slot_mapping: ``[T]`` int64, flat cache slot of each token
            (``block * block_size + row``); ``-1`` marks a pad row (no write).
        seq_idx: ``[T]`` int32, request row of each token (0 for pad rows).
        query_start: ``[T]`` int32, first flat row of the token's request in this
            forward (0 for pad rows).
        num_actual_tokens: real (non-pad) tokens, when known; informational.
        block_size: tokens per block the slot mapping was computed with, when
            known; the layers then check it against their bound cache's
            ``shape[2]`` (a mismatch silently corrupts the state otherwise).
        tap_map: ``[T, W - 1]`` int64, the step's tap map
            (``inkling_kernels.sconv_tap_map`` of exactly this metadata, the
            positions and ``block_size``), or ``None``. The layers pass it to every
            ``fused_sconv`` whose kernel size is ``W`` (the CUDA kernel then reads
            each tap's source from it; the CPU reference ignores it). A map built
            from other metadata gives wrong results.
    """

    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    seq_idx: torch.Tensor
    query_start: torch.Tensor
    num_actual_tokens: int | None = None
    block_size: int | None = None
    tap_map: torch.Tensor | None = None

    def tap_map_for(self, kernel_size: int) -> torch.Tensor | None:
        """The step's tap map when it was built for this kernel size, else ``None``
        (the layers then let the kernel resolve the taps itself)."""
        if self.tap_map is not None and self.tap_map.shape[1] == kernel_size - 1:
            return self.tap_map
        return None

    @property
    def num_tokens(self) -> int:
        """Rows of the flat batch this metadata describes (pad rows included)."""
        return int(self.slot_mapping.shape[0])


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

    @property
    def num_tokens(self) -> int:
        """Rows of the flat batch this metadata describes (pad rows included)."""
        return int(self.slot_mapping.shape[0])


class SconvMetadataBuilder:
    """Fills :class:`SconvMetadata` into persistent buffers.

    Args:
        max_num_tokens: the most (padded) tokens one forward may hold; the buffers
            are sized for it once and never reallocated.
        device: where the buffers live (the model's device).
        kernel_size: ``W`` of the layers that read this metadata (needed for the
            tap map; ``None``: no map).
        tap_map: whether :meth:`build` fills a tap map (when given positions).
            ``None`` (auto): when ``kernel_size`` is given and the ops run the Triton
            kernels on the device (``inkling_kernels.uses_triton``: CUDA, or CPU
            under ``INKLING_KERNELS_CPU_BACKEND=triton``; the CPU reference does not
            use the map); ``True``: always (needs
            ``kernel_size``; useful to test the map on CPU); ``False``: never.
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
        self.device = torch.device(device)
        self.seq_idx_buffer = torch.zeros(max_num_tokens, dtype=torch.int32, device=self.device)
        self.query_start_buffer = torch.zeros(max_num_tokens, dtype=torch.int32, device=self.device)
        # Used only when the caller's slot mapping is shorter than the padded
        # batch (it then holds the real tokens only): pad rows get -1 here.
        self.slot_mapping_buffer = torch.full(
            (max_num_tokens,), -1, dtype=torch.int64, device=self.device
        )
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
        """Whether :meth:`build` fills a tap map when it is given positions."""
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
        block_size: int | None = None,
        positions: torch.Tensor | None = None,
    ) -> SconvMetadata:
        """Build the metadata of one forward.

        Args:
            query_start_loc: ``[>= num_reqs + 1]`` int32 request row offsets
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
            block_size: the block size of the slot mapping, if the caller knows it
                (recorded for the layers to check; required to build a tap map).
            positions: ``[>= num_padded_tokens]`` int64/int32 absolute position of
                each row (pad rows: any value), on the builder's device. When the
                tap map is enabled (:attr:`builds_tap_map`) the step's map is built
                from them; without them no map is built (``tap_map`` is ``None``).

        Returns:
            Metadata whose ``seq_idx``/``query_start`` (and ``tap_map``) are views of
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
        if block_size is not None and (not isinstance(block_size, int) or block_size < 1):
            raise ValueError(f"block_size must be a positive int or None, got {block_size!r}")
        if num_padded_tokens < num_actual_tokens:
            raise ValueError(
                f"num_padded_tokens ({num_padded_tokens}) must be >= num_actual_tokens "
                f"({num_actual_tokens})"
            )
        if num_padded_tokens > self.max_num_tokens:
            raise ValueError(
                f"num_padded_tokens {num_padded_tokens} exceeds the builder's max_num_tokens "
                f"{self.max_num_tokens}: build the SconvMetadataBuilder with a larger max_num_tokens"
            )
        if query_start_loc.dim() != 1 or query_start_loc.shape[0] < num_reqs + 1:
            raise ValueError(
                f"query_start_loc must be 1-D with at least num_reqs + 1 = {num_reqs + 1} "
                f"entries, got shape {tuple(query_start_loc.shape)}"
            )
        if query_start_loc.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"query_start_loc must be int32 or int64, got {query_start_loc.dtype}")
        if block_table.dim() != 2:
            raise ValueError(
                f"block_table must be 2-D [num_reqs, max_blocks], got shape {tuple(block_table.shape)}"
            )
        if block_table.dtype != torch.int32:
            raise TypeError(f"block_table must be int32, got {block_table.dtype}")
        if block_table.shape[0] < num_reqs:
            raise ValueError(
                f"block_table has {block_table.shape[0]} rows, fewer than num_reqs {num_reqs}"
            )
        if slot_mapping.dim() != 1:
            raise ValueError(f"slot_mapping must be 1-D, got shape {tuple(slot_mapping.shape)}")
        if slot_mapping.dtype != torch.int64:
            raise TypeError(f"slot_mapping must be int64, got {slot_mapping.dtype}")
        for name, tensor in (
            ("query_start_loc", query_start_loc),
            ("slot_mapping", slot_mapping),
            ("block_table", block_table),
        ):
            if tensor.device != self.device:
                raise ValueError(
                    f"{name} is on {tensor.device}, the builder's buffers on {self.device}"
                )
        if positions is not None:
            if not isinstance(positions, torch.Tensor):
                raise TypeError(f"positions must be a torch.Tensor or None, got {type(positions).__name__}")
            if positions.dim() != 1:
                raise ValueError(
                    f"positions must be 1-D [num_padded_tokens], got shape {tuple(positions.shape)}"
                )
            if positions.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"positions must be int64 or int32, got {positions.dtype}")
            if positions.device != self.device:
                raise ValueError(
                    f"positions is on {positions.device}, the builder's buffers on {self.device}"
                )
            if positions.shape[0] < num_padded_tokens:
                raise ValueError(
                    f"positions has {positions.shape[0]} entries, fewer than num_padded_tokens "
                    f"({num_padded_tokens}): give a position for every row (pad rows: any value)"
                )
            if positions.shape[0] > 1 and positions.stride(0) != 1:
                raise ValueError(f"positions must be contiguous (stride 1), got stride {positions.stride(0)}")
        build_map = self.tap_map_buffer is not None and positions is not None
        if build_map and block_size is None:
            raise ValueError(
                "this builder fills a tap map, which needs the block size of the slot "
                "mapping: pass block_size= to build() (or build the SconvMetadataBuilder "
                "with tap_map=False)"
            )

        given = int(slot_mapping.shape[0])
        if given >= num_padded_tokens:
            slots = slot_mapping[:num_padded_tokens]
        elif given >= num_actual_tokens:
            slots = self.slot_mapping_buffer[:num_padded_tokens]
            slots[:given].copy_(slot_mapping)
            slots[given:].fill_(-1)
        else:
            raise ValueError(
                f"slot_mapping has {given} entries, fewer than num_actual_tokens "
                f"({num_actual_tokens}): give a slot for every real token (pad rows -1)"
            )

        sconv_seq_metadata(
            query_start_loc,
            num_reqs,
            num_actual_tokens,
            self.seq_idx_buffer,
            self.query_start_buffer,
            num_padded_tokens,
        )
        seq_idx = self.seq_idx_buffer[:num_padded_tokens]
        query_start = self.query_start_buffer[:num_padded_tokens]
        tap_map = None
        if build_map:
            assert self.tap_map_buffer is not None and positions is not None
            assert self.kernel_size is not None and block_size is not None
            sconv_tap_map(
                positions[:num_padded_tokens],
                block_table,
                seq_idx,
                slots,
                query_start,
                block_size,
                self.kernel_size,
                self.tap_map_buffer,
            )
            tap_map = self.tap_map_buffer[:num_padded_tokens]
        return SconvMetadata(
            block_table=block_table,
            slot_mapping=slots,
            seq_idx=seq_idx,
            query_start=query_start,
            num_actual_tokens=num_actual_tokens,
            block_size=block_size,
            tap_map=tap_map,
        )
