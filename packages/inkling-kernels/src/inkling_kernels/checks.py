"""Every host-side check of the sconv ops, in one place.

Two kinds, run at two rates:

- :func:`check_batch` validates a :class:`~inkling_kernels.batch.SconvBatch` (the
  step's per-token metadata) when it is built: once per step and KV-cache group;
- :func:`check_conv_call` validates what one launch adds to the batch (``x``, the
  weight, the cache, the stream range) and checks the cache against the batch (its
  block dimension, the token count, the device): once per launch. The fused
  conv + add op adds :func:`check_add_extras`, the fused conv + add + norm op
  :func:`check_norm_extras`; the K+V launch (``fused_sconv_kv``)
  runs :func:`check_kv_call` instead, the same checks per stream plus the pair's.

Nothing here reads a device tensor's values or synchronises with the device, so every
check is safe inside CUDA-graph capture. Values (slots, positions) are not inspected; the
kernels mask out-of-range slots instead (a slot outside the cache is never written).
Two checks read more than shapes, on the host only: :func:`check_seq_metadata_args`
reads ``query_start_loc``'s values when it is a CPU tensor, and :func:`output_for`
compares an output's address range with the inputs' (``data_ptr``; skipped while
tracing).

Dtypes are exact, as the kernel contract states them (docs/design.md §3): positions
and slot mapping int64, block table, seq_idx and query start int32, tap map int64.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch

from ._dispatch import has_memory, traced

if TYPE_CHECKING:
    from .batch import SconvBatch

#: Activation (and cache) dtypes of every sconv op.
ACTIVATION_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
ACTIVATIONS = (None, "silu")
#: Tap-map codes keep a pre-forward slot in their low 32 bits (inkling_kernels.tap_map).
TAP_MAP_MAX_SLOTS = 2**31


class SconvProblem(NamedTuple):
    """Shapes of one conv launch, derived from its tensors (no checks). (A named tuple:
    every eager launch builds one or two.)"""

    weight2d: torch.Tensor  # [C, W] view of the weight (any strides)
    num_tokens: int  # T
    channels: int  # C = H * stream_width
    num_heads: int  # H
    kernel_size: int  # W
    num_slots: int  # num_blocks * N

    @classmethod
    def of(cls, x: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor) -> SconvProblem:
        num_blocks, num_heads, block, _ = cache.shape
        rows, channels = x.shape
        return cls.from_shapes(weight, weight.dim(), int(rows), int(channels), int(num_heads), int(weight.shape[-1]),
                               int(num_blocks * block))

    @classmethod
    def from_shapes(cls, weight: torch.Tensor, weight_dims: int, num_tokens: int, channels: int, num_heads: int,
                    kernel_size: int, num_slots: int) -> SconvProblem:
        """The problem from values already read off the tensors (``weight`` is
        ``(C, W)`` or ``(C, 1, W)``, ``weight_dims`` its dimension count)."""
        return cls(weight.squeeze(1) if weight_dims == 3 else weight, num_tokens, channels, num_heads, kernel_size,
                   num_slots)


def need_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def need_int(name: str, value: object, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def need_index(
    name: str, t: object, dtype: torch.dtype, device: torch.device | None, length: int | None = None
) -> torch.Tensor:
    """A contiguous 1-D index tensor of exactly ``dtype`` (``length`` rows if given)."""
    t = need_tensor(name, t)
    if t.dim() != 1 or (length is not None and t.shape[0] != length):
        want = "[T]" if length is None else f"[T] = [{length}] (one entry per token)"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {_dtype_name(dtype)}, got {t.dtype}: convert it once per step")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the batch is on {device}: move it")
    if t.shape[0] > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (stride 1), got stride {t.stride(0)}")
    return t


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_tap_map_buffer(name: str, tap_map: object, num_tokens: int, kernel_size: int, device: torch.device) -> torch.Tensor:
    """``[>= T, W-1]`` int64, contiguous rows, on ``device``."""
    tap_map = need_tensor(name, tap_map)
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
    return tap_map


def check_batch(batch: SconvBatch) -> None:
    """Validate a batch's fields (run by ``SconvBatch`` itself, once per build)."""
    positions = need_tensor("positions", batch.positions)
    if positions.dim() != 1:
        raise ValueError(f"positions must be 1-D [T], got shape {tuple(positions.shape)}")
    device = positions.device
    num_tokens = int(positions.shape[0])
    need_index("positions", positions, torch.int64, device)
    need_index("seq_idx", batch.seq_idx, torch.int32, device, num_tokens)
    need_index("slot_mapping", batch.slot_mapping, torch.int64, device, num_tokens)
    need_index("query_start", batch.query_start, torch.int32, device, num_tokens)
    table = need_tensor("block_table", batch.block_table)
    if table.dim() != 2:
        raise ValueError(f"block_table must be 2-D [num_reqs, max_blocks], got shape {tuple(table.shape)}")
    if table.dtype != torch.int32:
        raise TypeError(f"block_table must be int32, got {table.dtype}: convert it once per step")
    if table.device != device:
        raise ValueError(f"block_table is on {table.device} but the batch is on {device}: move it")
    if table.shape[1] > 1 and table.stride(1) != 1:
        raise ValueError("block_table rows must be contiguous (stride(1) == 1)")
    need_int("block_size", batch.block_size, 1)
    if batch.kernel_size is not None:
        need_int("kernel_size", batch.kernel_size, 2)
    if batch.tap_map is not None:
        if batch.kernel_size is None:
            raise ValueError("a batch with a tap_map needs its kernel_size (the map has W - 1 columns)")
        check_tap_map_buffer("tap_map", batch.tap_map, num_tokens, batch.kernel_size, device)
    # optional row counts: at most the batch's rows
    for name, value, hint in (
        ("num_actual_tokens", batch.num_actual_tokens, "(its padded token count, num_padded_tokens)"),
        ("num_prefill_tokens", batch.num_prefill_tokens,
         "count the rows of the prompt requests only (prefill_token_count)"),
    ):
        if value is not None and need_int(name, value, 0) > num_tokens:
            raise ValueError(f"{name} {value} exceeds the batch's {num_tokens} rows: {hint}")


def check_tap_map_call(batch: object, tap_map_out: object) -> int:
    """Validate a `sconv_tap_map` call (a batch naming its kernel size, and the
    buffer to fill); return the kernel size W."""
    from .batch import SconvBatch

    if not isinstance(batch, SconvBatch):
        raise TypeError(f"batch must be an inkling_kernels.SconvBatch, got {type(batch).__name__}")
    if batch.kernel_size is None:
        raise ValueError(
            "the batch has no kernel_size: build it with the layers' conv kernel size W "
            "(the tap map has W - 1 columns)"
        )
    check_tap_map_buffer("tap_map_out", tap_map_out, batch.num_tokens, batch.kernel_size, batch.device)
    _check_table_for_tokens(batch, batch.num_tokens)
    return batch.kernel_size


def _check_table_for_tokens(batch: SconvBatch, num_tokens: int) -> None:
    """A batch with tokens needs a block table with a row and a column (taps before a
    call resolve through it)."""
    table_shape = batch.block_table.shape
    if num_tokens > 0 and (table_shape[0] == 0 or table_shape[1] == 0):
        raise ValueError(
            f"block_table has shape {tuple(table_shape)} but the batch has {num_tokens} tokens: "
            "pass the step's table, a row per request (at least one) and a column per block"
        )


def _check_epilogue(activation: object, residual: object) -> None:
    """The conv epilogue: ``activation`` None or "silu", ``residual`` a bool."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None or 'silu', got {activation!r}")
    if not isinstance(residual, bool):
        raise TypeError(f"residual must be a bool, got {type(residual).__name__}")


def _need_batch(batch: object) -> SconvBatch:
    from .batch import SconvBatch

    if not isinstance(batch, SconvBatch):
        raise TypeError(f"batch must be an inkling_kernels.SconvBatch, got {type(batch).__name__}")
    return batch


def _check_stream(
    x_name: str,
    x: object,
    w_name: str,
    weight: object,
    cache: object,
    batch: SconvBatch,
    offset_name: str,
    stream_offset: object,
    stream_width: int,
    *,
    row_strided: bool,
) -> SconvProblem:
    """One stream of a conv launch: its input rows, its weight, its range inside the
    cache's D, and the cache against the batch. ``row_strided``: ``x`` may be a
    column slice of a wider tensor (unit column stride, rows that do not overlap);
    otherwise it must be contiguous. (Every eager launch runs this: each tensor
    attribute is read once.)"""
    x = need_tensor(x_name, x)
    weight = need_tensor(w_name, weight)
    cache = need_tensor("cache", cache)
    stream_offset = need_int(offset_name, stream_offset)

    x_shape, x_dtype, x_device = x.shape, x.dtype, x.device
    if len(x_shape) != 2:
        raise ValueError(f"{x_name} must be 2-D [T, H*stream_width], got shape {tuple(x_shape)}")
    rows, channels = x_shape
    if x_dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"{x_name} must be bfloat16, float16 or float32, got {x_dtype}")
    if not row_strided:
        if not x.is_contiguous():
            raise ValueError(f"{x_name} must be contiguous: pass {x_name}.contiguous()")
    else:
        row_stride, col_stride = x.stride()
        if rows > 0 and channels > 1 and col_stride != 1:
            raise ValueError(
                f"{x_name} must have unit column stride (a column slice of the projection "
                f"output is fine), got strides {(row_stride, col_stride)}: pass {x_name}.contiguous()"
            )
        if rows > 1 and row_stride < channels:
            raise ValueError(
                f"{x_name}'s rows overlap: row stride {row_stride} < its {channels} columns; "
                f"pass {x_name}.contiguous()"
            )
    positions = batch.positions
    if rows != positions.shape[0]:
        raise ValueError(
            f"{x_name} has {rows} rows but the batch describes {batch.num_tokens} tokens: "
            f"pad {x_name} to the batch's (padded) token count"
        )
    if x_device != positions.device:
        raise ValueError(f"{x_name} is on {x_device} but the batch is on {batch.device}")
    _check_table_for_tokens(batch, rows)

    cache_shape = cache.shape
    if len(cache_shape) != 4:
        raise ValueError(f"cache must be 4-D [num_blocks, H, N, D], got shape {tuple(cache_shape)}")
    if cache.dtype != x_dtype:
        raise TypeError(
            f"cache dtype {cache.dtype} differs from {x_name} dtype {x_dtype}: the cache stores "
            "the conv inputs, so both must have the same dtype"
        )
    if cache.device != x_device:
        raise ValueError(f"cache is on {cache.device} but {x_name} is on {x_device}")
    num_blocks, num_heads, cache_block, head_size = cache_shape
    if num_blocks == 0 and rows > 0:
        raise ValueError(
            f"cache has no blocks (shape {tuple(cache_shape)}) but the batch has {rows} tokens: "
            "pass the layer's allocated cache"
        )
    if head_size > 1 and cache.stride(3) != 1:
        raise ValueError(
            f"cache's last (D) dimension must have stride 1, got {cache.stride(3)}; "
            "page-strided views are fine, a transposed D is not"
        )
    if cache_block != batch.block_size:
        raise ValueError(
            f"the cache's block dimension cache.shape[2] = {cache_block} differs from the "
            f"batch's block_size {batch.block_size}: build the batch with the runtime block "
            "size of the bound cache (engines may enlarge it beyond the kernel size)"
        )
    if stream_offset < 0 or stream_offset + stream_width > head_size:
        raise ValueError(
            f"stream range [{stream_offset}, {stream_offset + stream_width}) ({offset_name}) lies "
            f"outside the cache's head size D = {head_size}"
        )
    if channels != num_heads * stream_width:
        raise ValueError(
            f"{x_name} has {channels} channels but the cache has H = {num_heads} heads of stream "
            f"width {stream_width} (H*stream_width = {num_heads * stream_width})"
        )

    w_shape = weight.shape
    if len(w_shape) == 3 and w_shape[1] != 1:
        raise ValueError(f"a 3-D {w_name} must be (dim, 1, W), got shape {tuple(w_shape)}")
    if len(w_shape) not in (2, 3):
        raise ValueError(f"{w_name} must be (dim, W) or (dim, 1, W), got shape {tuple(w_shape)}")
    if w_shape[0] != channels:
        raise ValueError(
            f"{w_name} has {w_shape[0]} channels but {x_name} has {channels}: pass this "
            f"rank's shard of the weight"
        )
    kernel_size = int(w_shape[-1])
    if kernel_size < 2:
        raise ValueError(f"kernel size W ({w_name}.shape[-1]) must be >= 2, got {kernel_size}")
    if batch.kernel_size is not None and kernel_size != batch.kernel_size:
        raise ValueError(
            f"{w_name}'s kernel size {kernel_size} differs from the batch's kernel_size "
            f"{batch.kernel_size}: build the batch for this layer group's W"
        )
    w_dtype = weight.dtype
    if w_dtype is not torch.float32 and w_dtype != x_dtype:
        raise TypeError(f"{w_name} must be float32 or {x_name}'s dtype {x_dtype}, got {w_dtype}")
    if weight.device != x_device:
        raise ValueError(f"{w_name} is on {weight.device} but {x_name} is on {x_device}")
    if batch.tap_map is not None and num_blocks * cache_block > TAP_MAP_MAX_SLOTS:
        raise ValueError(
            f"the cache has {num_blocks * cache_block} slots; a tap_map addresses at most "
            "2**31: build the batch without a tap map"
        )
    return SconvProblem.from_shapes(weight, len(w_shape), rows, channels, num_heads, kernel_size,
                                    num_blocks * cache_block)


def check_conv_call(
    x: object,
    weight: object,
    cache: object,
    batch: object,
    stream_offset: object,
    stream_width: object,
    activation: object = None,
    residual: object = True,
) -> SconvProblem:
    """Validate one conv launch on a (valid) batch; raise TypeError/ValueError saying
    what to change. The cache's block dimension is N: it must be the batch's."""
    batch = _need_batch(batch)
    stream_width = need_int("stream_width", stream_width, 1)
    _check_epilogue(activation, residual)
    return _check_stream(
        "x", x, "weight", weight, cache, batch, "stream_offset", stream_offset, stream_width, row_strided=False
    )


def check_kv_call(
    k: object,
    v: object,
    k_weight: object,
    v_weight: object,
    cache: object,
    batch: object,
    k_offset: object,
    v_offset: object,
    head_dim: object,
    activation: object = None,
    residual: object = True,
) -> tuple[SconvProblem, SconvProblem]:
    """Validate one launch of the K and V convs together (``fused_sconv_kv``): each
    stream as :func:`check_conv_call` checks one, except that ``k`` and ``v`` may be
    column slices of the projection output (unit column stride, any row stride); then
    that they are the K and V of the same heads: one shape, dtype and kernel size,
    disjoint ranges of the cache's D. Returns the two streams' problems."""
    batch = _need_batch(batch)
    head_dim = need_int("head_dim", head_dim, 1)
    k_offset = need_int("k_offset", k_offset)
    v_offset = need_int("v_offset", v_offset)
    _check_epilogue(activation, residual)
    # Each stream's rows, dtype and width are checked against the batch and the cache,
    # so k and v have one shape and dtype once both pass.
    pk = _check_stream("k", k, "k_weight", k_weight, cache, batch, "k_offset", k_offset, head_dim, row_strided=True)
    pv = _check_stream("v", v, "v_weight", v_weight, cache, batch, "v_offset", v_offset, head_dim, row_strided=True)
    if pk.kernel_size != pv.kernel_size:
        raise ValueError(
            f"k_weight has kernel size {pk.kernel_size} but v_weight has {pv.kernel_size}: the K "
            "and V convs of a layer share W"
        )
    if abs(k_offset - v_offset) < head_dim:
        raise ValueError(
            f"the K range [{k_offset}, {k_offset + head_dim}) and the V range [{v_offset}, "
            f"{v_offset + head_dim}) overlap inside D: pass the layout's K and V offsets "
            "(0 and head_dim in the packed layout)"
        )
    return pk, pv


def output_for(
    name: str, out: object, like: torch.Tensor, inputs: tuple[tuple[str, torch.Tensor], ...] = ()
) -> torch.Tensor:
    """The tensor an op writes its ``[T, C]`` result into: ``out`` when the caller
    passes one (``out=``), checked to be a contiguous tensor of ``like``'s shape, dtype
    and device that shares no memory with ``inputs`` (``(name, tensor)`` pairs: the
    kernels read other rows of the inputs while writing), else a new one."""
    if out is None:
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
    out = need_tensor(name, out)
    if out.shape != like.shape:
        raise ValueError(f"{name} must have the input's shape {tuple(like.shape)}, got {tuple(out.shape)}")
    if out.dtype != like.dtype:
        raise TypeError(f"{name} must be {_dtype_name(like.dtype)} (the input's dtype), got {_dtype_name(out.dtype)}")
    if out.device != like.device:
        raise ValueError(f"{name} is on {out.device} but the input is on {like.device}: move it")
    if not out.is_contiguous():
        raise ValueError(f"{name} must be contiguous: pass a contiguous tensor (a leading row slice of one is)")
    _check_disjoint(name, out, inputs)
    return out


def outputs_for(
    name: str, out: object, like: torch.Tensor, inputs: tuple[tuple[str, torch.Tensor], ...] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two outputs shaped like ``like`` (an op with two results): ``out`` as a pair of
    tensors sharing no memory, each checked by :func:`output_for`, or two new ones."""
    if out is None:
        return output_for(name, None, like), output_for(name, None, like)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"{name} must be a pair of tensors (one per result), got {type(out).__name__}")
    first, second = output_for(f"{name}[0]", out[0], like, inputs), output_for(f"{name}[1]", out[1], like, inputs)
    if first is second:
        raise ValueError(f"{name} passes one tensor for both results: pass two")
    _check_disjoint(f"{name}[1]", second, ((f"{name}[0]", first),))
    return first, second


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """``[start, end)``: the bytes ``t``'s elements lie in (any strides; empty when
    ``t`` has no elements)."""
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.nbytes
    if t.numel() == 0:
        return start, start
    last = 0
    for size, stride in zip(t.shape, t.stride()):
        last += (size - 1) * stride
    return start, start + (last + 1) * t.element_size()


def _check_disjoint(name: str, out: torch.Tensor, inputs: tuple[tuple[str, torch.Tensor], ...]) -> None:
    """Raise ValueError if ``out`` overlaps one of ``inputs`` (``(name, tensor)`` pairs)
    in memory: a comparison of the byte ranges they span (conservative for strided
    inputs), on the host, no sync. Skipped while tracing and for tensors without real
    memory (fake, functional or meta tensors)."""
    if not inputs or not has_memory(out) or traced():
        return
    lo, hi = _byte_range(out)
    if lo == hi:
        return
    for in_name, t in inputs:
        if has_memory(t):
            start, end = _byte_range(t)
            if start < hi and lo < end and start < end:
                raise ValueError(
                    f"{name} overlaps {in_name} in memory: pass an output that shares no memory with "
                    "the op's inputs or its other output (or none: the op allocates one)"
                )


def _check_hidden(hidden: object, d: torch.Tensor) -> None:
    """``hidden``: the residual rows ``d`` is added to, shaped, typed and placed as
    ``d`` and contiguous."""
    hidden = need_tensor("hidden", hidden)
    if hidden.shape != d.shape:
        raise ValueError(
            f"hidden has shape {tuple(hidden.shape)} but d has {tuple(d.shape)}: both are "
            "[T, C] rows of the residual stream and the sublayer output"
        )
    if hidden.dtype != d.dtype:
        raise TypeError(f"hidden dtype {hidden.dtype} differs from d dtype {d.dtype}")
    if hidden.device != d.device:
        raise ValueError(f"hidden is on {hidden.device} but d is on {d.device}")
    if not hidden.is_contiguous():
        raise ValueError("hidden must be contiguous: pass hidden.contiguous()")


def check_add_extras(hidden: object, d: torch.Tensor) -> None:
    """What the fused conv + residual add (``fused_sconv_add``) adds to a conv launch
    (``d`` checked as ``x`` by :func:`check_conv_call`): the residual rows ``hidden``.
    ``d`` may be the rank's channel shard (tp > 1); hidden is then the same shard."""
    _check_hidden(hidden, d)


def check_norm_extras(hidden: object, d: torch.Tensor, prob: SconvProblem, norm_weight: object, eps: object) -> None:
    """What the fused conv + residual + RMSNorm adds to a conv launch (``d`` checked
    as ``x`` by :func:`check_conv_call`)."""
    _check_hidden(hidden, d)
    _check_norm_weight_eps(
        norm_weight, prob.channels, d.device, eps,
        "(the full row the norm reads), got {shape}; the fused op needs the conv to see "
        "the whole hidden row (tp == 1 for the ATTN/MLP streams); on a shard use "
        "fused_sconv_add, all-gather, then the norm",
    )


def _check_norm_weight_eps(norm_weight: object, channels: int, device: torch.device, eps: object, hint: str) -> None:
    """An RMSNorm's weight (``[channels]``, contiguous, a float dtype, on ``device``) and
    ``eps`` (a finite float >= 0); ``hint`` (with ``{shape}``) ends the shape error."""
    norm_weight = need_tensor("norm_weight", norm_weight)
    if norm_weight.dim() != 1 or norm_weight.shape[0] != channels:
        raise ValueError(f"norm_weight must have shape [C] = [{channels}] " + hint.format(shape=tuple(norm_weight.shape)))
    if norm_weight.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"norm_weight must be a float tensor, got {norm_weight.dtype}")
    if norm_weight.device != device:
        raise ValueError(f"norm_weight is on {norm_weight.device} but the rows are on {device}")
    if channels > 1 and norm_weight.stride(0) != 1:
        raise ValueError("norm_weight must be contiguous: pass norm_weight.contiguous()")
    if isinstance(eps, bool) or not isinstance(eps, (float, int)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite float >= 0, got {eps}")


def check_gathered_rms_norm_args(shards: object, norm_weight: object, eps: object) -> None:
    """``gathered_rms_norm``'s arguments: ``shards`` [tp, T, S] contiguous in an
    activation dtype (an all-gather's output along dim 0, viewed per rank), the weight
    of the whole ``tp * S`` row, ``eps``."""
    shards = need_tensor("shards", shards)
    if shards.dim() != 3:
        raise ValueError(
            f"shards must be [tp, T, S] (each rank's [T, S] shard, as an all-gather along dim 0 "
            f"returns them), got shape {tuple(shards.shape)}"
        )
    if shards.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"shards must be bfloat16, float16 or float32, got {shards.dtype}")
    if not shards.is_contiguous():
        raise ValueError("shards must be contiguous: pass the all-gather's output buffer (or .contiguous())")
    tp, _, width = shards.shape
    _check_norm_weight_eps(norm_weight, tp * width, shards.device, eps, "(tp * S: the whole row), got {shape}")


def check_seq_metadata_args(
    query_start_loc: object,
    num_reqs: object,
    num_actual_tokens: object,
    seq_idx_out: object,
    query_start_out: object,
    num_padded_tokens: object,
) -> None:
    """Validate a `sconv_seq_metadata` call; raise TypeError/ValueError saying what to change.
    ``query_start_loc``'s values (``[0] == 0``, non-decreasing, ``[num_reqs] ==
    num_actual_tokens``) are checked when it is a CPU tensor (no device sync)."""
    qsl = need_tensor("query_start_loc", query_start_loc)
    seq_out = need_tensor("seq_idx_out", seq_idx_out)
    qs_out = need_tensor("query_start_out", query_start_out)
    num_reqs = need_int("num_reqs", num_reqs, 0)
    num_actual_tokens = need_int("num_actual_tokens", num_actual_tokens)
    num_padded_tokens = need_int("num_padded_tokens", num_padded_tokens)
    if qsl.dim() != 1 or qsl.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"query_start_loc must be a 1-D int32/int64 tensor [num_reqs+1], got "
            f"shape {tuple(qsl.shape)} dtype {qsl.dtype}"
        )
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
    # (one buffer for both outputs, or one that overlaps the input: rows overwrite each other)
    _check_disjoint("seq_idx_out", seq_out, (("query_start_loc", qsl),))
    _check_disjoint("query_start_out", qs_out, (("seq_idx_out", seq_out), ("query_start_loc", qsl)))
    if num_reqs > 0 and qsl.device.type == "cpu" and has_memory(qsl) and not traced():
        starts = qsl[: num_reqs + 1].tolist()
        if starts[0] != 0:
            raise ValueError(f"query_start_loc[0] must be 0, got {starts[0]}")
        for i in range(num_reqs):
            if starts[i + 1] < starts[i]:
                raise ValueError(
                    f"query_start_loc must be non-decreasing, but entry {i + 1} ({starts[i + 1]}) < "
                    f"entry {i} ({starts[i]})"
                )
        if starts[num_reqs] != num_actual_tokens:
            raise ValueError(
                f"query_start_loc[num_reqs] = query_start_loc[{num_reqs}] = {starts[num_reqs]} but "
                f"num_actual_tokens is {num_actual_tokens}: pass the step's total token count, "
                "query_start_loc[num_reqs]"
            )
