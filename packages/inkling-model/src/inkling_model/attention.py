"""Inkling's relative-logit attention over a paged KV cache.

Per query token at absolute position ``p`` and head ``h`` (GQA: KV head
``h // (Hq / Hkv)``), against the keys of the same sequence at positions ``j``::

    tau   = 1 + alpha * log(max((p + 1) / n_floor, 1))   (global layers with log scaling; else 1)
    bias  = (r[p, h] @ rel_proj)[p - j]  if 0 <= p - j < extent  else 0
    logit = (tau * q[p, h]) . k[j] * scale + tau * bias
    out   = softmax over the allowed j (causal; p - j < window on sliding layers) of logit, @ v

``scale`` is ``1 / head_dim`` (q and k are RMS-normalised per head), ``extent`` is the
window on sliding layers and ``rel_extent`` on global ones.

:class:`InklingRelAttention` holds the shared ``rel_proj [d_rel, extent]`` and a
:class:`AttentionCacheOwner` (the layer's bound ``[num_blocks, Hkv, N, 2 * Dh]`` KV cache,
registered by name). Its forward goes through the custom op
``torch.ops.inkling_model.paged_rel_attention_out``, which at *run* time finds the owner and
the step's :class:`~inkling_model.metadata.RelAttentionMetadata` (from the process-wide
metadata provider, as the short convolutions do), writes this step's K/V into the cache
and attends through the block table: ``inkling_kernels.paged_rel_attention`` (PyTorch)
on the CPU, ``paged_rel_attention_triton`` on the GPU and on the CPU under
``INKLING_KERNELS_CPU_BACKEND=triton`` (the switch the conv ops use). With no metadata
or no bound cache (an engine's profiling pass) it returns zeros.
"""

from typing import Optional, Union

import torch
from torch import nn

from inkling_kernels import paged_rel_attention as paged_rel_attention_op
from inkling_kernels import write_kv
from inkling_kernels.rel_attention import rel_attention_uses_triton
from inkling_kernels.rel_attention.reference import check_log_scaling, check_scale

from ._ops import out_op
from .metadata import RelAttentionMetadata
from .sconv import described_rows, first_rows, zero_padding
from .state import NamedRegistry, current_metadata_of

__all__ = [
    "AttentionCacheOwner",
    "InklingRelAttention",
    "get_attention_owner",
    "paged_rel_attention",
]

_owners: "NamedRegistry[AttentionCacheOwner]" = NamedRegistry("AttentionCacheOwner")


def get_attention_owner(name: str) -> "AttentionCacheOwner":
    """The live :class:`AttentionCacheOwner` registered under ``name``."""
    return _owners.get(name)


class AttentionCacheOwner:
    """One attention layer's paged KV cache and the fixed parameters of its attention.

    Args:
        name: unique process-wide name (an engine uses the layer prefix).
        num_heads: query heads on this rank.
        num_kv_heads: KV heads on this rank (divides ``num_heads``).
        head_dim: per-head size of q, k and v.
        window: sliding window (keys with ``p - j < window``), ``None`` on global layers.
        log_scaling: ``(n_floor, alpha)`` of the logit scaling, ``None`` when off.
        scale: logit scale (Inkling: ``1 / head_dim``).
        replace: re-use ``name`` even if another live owner holds it.
    """

    def __init__(
        self,
        name: str,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        window: Optional[int] = None,
        log_scaling: Optional[tuple[int, float]] = None,
        scale: Optional[float] = None,
        replace: bool = False,
    ) -> None:
        for label, value in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive int, got {value!r}")
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads} (grouped-query attention)"
            )
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a positive int or None, got {window!r}")
        if isinstance(log_scaling, list):  # e.g. read from JSON
            log_scaling = tuple(log_scaling)
        # the kernels' own checks, here rather than at the first forward
        log_scaling = check_log_scaling(log_scaling)
        if scale is not None:
            scale = check_scale(scale)
        self.name = name
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.window = window
        self.log_scaling = log_scaling
        self.scale = scale if scale is not None else 1.0 / head_dim
        self._cache: torch.Tensor = torch.empty(0)
        _owners.register(name, self, replace=replace)

    @property
    def cache(self) -> torch.Tensor:
        """The bound ``[num_blocks, Hkv, N, 2 * Dh]`` cache, or an empty placeholder."""
        return self._cache

    @property
    def is_bound(self) -> bool:
        return self._cache.dim() == 4

    @property
    def block_size(self) -> int:
        """Tokens per block of the bound cache (``shape[2]``); 0 while unbound."""
        return int(self._cache.shape[2]) if self.is_bound else 0

    def kv_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(key_cache, value_cache)``, each ``[num_blocks, N, Hkv, Dh]`` (strided
        views of the bound cache: a token's K then V sit side by side per head)."""
        kv = self._cache.unflatten(-1, (2, self.head_dim)).transpose(1, 2)
        return kv[..., 0, :], kv[..., 1, :]

    def bind_cache(self, cache: torch.Tensor) -> None:
        """Bind the engine's ``[num_blocks, Hkv, N, 2 * Dh]`` KV cache (per block,
        head-major like the conv state; per token and head, K then V). The block
        stride may be padded; the last dim must be contiguous."""
        if not isinstance(cache, torch.Tensor):
            raise TypeError(f"cache must be a torch.Tensor, got {type(cache).__name__}")
        if cache.dim() != 4:
            raise ValueError(
                f"layer {self.name!r}: the KV cache must be [num_blocks, Hkv, N, 2*Dh], got {tuple(cache.shape)}"
            )
        if not cache.is_floating_point():
            raise TypeError(f"layer {self.name!r}: the KV cache must be floating point, got {cache.dtype}")
        _, heads, block_size, width = cache.shape
        if heads != self.num_kv_heads or width != 2 * self.head_dim:
            raise ValueError(
                f"layer {self.name!r}: the KV cache holds {heads} heads of {width} values per token, the "
                f"layer needs {self.num_kv_heads} KV heads of 2 x {self.head_dim} (K and V) per rank"
            )
        if block_size < 1 or cache.stride(3) != 1:
            raise ValueError(f"layer {self.name!r}: bad KV cache block size {block_size} or strides {cache.stride()}")
        self._cache = cache

    def unbind_cache(self) -> None:
        self._cache = torch.empty(0)

    def __repr__(self) -> str:
        bound = tuple(self._cache.shape) if self.is_bound else "unbound"
        return (
            f"AttentionCacheOwner({self.name!r}, heads={self.num_heads}/{self.num_kv_heads}x{self.head_dim}, "
            f"window={self.window}, log_scaling={self.log_scaling}, cache={bound})"
        )


def _live(owner_name: str, q: torch.Tensor) -> Optional[tuple[AttentionCacheOwner, RelAttentionMetadata]]:
    owner = get_attention_owner(owner_name)
    meta = current_metadata_of(owner_name, RelAttentionMetadata)
    if meta is None or not owner.is_bound:
        return None
    if meta.num_tokens > q.shape[0]:  # more rows are padding (described_rows)
        raise ValueError(
            f"layer {owner_name!r}: the metadata describes {meta.num_tokens} tokens but the input has "
            f"{q.shape[0]} rows; pad the batch to the metadata's padded token count"
        )
    if meta.block_size is not None and meta.block_size != owner.block_size:
        raise ValueError(
            f"layer {owner_name!r}: the metadata was built for block size {meta.block_size} but the "
            f"bound KV cache has {owner.block_size} rows per block"
        )
    if owner.cache.dtype != q.dtype or owner.cache.device != q.device:
        raise TypeError(
            f"layer {owner_name!r}: the input is {q.dtype} on {q.device}, the KV cache "
            f"{owner.cache.dtype} on {owner.cache.device}; bind a cache of the activation dtype and device"
        )
    return owner, meta


def key_split_bound(meta: RelAttentionMetadata, device: torch.device) -> Optional[int]:
    """The host bound on the context lengths that tunes the Triton kernel's key split:
    ``meta.max_seq_len``, except while a CUDA graph is captured. A captured launch
    replays for every later batch of its size, so it takes the split the shapes alone
    give (right for any context length)."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    return meta.max_seq_len


def paged_rel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    r: torch.Tensor,
    rel_proj: torch.Tensor,
    positions: torch.Tensor,
    owner_name: str,
) -> torch.Tensor:
    """Write ``k, v [T, Hkv, Dh]`` into owner ``owner_name``'s KV cache, then attend
    ``q [T, Hq, Dh]`` (relative states ``r [T, Hq, d_rel]``) over it; returns
    ``[T, Hq, Dh]`` (zeros with no metadata / no bound cache, and on pad rows).

    The result is allocated here and written by the custom op
    ``torch.ops.inkling_model.paged_rel_attention_out`` (an output of fixed address
    inside a captured graph piece; see :func:`inkling_model.sconv.paged_short_conv_kv`)."""
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    _paged_rel_attention_out(q, k, v, r, rel_proj, positions, owner_name, out)
    return out


@out_op(
    "(Tensor q, Tensor k, Tensor v, Tensor r, Tensor rel_proj, Tensor positions, str owner_name, Tensor(a!) out) -> ()"
)
def _paged_rel_attention_out(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    r: torch.Tensor,
    rel_proj: torch.Tensor,
    positions: torch.Tensor,
    owner_name: str,
    out: torch.Tensor,
) -> None:
    state = _live(owner_name, q)
    if state is None:
        out.zero_()
        return
    owner, meta = state
    n = described_rows(q.shape[0], meta.num_tokens)
    zero_padding((out,), n)
    q, k, v, r, positions, out = (first_rows(t, n) for t in (q, k, v, r, positions, out))
    key_cache, value_cache = owner.kv_views()
    query_start, seq_lens = meta.query_start_loc_cpu, meta.seq_lens_cpu
    extra = {}
    if rel_attention_uses_triton(q.device):
        # the GPU path (and the CPU one under the interpreter): a K/V write and an
        # attention launch (plus a combine when the keys split); with the metadata's
        # device tensors nothing synchronises with the host
        from inkling_kernels.rel_attention import paged_rel_attention_triton as attend
        from inkling_kernels.rel_attention import write_kv_triton as write

        if meta.query_start_loc is not None and meta.seq_lens is not None:
            query_start, seq_lens = meta.query_start_loc, meta.seq_lens
        extra["max_seq_len"] = key_split_bound(meta, q.device)
    else:
        attend, write = paged_rel_attention_op, write_kv
    write(k, v, key_cache, value_cache, meta.slot_mapping)
    attend(
        q,
        r,
        rel_proj,
        key_cache,
        value_cache,
        positions,
        meta.block_table,
        query_start,
        seq_lens,
        scale=owner.scale,
        window=owner.window,
        log_scaling=owner.log_scaling,
        out=out,
        **extra,
    )


class InklingRelAttention(nn.Module):
    """The attention core of one Inkling layer (after the projections, q/k norms
    and the K/V short convolutions).

    Args:
        owner: the layer's :class:`AttentionCacheOwner` (heads on this rank, window,
            log scaling, bound cache).
        d_rel: per-head size of the relative states.
        extent: distances with a bias (the window on sliding layers, ``rel_extent``
            on global ones).

    ``rel_proj [d_rel, extent]`` is the checkpoint's ``rel_logits_proj.proj`` (shared
    by all heads; replicated on every rank).
    """

    def __init__(
        self,
        owner: AttentionCacheOwner,
        d_rel: int,
        extent: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: Union[torch.device, str, None] = None,
    ) -> None:
        super().__init__()
        if not isinstance(owner, AttentionCacheOwner):
            raise TypeError(f"owner must be an AttentionCacheOwner, got {type(owner).__name__}")
        for label, value in (("d_rel", d_rel), ("extent", extent)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive int, got {value!r}")
        self.owner = owner
        self.d_rel = d_rel
        self.extent = extent
        self.rel_proj = nn.Parameter(torch.zeros(d_rel, extent, dtype=dtype, device=device), requires_grad=False)

    @torch.no_grad()
    def load_rel_proj(self, tensor: torch.Tensor) -> None:
        """Load the checkpoint's ``[d_rel, extent]`` relative-logit profile bank."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"rel_logits_proj.proj of layer {self.owner.name!r} must be a torch.Tensor, "
                f"got {type(tensor).__name__}"
            )
        if tuple(tensor.shape) != tuple(self.rel_proj.shape):
            raise ValueError(
                f"rel_logits_proj.proj of layer {self.owner.name!r} has shape {tuple(tensor.shape)}; "
                f"the config gives [d_rel, extent] = {list(self.rel_proj.shape)}"
            )
        self.rel_proj.copy_(tensor)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """``q [T, Hq*Dh]``, ``k, v [T, Hkv*Dh]``, ``r [T, Hq*d_rel]`` (this rank's
        heads), ``positions [T]`` -> ``[T, Hq*Dh]`` in ``q.dtype``."""
        owner = self.owner
        # shape checks only (ints, or guards under torch.compile, as in the convs' forward)
        if q.dim() != 2:
            self._refuse_shapes(q, k, v, r)
        tokens = q.shape[0]
        kv_width = owner.num_kv_heads * owner.head_dim
        if (q.shape[1] != owner.num_heads * owner.head_dim or k.shape != (tokens, kv_width)
                or v.shape != (tokens, kv_width) or r.shape != (tokens, owner.num_heads * self.d_rel)):
            self._refuse_shapes(q, k, v, r)
        q3 = q.reshape(tokens, owner.num_heads, owner.head_dim)
        k3 = k.reshape(tokens, owner.num_kv_heads, owner.head_dim)
        v3 = v.reshape(tokens, owner.num_kv_heads, owner.head_dim)
        r3 = r.reshape(tokens, owner.num_heads, self.d_rel)
        if positions.dtype != torch.int64:
            positions = positions.to(torch.int64)
        out = paged_rel_attention(q3, k3, v3, r3, self.rel_proj, positions, owner.name)
        return out.reshape(tokens, owner.num_heads * owner.head_dim)

    def _refuse_shapes(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, r: torch.Tensor) -> None:
        """Raise the ValueError naming the first of q, k, v, r not ``[T, heads * dim]``."""
        owner = self.owner
        tokens = q.shape[0] if q.dim() == 2 else -1
        for name, x, count, dim in (
            ("q", q, owner.num_heads, owner.head_dim), ("k", k, owner.num_kv_heads, owner.head_dim),
            ("v", v, owner.num_kv_heads, owner.head_dim), ("r", r, owner.num_heads, self.d_rel),
        ):
            if x.dim() != 2 or x.shape[0] != tokens or x.shape[1] != count * dim:
                rows = "num_tokens" if tokens < 0 else f"{tokens} (q's rows)"
                raise ValueError(
                    f"{name} must be [{rows}, {count * dim}] ({count} heads x {dim} on this rank of "
                    f"layer {owner.name!r}), got {tuple(x.shape)}"
                )

    def extra_repr(self) -> str:
        return f"d_rel={self.d_rel}, extent={self.extent}, owner={self.owner.name!r}"
