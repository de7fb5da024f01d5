"""Argument checks shared by the reference (CPU) path and the Triton launchers.

Every check runs on the host, before any launch, and reads only shapes, dtypes,
strides and devices: nothing here synchronises with the device, so the checks are
safe inside CUDA-graph capture. Values (slots, positions) are not inspected; the
kernels mask out-of-range slots instead (a slot outside the cache is never written).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
ACTIVATIONS = (None, "silu")


@dataclass(frozen=True)
class SconvProblem:
    """Normalised view of one `fused_sconv` call (after validation)."""

    weight2d: torch.Tensor  # [C, W] view of the weight (any strides)
    num_tokens: int  # T
    channels: int  # C = H * stream_width
    num_heads: int  # H
    kernel_size: int  # W
    num_slots: int  # num_blocks * block_size


def _need_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _need_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return value


def _need_1d_index(name: str, t: torch.Tensor, length: int, device: torch.device) -> None:
    if t.dim() != 1 or t.shape[0] != length:
        raise ValueError(
            f"{name} must have shape [T] = [{length}] (one entry per row of x), "
            f"got {tuple(t.shape)}"
        )
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}: move it to x's device")
    if length > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (stride 1), got stride {t.stride(0)}")


def check_fused_sconv_args(
    x: object,
    weight: object,
    cache: object,
    positions: object,
    block_table: object,
    seq_idx: object,
    slot_mapping: object,
    query_start: object,
    stream_offset: object,
    stream_width: object,
    block_size: object,
    activation: object,
    residual: object,
) -> SconvProblem:
    """Validate a `fused_sconv` call; raise TypeError/ValueError saying what to change."""
    x = _need_tensor("x", x)
    weight = _need_tensor("weight", weight)
    cache = _need_tensor("cache", cache)
    positions = _need_tensor("positions", positions)
    block_table = _need_tensor("block_table", block_table)
    seq_idx = _need_tensor("seq_idx", seq_idx)
    slot_mapping = _need_tensor("slot_mapping", slot_mapping)
    query_start = _need_tensor("query_start", query_start)
    stream_offset = _need_int("stream_offset", stream_offset)
    stream_width = _need_int("stream_width", stream_width)
    block_size = _need_int("block_size", block_size)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None or 'silu', got {activation!r}")
    if not isinstance(residual, bool):
        raise TypeError(f"residual must be a bool, got {type(residual).__name__}")

    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [T, H*stream_width], got shape {tuple(x.shape)}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError("x must be contiguous: pass x.contiguous()")
    device = x.device

    if cache.dim() != 4:
        raise ValueError(
            f"cache must be 4-D [num_blocks, H, N, D], got shape {tuple(cache.shape)}"
        )
    if cache.dtype != x.dtype:
        raise TypeError(
            f"cache dtype {cache.dtype} differs from x dtype {x.dtype}: the cache stores "
            "the conv inputs, so both must have the same dtype"
        )
    if cache.device != device:
        raise ValueError(f"cache is on {cache.device} but x is on {device}")
    num_blocks, num_heads, cache_block, head_size = cache.shape
    if head_size > 1 and cache.stride(3) != 1:
        raise ValueError(
            f"cache's last (D) dimension must have stride 1, got {cache.stride(3)}; "
            "page-strided views are fine, a transposed D is not"
        )
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if block_size != cache_block:
        raise ValueError(
            f"block_size {block_size} differs from the cache's block dimension "
            f"cache.shape[2] = {cache_block}: pass the runtime block size of the bound "
            "cache (engines may enlarge it beyond the kernel size)"
        )
    if stream_width < 1:
        raise ValueError(f"stream_width must be >= 1, got {stream_width}")
    if stream_offset < 0 or stream_offset + stream_width > head_size:
        raise ValueError(
            f"stream range [{stream_offset}, {stream_offset + stream_width}) lies outside "
            f"the cache's head size D = {head_size}"
        )
    num_tokens, channels = x.shape
    if channels != num_heads * stream_width:
        raise ValueError(
            f"x has {channels} channels but the cache has H = {num_heads} heads of stream "
            f"width {stream_width} (H*stream_width = {num_heads * stream_width})"
        )

    if weight.dim() == 3:
        if weight.shape[1] != 1:
            raise ValueError(
                f"a 3-D weight must be (dim, 1, W), got shape {tuple(weight.shape)}"
            )
        weight2d = weight[:, 0, :]
    elif weight.dim() == 2:
        weight2d = weight
    else:
        raise ValueError(f"weight must be (dim, W) or (dim, 1, W), got shape {tuple(weight.shape)}")
    if weight2d.shape[0] != channels:
        raise ValueError(
            f"weight has {weight2d.shape[0]} channels but x has {channels}: pass this "
            "rank's shard of the weight"
        )
    kernel_size = int(weight2d.shape[1])
    if kernel_size < 2:
        raise ValueError(f"kernel size W (weight.shape[-1]) must be >= 2, got {kernel_size}")
    if weight.dtype not in (torch.float32, x.dtype):
        raise TypeError(
            f"weight must be float32 or x's dtype {x.dtype}, got {weight.dtype}"
        )
    if weight.device != device:
        raise ValueError(f"weight is on {weight.device} but x is on {device}")

    _need_1d_index("positions", positions, num_tokens, device)
    _need_1d_index("seq_idx", seq_idx, num_tokens, device)
    _need_1d_index("slot_mapping", slot_mapping, num_tokens, device)
    _need_1d_index("query_start", query_start, num_tokens, device)
    if block_table.dim() != 2:
        raise ValueError(
            f"block_table must be 2-D [num_reqs, max_blocks], got shape {tuple(block_table.shape)}"
        )
    if block_table.dtype not in INDEX_DTYPES:
        raise TypeError(f"block_table must be int32 or int64, got {block_table.dtype}")
    if block_table.device != device:
        raise ValueError(f"block_table is on {block_table.device} but x is on {device}")
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        raise ValueError("block_table rows must be contiguous (stride(1) == 1)")

    return SconvProblem(
        weight2d=weight2d,
        num_tokens=num_tokens,
        channels=channels,
        num_heads=num_heads,
        kernel_size=kernel_size,
        num_slots=num_blocks * block_size,
    )


def check_seq_metadata_args(
    query_start_loc: object,
    num_reqs: object,
    num_actual_tokens: object,
    seq_idx_out: object,
    query_start_out: object,
    num_padded_tokens: object,
) -> None:
    """Validate a `sconv_seq_metadata` call; raise TypeError/ValueError saying what to change."""
    qsl = _need_tensor("query_start_loc", query_start_loc)
    seq_out = _need_tensor("seq_idx_out", seq_idx_out)
    qs_out = _need_tensor("query_start_out", query_start_out)
    num_reqs = _need_int("num_reqs", num_reqs)
    num_actual_tokens = _need_int("num_actual_tokens", num_actual_tokens)
    num_padded_tokens = _need_int("num_padded_tokens", num_padded_tokens)
    if qsl.dim() != 1 or qsl.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"query_start_loc must be a 1-D int32/int64 tensor [num_reqs+1], got "
            f"shape {tuple(qsl.shape)} dtype {qsl.dtype}"
        )
    if num_reqs < 0:
        raise ValueError(f"num_reqs must be >= 0, got {num_reqs}")
    if num_reqs > 0 and qsl.shape[0] < num_reqs + 1:
        raise ValueError(
            f"query_start_loc has {qsl.shape[0]} entries; num_reqs {num_reqs} needs "
            f"at least {num_reqs + 1}"
        )
    if qsl.shape[0] > 1 and qsl.stride(0) != 1:
        raise ValueError("query_start_loc must be contiguous")
    if not 0 <= num_actual_tokens <= num_padded_tokens:
        raise ValueError(
            f"need 0 <= num_actual_tokens <= num_padded_tokens, got {num_actual_tokens} "
            f"and {num_padded_tokens}"
        )
    if num_reqs == 0 and num_actual_tokens > 0:
        raise ValueError(f"num_actual_tokens is {num_actual_tokens} but num_reqs is 0")
    for name, buf in (("seq_idx_out", seq_out), ("query_start_out", qs_out)):
        if buf.dim() != 1 or buf.dtype != torch.int32:
            raise TypeError(
                f"{name} must be a 1-D int32 buffer, got shape {tuple(buf.shape)} dtype {buf.dtype}"
            )
        if buf.shape[0] < num_padded_tokens:
            raise ValueError(
                f"{name} holds {buf.shape[0]} rows but num_padded_tokens is {num_padded_tokens}"
            )
        if buf.shape[0] > 1 and buf.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous")
        if buf.device != qsl.device:
            raise ValueError(f"{name} is on {buf.device} but query_start_loc is on {qsl.device}")


# Tap-map codes (see inkling_kernels.tap_map): a pre-forward slot is stored in the
# low 32 bits, the writer row + 1 above them, so slots must stay below 2**31.
TAP_MAP_MAX_SLOTS = 2**31


def check_tap_map_args(
    positions: object,
    block_table: object,
    seq_idx: object,
    slot_mapping: object,
    query_start: object,
    block_size: object,
    kernel_size: object,
    tap_map_out: object,
) -> int:
    """Validate a `sconv_tap_map` call; return T (rows to fill)."""
    positions = _need_tensor("positions", positions)
    block_table = _need_tensor("block_table", block_table)
    seq_idx = _need_tensor("seq_idx", seq_idx)
    slot_mapping = _need_tensor("slot_mapping", slot_mapping)
    query_start = _need_tensor("query_start", query_start)
    tap_map_out = _need_tensor("tap_map_out", tap_map_out)
    block_size = _need_int("block_size", block_size)
    kernel_size = _need_int("kernel_size", kernel_size)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if kernel_size < 2:
        raise ValueError(f"kernel_size must be >= 2, got {kernel_size}")
    if positions.dim() != 1:
        raise ValueError(f"positions must be 1-D [T], got shape {tuple(positions.shape)}")
    num_tokens = int(positions.shape[0])
    device = positions.device
    _need_1d_index("positions", positions, num_tokens, device)
    _need_1d_index("seq_idx", seq_idx, num_tokens, device)
    _need_1d_index("slot_mapping", slot_mapping, num_tokens, device)
    _need_1d_index("query_start", query_start, num_tokens, device)
    if block_table.dim() != 2 or block_table.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"block_table must be a 2-D int32/int64 tensor [num_reqs, max_blocks], got "
            f"shape {tuple(block_table.shape)} dtype {block_table.dtype}"
        )
    if block_table.device != device:
        raise ValueError(f"block_table is on {block_table.device} but positions is on {device}")
    if block_table.shape[1] > 1 and block_table.stride(1) != 1:
        raise ValueError("block_table rows must be contiguous (stride(1) == 1)")
    _check_tap_map_buffer("tap_map_out", tap_map_out, num_tokens, kernel_size, device)
    return num_tokens


def _check_tap_map_buffer(
    name: str, tap_map: torch.Tensor, num_tokens: int, kernel_size: int, device: torch.device
) -> None:
    taps = kernel_size - 1
    if tap_map.dim() != 2 or tap_map.shape[1] != taps or tap_map.shape[0] < num_tokens:
        raise ValueError(
            f"{name} must be [>= T, W-1] = [>= {num_tokens}, {taps}] (one row per token, "
            f"one column per earlier tap), got shape {tuple(tap_map.shape)}"
        )
    if tap_map.dtype != torch.int64:
        raise TypeError(f"{name} must be int64, got {tap_map.dtype}")
    if tap_map.device != device:
        raise ValueError(f"{name} is on {tap_map.device} but the metadata is on {device}")
    if tap_map.shape[0] > 0 and (tap_map.stride(1) != 1 or (tap_map.shape[0] > 1 and tap_map.stride(0) != taps)):
        raise ValueError(f"{name} must be contiguous (rows of W-1 = {taps} entries)")


def check_tap_map_for_call(tap_map: object, prob: SconvProblem, device: torch.device) -> torch.Tensor:
    """Validate the optional ``tap_map`` of a `fused_sconv` call against its problem."""
    tap_map = _need_tensor("tap_map", tap_map)
    _check_tap_map_buffer("tap_map", tap_map, prob.num_tokens, prob.kernel_size, device)
    if prob.num_slots > TAP_MAP_MAX_SLOTS:
        raise ValueError(
            f"the cache has {prob.num_slots} slots; a tap_map addresses at most 2**31: "
            "call without tap_map"
        )
    return tap_map
