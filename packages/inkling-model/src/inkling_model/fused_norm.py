"""The ATTN/MLP short conv fused with the layer's residual add and the next RMSNorm.

In an Inkling decoder layer each sublayer output ``d`` (attention after ``o_proj``,
the MLP/MoE output) is convolved, added to the residual stream, and the result is
normalised by the next RMSNorm (``post_attention_layernorm`` after attention; the
next layer's ``input_layernorm``, or the model's final norm, after the MLP)::

    new_hidden = hidden + (d + conv(d))
    normed     = rmsnorm(new_hidden) * norm_weight

:class:`InklingShortConvAddRMSNorm` does the three in one pass through
``inkling_kernels.fused_sconv_add_rmsnorm``, reaching the cache and the metadata the
way :class:`~inkling_model.InklingShortConv` does: a custom op
(``torch.ops.inkling_model.paged_short_conv_add_rmsnorm_out``) looks the owner (by name)
and the current metadata (through the provider) up when it *runs*, so a graph traced
on an engine's profiling pass still convolves later. With no metadata or no bound
cache the conv is the identity and the op returns ``(hidden + d, rmsnorm(hidden + d))``.

Tensor parallelism: RMSNorm needs the whole hidden row, and with tp > 1 the layout
convolves the ATTN/MLP streams on the rank's ``hidden/tp`` shard (between the
reduce-scatter and the all-gather). The fused layer therefore requires a layout whose
stream covers the whole hidden row (``tp_size == 1``). At tp > 1,
:func:`paged_short_conv_add` (``torch.ops.inkling_model.paged_short_conv_add_out``) fuses
the conv with the residual add on the shard, ``hidden_shard + d + conv(d)``; the model
all-gathers that and runs the norm on whole rows (inkling-vllm's model does).
"""

import math
from typing import Optional, Union

import torch
from torch import nn

from inkling_cache import Stream
from inkling_kernels import fused_sconv_add
from inkling_kernels.sconv_add_rmsnorm import fused_sconv_add_rmsnorm, rms_norm_ref

from ._ops import out_op
from .sconv import InklingShortConv, described_rows, first_rows, zero_padding
from .state import ConvStateOwner, live_state

__all__ = ["InklingShortConvAddRMSNorm", "paged_short_conv_add", "paged_short_conv_add_rmsnorm"]


def paged_short_conv_add_rmsnorm(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    norm_weight: torch.Tensor,
    owner_name: str,
    stream: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden + d + conv(d), rmsnorm(that))`` for owner ``owner_name``'s ``stream``,
    on the step's batch from the metadata provider.

    Writes ``d`` into the owner's cache. With no batch for this owner or no bound
    cache the conv is the identity: ``(hidden + d, rmsnorm(hidden + d))``. Both
    results are new contiguous tensors in d's dtype, allocated here and written by the
    custom op ``torch.ops.inkling_model.paged_short_conv_add_rmsnorm_out`` (outputs of
    fixed address inside a captured graph piece; see
    :func:`inkling_model.sconv.paged_short_conv_kv`).
    """
    like = dict(memory_format=torch.contiguous_format)
    new_hidden, normed = torch.empty_like(d, **like), torch.empty_like(d, **like)
    _paged_short_conv_add_rmsnorm_out(hidden, d, weight, norm_weight, owner_name, stream, eps, new_hidden, normed)
    return new_hidden, normed


@out_op(
    "(Tensor hidden, Tensor d, Tensor weight, Tensor norm_weight, str owner_name, int stream, float eps, "
    "Tensor(a!) hidden_out, Tensor(b!) normed_out) -> ()"
)
def _paged_short_conv_add_rmsnorm_out(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    norm_weight: torch.Tensor,
    owner_name: str,
    stream: int,
    eps: float,
    hidden_out: torch.Tensor,
    normed_out: torch.Tensor,
) -> None:
    state = live_state(owner_name)
    if state is None:
        torch.add(hidden, d, out=hidden_out)
        normed_out.copy_(rms_norm_ref(hidden_out, norm_weight, eps))
        return
    owner, batch = state
    offset, width = owner.stream_range(stream)
    n = described_rows(d.shape[0], batch.num_tokens)
    fused_sconv_add_rmsnorm(
        first_rows(hidden, n).contiguous(), first_rows(d, n).contiguous(), weight, owner.cache, batch, offset, width,
        norm_weight, eps, out=(first_rows(hidden_out, n), first_rows(normed_out, n)),
    )
    zero_padding((hidden_out, normed_out), n)


def paged_short_conv_add(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    owner_name: str,
    stream: int,
) -> torch.Tensor:
    """``hidden + d + conv(d)`` for owner ``owner_name``'s ``stream`` (any shard of
    the hidden row: no norm), on the step's batch from the metadata provider; one
    launch on CUDA (``inkling_kernels.fused_sconv_add``).

    Writes ``d`` into the owner's cache. With no batch for this owner or no bound
    cache the conv is the identity: ``hidden + d``. The result is a new contiguous
    tensor, written by the custom op
    ``torch.ops.inkling_model.paged_short_conv_add_out``.
    """
    out = torch.empty_like(d, memory_format=torch.contiguous_format)
    _paged_short_conv_add_out(hidden, d, weight, owner_name, stream, out)
    return out


@out_op("(Tensor hidden, Tensor d, Tensor weight, str owner_name, int stream, Tensor(a!) out) -> ()")
def _paged_short_conv_add_out(
    hidden: torch.Tensor,
    d: torch.Tensor,
    weight: torch.Tensor,
    owner_name: str,
    stream: int,
    out: torch.Tensor,
) -> None:
    state = live_state(owner_name)
    if state is None:
        torch.add(hidden, d, out=out)
        return
    owner, batch = state
    offset, width = owner.stream_range(stream)
    n = described_rows(d.shape[0], batch.num_tokens)
    fused_sconv_add(first_rows(hidden, n).contiguous(), first_rows(d, n).contiguous(), weight, owner.cache, batch,
                    offset, width, out=first_rows(out, n))
    zero_padding((out,), n)


class InklingShortConvAddRMSNorm(nn.Module):
    """ATTN or MLP short conv + the outer residual add + the following RMSNorm.

    Args:
        dim: the hidden size; must be the stream's channels on this rank, i.e. the
            whole hidden row (``tp_size == 1``).
        kernel_size: W (must match the owner's layout).
        owner: the layer's :class:`~inkling_model.ConvStateOwner`.
        stream: ``Stream.ATTN`` or ``Stream.MLP``.
        eps: the norm's epsilon (transformers' ``rms_norm_eps``).
        dtype: conv weight dtype (fp32, as transformers keeps it).
        norm_dtype: norm weight dtype (fp32 by default; a bf16 checkpoint weight
            loads exactly).

    Parameters: ``conv.weight`` ``(dim, 1, W)`` (an :class:`InklingShortConv`, whose
    ``load_weight`` loads transformers' ``attn_sconv.conv1d.weight`` /
    ``mlp_sconv.conv1d.weight``) and ``norm_weight`` ``(dim,)`` (transformers'
    ``post_attention_layernorm.weight``, or the next layer's ``input_layernorm.weight``).
    The norm is applied as ``InklingRMSNorm`` does: ``w * dt(x * rsqrt(mean(x^2) + eps))``
    (no ``1 + w`` offset), its output in the activation dtype.
    """

    def __init__(
        self,
        dim: int,
        kernel_size: int,
        owner: ConvStateOwner,
        stream: Union[Stream, int],
        *,
        eps: float = 1e-6,
        dtype: torch.dtype = torch.float32,
        norm_dtype: torch.dtype = torch.float32,
        device: Union[torch.device, str, None] = None,
    ) -> None:
        super().__init__()
        if not isinstance(owner, ConvStateOwner):
            raise TypeError(f"owner must be a ConvStateOwner, got {type(owner).__name__}")
        try:
            stream = Stream(stream)
        except ValueError:
            raise ValueError(f"stream must be one of {[s.name for s in Stream]}, got {stream!r}") from None
        if stream not in (Stream.ATTN, Stream.MLP):
            raise ValueError(
                f"the fused conv + residual + RMSNorm serves the ATTN and MLP streams, got "
                f"{stream.name}: use InklingShortConv for K and V"
            )
        layout = owner.layout
        if layout.tp_size != 1 or owner.stream_dim(stream) != layout.hidden_size:
            raise ValueError(
                f"layer {owner.name!r} has tp_size {layout.tp_size}: its {stream.name} conv runs "
                f"on a {owner.stream_dim(stream)}-channel shard of the {layout.hidden_size}-wide "
                "hidden row, but RMSNorm needs the whole row. Use InklingShortConv on the shard, "
                "all-gather, then the norm (the fused layer needs tp_size 1)"
            )
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
            raise ValueError(f"eps must be a finite float >= 0, got {eps!r}")
        # Validates dim and kernel_size against the layout, and owns the conv weight
        # (channel-contiguous: the fused kernel reads each tap's weights as vectors).
        self.conv = InklingShortConv(dim, kernel_size, owner, stream, dtype=dtype, device=device, tap_major=True)
        self.norm_weight = nn.Parameter(
            torch.ones(dim, dtype=norm_dtype, device=device), requires_grad=False
        )
        self.eps = float(eps)

    @property
    def dim(self) -> int:
        return self.conv.dim

    @property
    def owner(self) -> ConvStateOwner:
        return self.conv.owner

    @property
    def stream(self) -> Stream:
        return self.conv.stream

    def load_weight(self, weight: torch.Tensor, tp_rank: int = 0, tp_size: int = 1) -> None:
        """Load the conv weight (``(dim, 1, W)`` or ``(dim, W)``); see
        :meth:`InklingShortConv.load_weight`."""
        self.conv.load_weight(weight, tp_rank, tp_size)

    @torch.no_grad()
    def load_norm_weight(self, weight: torch.Tensor) -> None:
        """Load the following RMSNorm's weight ``(dim,)`` (any float dtype)."""
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"norm weight must be a torch.Tensor, got {type(weight).__name__}")
        if tuple(weight.shape) != (self.dim,):
            raise ValueError(f"norm weight must have shape ({self.dim},), got {tuple(weight.shape)}")
        if not weight.is_floating_point():
            raise TypeError(f"norm weight must be a float tensor, got {weight.dtype}")
        self.norm_weight.copy_(weight)

    def forward(
        self, hidden: torch.Tensor, d: torch.Tensor, positions: Optional[torch.Tensor] = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden``, ``d``: ``[T, dim]`` (flat tokens, pad rows included, one dtype)
        -> ``(new_hidden, normed)``, both ``[T, dim]`` in d's dtype. The positions come
        with the step's batch; ``positions`` is accepted and not read."""
        if d.dim() != 2 or d.shape[1] != self.dim:
            raise ValueError(f"d must be [num_tokens, {self.dim}], got {tuple(d.shape)}")
        if hidden.shape != d.shape:
            raise ValueError(f"hidden must have d's shape {tuple(d.shape)}, got {tuple(hidden.shape)}")
        if hidden.dtype != d.dtype:
            raise TypeError(f"hidden is {hidden.dtype} but d is {d.dtype}: pass one activation dtype")
        return paged_short_conv_add_rmsnorm(
            hidden, d, self.conv.weight, self.norm_weight, self.owner.name, int(self.stream), self.eps,
        )

    def extra_repr(self) -> str:
        return f"dim={self.dim}, stream={self.stream.name}, eps={self.eps}, owner={self.owner.name!r}"
