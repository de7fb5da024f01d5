"""The short-convolution layer over the paged conv-state cache.

``InklingShortConv`` computes, per channel ``c`` at absolute position ``p``::

    y[p, c] = x[p, c] + sum_i w[c, i] * x[p - (W-1) + i, c]        (fp32, cast back)

reading earlier positions from its owner's paged cache and writing ``x`` into it.
The call goes through the custom op ``torch.ops.inkling_model.paged_short_conv_out``
(it writes into an output allocated before it), which finds the owner (by name) and the current metadata (through the provider) when
it *runs*, not when it is traced: an engine that traces the model on its profiling
pass (no metadata, no cache) gets a graph that still convolves on later passes.

:func:`short_conv_kv` runs a layer's K and V convs together, in one launch
(``inkling_kernels.fused_sconv_kv``), on k and v as they come out of a fused QKV
projection (column slices, no copy); its custom op is
``torch.ops.inkling_model.paged_short_conv_kv_out``.
"""

from typing import Optional, Union

import torch
from torch import nn

from inkling_cache import Stream
from inkling_kernels import fused_sconv, fused_sconv_kv

from ._ops import out_op
from .state import ConvStateOwner, live_state

__all__ = [
    "InklingShortConv", "described_rows", "paged_short_conv", "paged_short_conv_kv", "short_conv_kv", "first_rows",
    "zero_padding",
]


def paged_short_conv(x: torch.Tensor, weight: torch.Tensor, owner_name: str, stream: int) -> torch.Tensor:
    """Paged short conv of ``x [T, C]`` for owner ``owner_name``'s ``stream``.

    Writes ``x`` into the owner's cache and returns ``x + conv(x)`` (a new contiguous
    tensor), on the step's batch (``inkling_kernels.SconvBatch``: positions, block
    table, tap map, ...) from the metadata provider; with no batch for this owner or no
    bound cache it returns a copy of ``x``. The work runs in the custom op
    ``torch.ops.inkling_model.paged_short_conv_out``, which writes into an output
    allocated here (see :func:`paged_short_conv_kv` for why).
    """
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _paged_short_conv_out(x, weight, owner_name, stream, out)
    return out


def described_rows(rows: int, described: int) -> int:
    """The rows of an op's input that the step's metadata describes.

    An engine may pad a forward beyond the batch its metadata describes (vLLM's
    drafters pad to the size of a captured graph piece): the rows past ``described``
    are padding, which the ops fill with zeros. An input shorter than the batch is left
    to the kernels' checks (an error)."""
    return described if rows > described else rows


def first_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` rows of ``t``: ``t`` itself when it has no more (the usual case,
    without the host cost of a view)."""
    return t if t.shape[0] == n else t[:n]


def zero_padding(outs: tuple[torch.Tensor, ...], n: int) -> None:
    """Zero the rows of each output past its first ``n``: padding rows
    (:func:`described_rows`), which no kernel writes."""
    for out in outs:
        if n < out.shape[0]:
            out[n:].zero_()


@out_op("(Tensor x, Tensor weight, str owner_name, int stream, Tensor(a!) out) -> ()")
def _paged_short_conv_out(x: torch.Tensor, weight: torch.Tensor, owner_name: str, stream: int,
                          out: torch.Tensor) -> None:
    state = live_state(owner_name)
    if state is None:
        out.copy_(x)
        return
    owner, batch = state
    offset, width = owner.stream_range(stream)
    n = described_rows(x.shape[0], batch.num_tokens)
    fused_sconv(first_rows(x, n).contiguous(), weight, owner.cache, batch, offset, width, out=first_rows(out, n))
    zero_padding((out,), n)


class InklingShortConv(nn.Module):
    """Depthwise causal short convolution (with its inner residual) of one stream.

    Args:
        dim: this rank's channels of the stream (``owner.stream_dim(stream)``:
            K/V ``heads_per_rank * head_dim``; ATTN/MLP ``hidden_size / tp``).
        kernel_size: W (must match the owner's layout).
        owner: the layer's :class:`ConvStateOwner` (cache + layout).
        stream: which of the four streams (``Stream.K``, ``V``, ``ATTN``, ``MLP``).
        dtype: weight dtype (fp32, as transformers keeps these weights).
        tap_major: store the weight channel-contiguous (the transpose of a ``(W, dim)``
            tensor): the fused conv + residual (+ RMSNorm) kernels then read each tap's
            weights with vector loads. Same shape, loading and ``state_dict``.

    The weight has the checkpoint's shape ``(dim, 1, W)``; ``weight[:, 0, W-1]``
    multiplies the current token.
    """

    def __init__(
        self,
        dim: int,
        kernel_size: int,
        owner: ConvStateOwner,
        stream: Union[Stream, int],
        *,
        dtype: torch.dtype = torch.float32,
        device: Union[torch.device, str, None] = None,
        tap_major: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(owner, ConvStateOwner):
            raise TypeError(f"owner must be a ConvStateOwner, got {type(owner).__name__}")
        try:
            stream = Stream(stream)
        except ValueError:
            raise ValueError(f"stream must be one of {[s.name for s in Stream]}, got {stream!r}") from None
        for name, value in (("dim", dim), ("kernel_size", kernel_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        layout = owner.layout
        if kernel_size != layout.kernel_size:
            raise ValueError(
                f"kernel_size {kernel_size} != the layout's kernel_size {layout.kernel_size} "
                f"of layer {owner.name!r}"
            )
        expected = owner.stream_dim(stream)
        if dim != expected:
            raise ValueError(
                f"dim {dim} does not match layer {owner.name!r}'s {stream.name} stream: "
                f"{expected} channels per rank ({layout.num_heads} heads x "
                f"{owner.stream_range(stream)[1]} at tp_size {layout.tp_size})"
            )
        self.dim = dim
        self.kernel_size = kernel_size
        self.owner = owner
        self.stream = stream
        if tap_major:
            storage = torch.zeros(kernel_size, dim, dtype=dtype, device=device).t().unsqueeze(1)
        else:
            storage = torch.zeros(dim, 1, kernel_size, dtype=dtype, device=device)
        self.weight = nn.Parameter(storage, requires_grad=False)

    @property
    def tp_size(self) -> int:
        return int(self.owner.layout.tp_size)

    def shard_rows(self, tp_rank: int) -> tuple[int, int]:
        """``[start, stop)`` rows of the full checkpoint tensor that rank
        ``tp_rank`` holds. K/V: the rank's whole KV heads; ATTN/MLP: its
        contiguous ``hidden/tp`` chunk (laid out as ``H`` heads of ``hph``). Both
        are contiguous because the layout numbers heads rank-major."""
        return tp_rank * self.dim, (tp_rank + 1) * self.dim

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor, tp_rank: int = 0, tp_size: int = 1) -> None:
        """Load a full ``(dim*tp, 1, W)`` checkpoint tensor (this rank's shard is
        cut out) or an already-sharded ``(dim, 1, W)`` one; ``(rows, W)`` works
        too. ``tp_size`` must be the layout's."""
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
        if tp_size != self.tp_size:
            raise ValueError(
                f"tp_size {tp_size} != the layout's tp_size {self.tp_size} of layer {self.owner.name!r}"
            )
        if not 0 <= tp_rank < tp_size:
            raise ValueError(f"tp_rank must be in [0, {tp_size}), got {tp_rank}")
        if weight.dim() == 3:
            if weight.shape[1] != 1:
                raise ValueError(f"a 3-D conv weight must be (channels, 1, W), got {tuple(weight.shape)}")
            weight = weight[:, 0, :]
        elif weight.dim() != 2:
            raise ValueError(f"conv weight must be (channels, 1, W) or (channels, W), got {tuple(weight.shape)}")
        rows, width = weight.shape
        if width != self.kernel_size:
            raise ValueError(f"conv weight has kernel {width}, the layer expects {self.kernel_size}")
        if rows == self.dim * tp_size:
            start, stop = self.shard_rows(tp_rank)
            shard = weight[start:stop]
        elif rows == self.dim:
            shard = weight
        else:
            raise ValueError(
                f"conv weight has {rows} channels: expected the full {self.dim * tp_size} "
                f"(sharded here for rank {tp_rank}) or this rank's {self.dim}"
            )
        self.weight[:, 0, :].copy_(shard)

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x [T, dim]`` (flat tokens of the batch, pad rows included) -> ``[T, dim]``
        in ``x.dtype``. The tokens' positions come with the step's batch (the
        metadata); ``positions`` is accepted for the decoder layers' calling
        convention and not read."""
        if x.dim() != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must be [num_tokens, {self.dim}], got {tuple(x.shape)}")
        return paged_short_conv(x, self.weight, self.owner.name, int(self.stream))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, kernel_size={self.kernel_size}, stream={self.stream.name}, owner={self.owner.name!r}"


def _unit_columns(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its columns are adjacent (a column slice of the projection
    output; any row stride), else a contiguous copy."""
    return x if x.shape[1] <= 1 or x.stride(1) == 1 else x.contiguous()


def paged_short_conv_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_weight: torch.Tensor,
    v_weight: torch.Tensor,
    owner_name: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged short convs of ``k`` and ``v`` (``[T, C]`` each, any row stride) for owner
    ``owner_name``'s K and V streams, in one launch.

    Writes both into the owner's cache and returns ``(k + conv(k), v + conv(v))`` as
    new contiguous tensors, on the step's batch from the metadata provider; with no
    batch for this owner or no bound cache, contiguous copies of ``k`` and ``v``.

    The outputs are allocated here and the custom op
    ``torch.ops.inkling_model.paged_short_conv_kv_out`` writes into them. An engine
    that splits its compiled graph at these ops and captures the pieces between them as
    CUDA graphs (vLLM's piecewise graphs) then hands each piece the op's output at the
    address the piece was captured with: the allocation is part of the piece before
    the op, so it lives in that piece's graph memory. An op returning a tensor it
    allocated itself would hand the next piece a new address at every replay.
    """
    like = dict(memory_format=torch.contiguous_format)
    k_out, v_out = torch.empty_like(k, **like), torch.empty_like(v, **like)
    _paged_short_conv_kv_out(k, v, k_weight, v_weight, owner_name, k_out, v_out)
    return k_out, v_out


@out_op(
    "(Tensor k, Tensor v, Tensor k_weight, Tensor v_weight, str owner_name, Tensor(a!) k_out, Tensor(b!) v_out) -> ()"
)
def _paged_short_conv_kv_out(
    k: torch.Tensor,
    v: torch.Tensor,
    k_weight: torch.Tensor,
    v_weight: torch.Tensor,
    owner_name: str,
    k_out: torch.Tensor,
    v_out: torch.Tensor,
) -> None:
    state = live_state(owner_name)
    if state is None:
        k_out.copy_(k)
        v_out.copy_(v)
        return
    owner, batch = state
    k_offset, width = owner.stream_range(Stream.K)
    v_offset, _ = owner.stream_range(Stream.V)
    n = described_rows(k.shape[0], batch.num_tokens)
    fused_sconv_kv(
        _unit_columns(first_rows(k, n)), _unit_columns(first_rows(v, n)), k_weight, v_weight, owner.cache, batch,
        k_offset, v_offset, width, out=(first_rows(k_out, n), first_rows(v_out, n)),
    )
    zero_padding((k_out, v_out), n)


def short_conv_kv(
    k_conv: InklingShortConv,
    v_conv: InklingShortConv,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's K and V short convs in one launch: equal to ``(k_conv(k), v_conv(v))``.

    ``k_conv``, ``v_conv``: the layer's :class:`InklingShortConv` of ``Stream.K`` and
    ``Stream.V`` on one owner (they hold the weights; loading is unchanged). ``k``, ``v``:
    ``[T, dim]`` each, in one dtype; column slices of a fused QKV projection output
    (``qkv.split([q_size, kv_size, kv_size], -1)``) go in as they are, without a copy.
    Returns two new contiguous ``[T, dim]`` tensors. ``positions`` is accepted for the
    decoder layers' calling convention and not read (the batch carries them).
    """
    for conv, want in ((k_conv, Stream.K), (v_conv, Stream.V)):
        if not isinstance(conv, InklingShortConv) or conv.stream != want:
            raise ValueError(
                f"short_conv_kv takes the layer's InklingShortConv of Stream.K, then of Stream.V; "
                f"got {conv!r} where {want.name} belongs"
            )
    if k_conv.owner is not v_conv.owner:
        raise ValueError(
            f"the K conv is on owner {k_conv.owner.name!r} and the V conv on {v_conv.owner.name!r}: "
            "both streams of one launch live in one layer's cache"
        )
    for name, x in (("k", k), ("v", v)):
        if x.dim() != 2 or x.shape[1] != k_conv.dim:
            raise ValueError(f"{name} must be [num_tokens, {k_conv.dim}], got {tuple(x.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k has shape {tuple(k.shape)} but v has {tuple(v.shape)}: one row per token each")
    return paged_short_conv_kv(k, v, k_conv.weight, v_conv.weight, k_conv.owner.name)
