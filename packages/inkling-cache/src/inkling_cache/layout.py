"""The packed per-layer conv-state layout (docs/design.md §2.2).

One cache per decoder layer holds the conv inputs of all four streams, head-major::

    cache: [num_blocks, H, N, D]          D contiguous
    H   = num_kv_heads / tp_size          heads on this rank
    N   = block_size                      W unless the engine enlarged it
    hph = hidden_size / num_kv_heads      hidden chunk per KV head (TP-invariant)
    raw = 2 * head_dim + 2 * hph          K | V | ATTN | MLP, per head
    D   = raw padded by the padding policy (vLLM: next power of two)

A stream's flat per-rank channel ``c`` in ``[0, H * width)`` lives at head
``c // width``, at ``offset + c % width`` inside ``D``.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, Literal, Tuple, Union

from .dtypes import dtype_bytes

__all__ = ["ConvStateLayout", "PaddingPolicy", "PaddingSpec", "Stream"]


class Stream(enum.IntEnum):
    """The four convolved streams of a decoder layer, in their order inside ``D``."""

    K = 0  #: ``k_proj`` output, before the per-head K RMSNorm
    V = 1  #: ``v_proj`` output
    ATTN = 2  #: attention output after ``o_proj``
    MLP = 3  #: MLP / MoE output


def _as_stream(stream: int) -> Stream:
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(f"stream must be a Stream (K, V, ATTN, MLP) or 0..3, got {stream!r}")
    try:
        return Stream(stream)
    except ValueError:
        raise ValueError(
            f"stream must be 0 (K), 1 (V), 2 (ATTN) or 3 (MLP), got {stream}"
        ) from None


def _check_int(name: str, value: object, minimum: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class PaddingPolicy:
    """How the raw per-head width is padded to ``D``.

    ``kind``:
      * ``"pow2"``: next power of two (what vLLM's seed module does);
      * ``"none"``: ``D = raw``;
      * ``"multiple"``: round up to a multiple of ``multiple``.

    Build one with :meth:`parse`, which accepts ``"pow2"``, ``"none"``, an int ``k``,
    ``("multiple", k)``, the string ``"multiple:k"`` or a decimal string ``"k"``.
    """

    kind: Literal["pow2", "none", "multiple"] = "pow2"
    multiple: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ("pow2", "none", "multiple"):
            raise ValueError(f"padding kind must be 'pow2', 'none' or 'multiple', got {self.kind!r}")
        _check_int("padding multiple", self.multiple, 1)
        if self.kind != "multiple" and self.multiple != 1:
            raise ValueError(f"padding {self.kind!r} takes no multiple (got {self.multiple})")

    @classmethod
    def parse(cls, spec: PaddingSpec) -> PaddingPolicy:
        """Normalize any accepted padding spelling into a policy."""
        if isinstance(spec, PaddingPolicy):
            return spec
        if isinstance(spec, bool):
            raise TypeError("padding must be 'pow2', 'none', an int k or ('multiple', k), got a bool")
        if isinstance(spec, int):
            return cls("multiple", _check_int("padding multiple", spec, 1))
        if isinstance(spec, tuple):
            if len(spec) == 2 and spec[0] == "multiple":
                return cls("multiple", _check_int("padding multiple", spec[1], 1))
            raise ValueError(f"padding tuple must be ('multiple', k), got {spec!r}")
        if isinstance(spec, str):
            text = spec.strip().lower()
            if text in ("pow2", "none"):
                return cls(text)  # type: ignore[arg-type]
            if text.startswith("multiple:"):
                text = text[len("multiple:") :]
            if text.isascii() and text.isdecimal():
                return cls("multiple", _check_int("padding multiple", int(text), 1))
        raise ValueError(
            f"unknown padding {spec!r}: use 'pow2', 'none', an int k (pad to a multiple of k) "
            "or ('multiple', k)"
        )

    def apply(self, raw: int) -> int:
        """Padded width for a raw width ``raw`` (always ``>= raw``)."""
        _check_int("raw head size", raw, 1)
        if self.kind == "pow2":
            return 1 << (raw - 1).bit_length()
        if self.kind == "none":
            return raw
        return -(-raw // self.multiple) * self.multiple

    def __str__(self) -> str:
        return f"multiple:{self.multiple}" if self.kind == "multiple" else self.kind


#: Every spelling :meth:`PaddingPolicy.parse` accepts.
PaddingSpec = Union[str, int, Tuple[str, int], PaddingPolicy]


@dataclass(frozen=True)
class ConvStateLayout:
    """Frozen layout of one decoder layer's packed conv-state cache on one TP rank.

    Build it with :meth:`build`; the constructor checks that the fields agree.

    Attributes:
        num_kv_heads: KV heads of the layer over all ranks.
        num_heads: ``H``, KV heads on this rank (``num_kv_heads // tp_size``).
        head_dim: K/V head dimension.
        hidden_size: model hidden size.
        hidden_per_head: ``hph = hidden_size // num_kv_heads`` (TP-invariant).
        raw_head_size: ``2 * head_dim + 2 * hph``.
        head_size: ``D``, the padded per-head width (TP-invariant).
        kernel_size: ``W``.
        block_size: ``N``, rows per page (defaults to ``W``).
        sliding_window: tokens the engine keeps (defaults to ``W``; must be ``>= W``).
        tp_size: tensor-parallel degree.
        padding: the policy that produced ``head_size``.
    """

    num_kv_heads: int
    num_heads: int
    head_dim: int
    hidden_size: int
    hidden_per_head: int
    raw_head_size: int
    head_size: int
    kernel_size: int
    block_size: int
    sliding_window: int
    tp_size: int
    padding: PaddingPolicy = PaddingPolicy()

    @classmethod
    def build(
        cls,
        *,
        num_kv_heads: int,
        head_dim: int,
        hidden_size: int,
        kernel_size: int,
        tp_size: int = 1,
        block_size: int | None = None,
        sliding_window: int | None = None,
        padding: PaddingSpec = "pow2",
    ) -> ConvStateLayout:
        """Validate model dimensions and derive the layout.

        Args:
            num_kv_heads: KV heads of the layer (all ranks).
            head_dim: K/V head dimension.
            hidden_size: model hidden size.
            kernel_size: conv width ``W`` (>= 2).
            tp_size: tensor-parallel degree; must divide ``num_kv_heads``.
            block_size: rows per page ``N``; ``None`` means ``W``.
            sliding_window: tokens kept; ``None`` means ``W``.
            padding: ``"pow2"``, ``"none"``, an int ``k``, ``("multiple", k)`` or a
                :class:`PaddingPolicy`.

        Raises:
            ValueError: an invalid combination; the message says what to change.
            TypeError: a non-integer dimension.
        """
        return cls(
            **_derive(
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                hidden_size=hidden_size,
                kernel_size=kernel_size,
                tp_size=tp_size,
                block_size=kernel_size if block_size is None else block_size,
                sliding_window=kernel_size if sliding_window is None else sliding_window,
                padding=padding,
            )
        )

    def __post_init__(self) -> None:
        # Direct construction must describe exactly what build() would derive.
        expected = _derive(
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            hidden_size=self.hidden_size,
            kernel_size=self.kernel_size,
            tp_size=self.tp_size,
            block_size=self.block_size,
            sliding_window=self.sliding_window,
            padding=self.padding,
        )
        for name, value in expected.items():
            if getattr(self, name) != value:
                raise ValueError(
                    f"inconsistent ConvStateLayout: {name}={getattr(self, name)!r} but the "
                    f"dimensions give {value!r}; construct it with ConvStateLayout.build(...)"
                )

    # ------------------------------------------------------------------ streams

    def stream_range(self, stream: int) -> tuple[int, int]:
        """``(offset, width)`` of ``stream`` inside ``D`` (the same on every head)."""
        s = _as_stream(stream)
        hd, hph = self.head_dim, self.hidden_per_head
        return (
            (0, hd),
            (hd, hd),
            (2 * hd, hph),
            (2 * hd + hph, hph),
        )[s]

    def stream_width(self, stream: int) -> int:
        """Per-head width of ``stream`` (``head_dim`` for K/V, ``hph`` for ATTN/MLP)."""
        return self.stream_range(stream)[1]

    def stream_dim(self, stream: int) -> int:
        """Flat channels of ``stream`` on this rank: ``num_heads * width``."""
        return self.num_heads * self.stream_width(stream)

    def channel_to_head(self, stream: int, channel: int) -> tuple[int, int]:
        """Map a stream's flat per-rank channel to ``(head, d)``, ``d`` indexing ``D``."""
        offset, width = self.stream_range(stream)
        _check_int("channel", channel, 0)
        if channel >= self.num_heads * width:
            raise ValueError(
                f"channel {channel} out of range for stream {Stream(stream).name}: "
                f"this rank has {self.num_heads * width} channels"
            )
        return channel // width, offset + channel % width

    def head_to_channel(self, stream: int, head: int, d: int) -> int:
        """Inverse of :meth:`channel_to_head`."""
        offset, width = self.stream_range(stream)
        _check_int("head", head, 0)
        _check_int("d", d, 0)
        if head >= self.num_heads:
            raise ValueError(f"head {head} out of range: this rank has {self.num_heads} heads")
        if not offset <= d < offset + width:
            raise ValueError(
                f"d {d} is outside stream {Stream(stream).name}'s range [{offset}, {offset + width})"
            )
        return head * width + (d - offset)

    # ------------------------------------------------------------------ sizes

    @property
    def hidden_shard(self) -> int:
        """Hidden channels of the ATTN/MLP streams on this rank (``hidden_size / tp``)."""
        return self.num_heads * self.hidden_per_head

    @property
    def raw_channels(self) -> int:
        """Conv channels of all four streams on this rank, unpadded (``H * raw``)."""
        return self.num_heads * self.raw_head_size

    @property
    def padding_fraction(self) -> float:
        """Share of ``D`` that is padding, ``(D - raw) / D``."""
        return (self.head_size - self.raw_head_size) / self.head_size

    def cache_shape(self, num_blocks: int) -> tuple[int, int, int, int]:
        """``(num_blocks, H, N, D)``."""
        _check_int("num_blocks", num_blocks, 0)
        return (num_blocks, self.num_heads, self.block_size, self.head_size)

    def slot_bytes(self, dtype: str) -> int:
        """Bytes one token position takes on this rank: ``H * D * dtype_bytes``."""
        return self.num_heads * self.head_size * dtype_bytes(dtype)

    def page_bytes(self, dtype: str) -> int:
        """Bytes of one page (block) on this rank: ``N * H * D * dtype_bytes``."""
        return self.block_size * self.slot_bytes(dtype)

    def min_state_bytes(self, dtype: str) -> int:
        """The rolling-state minimum ``(W - 1) * C * dtype_bytes``, ``C = H * raw``."""
        return (self.kernel_size - 1) * self.raw_channels * dtype_bytes(dtype)

    def with_block_size(self, block_size: int) -> ConvStateLayout:
        """The same layout with ``N = block_size`` (e.g. after page unification)."""
        _check_int("block_size", block_size, 1)
        return dataclasses.replace(self, block_size=block_size)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready)."""
        return {
            "num_kv_heads": self.num_kv_heads,
            "num_heads": self.num_heads,
            "head_dim": self.head_dim,
            "hidden_size": self.hidden_size,
            "hidden_per_head": self.hidden_per_head,
            "raw_head_size": self.raw_head_size,
            "head_size": self.head_size,
            "padding": str(self.padding),
            "kernel_size": self.kernel_size,
            "block_size": self.block_size,
            "sliding_window": self.sliding_window,
            "tp_size": self.tp_size,
            "stream_ranges": {s.name: list(self.stream_range(s)) for s in Stream},
        }


def _derive(
    *,
    num_kv_heads: int,
    head_dim: int,
    hidden_size: int,
    kernel_size: int,
    tp_size: int,
    block_size: int,
    sliding_window: int,
    padding: PaddingSpec,
) -> dict[str, Any]:
    """Check the primary dimensions and compute every field of a layout."""
    _check_int("num_kv_heads", num_kv_heads, 1)
    _check_int("head_dim", head_dim, 1)
    _check_int("hidden_size", hidden_size, 1)
    _check_int("tp_size", tp_size, 1)
    _check_int("kernel_size", kernel_size, None)
    if kernel_size < 2:
        raise ValueError(
            f"kernel_size must be >= 2 (a causal conv of width {kernel_size} keeps no state); "
            "check conv_kernel_size / sconv_kernel_size"
        )
    if tp_size > num_kv_heads:
        raise ValueError(
            f"tp_size {tp_size} exceeds num_kv_heads {num_kv_heads}: each rank needs at least "
            f"one whole KV head; use tp_size <= {num_kv_heads}"
        )
    if num_kv_heads % tp_size:
        valid = [t for t in range(1, num_kv_heads + 1) if num_kv_heads % t == 0]
        raise ValueError(
            f"tp_size {tp_size} does not divide num_kv_heads {num_kv_heads}: use one of {valid}"
        )
    if hidden_size % num_kv_heads:
        raise ValueError(
            f"hidden_size {hidden_size} is not divisible by num_kv_heads {num_kv_heads}: the "
            "ATTN/MLP streams are split into one hidden chunk per KV head"
        )
    _check_int("block_size", block_size, 1)
    _check_int("sliding_window", sliding_window, 1)
    if sliding_window < kernel_size:
        raise ValueError(
            f"sliding_window {sliding_window} is smaller than kernel_size {kernel_size}: the "
            f"conv reads the last {kernel_size} positions; use sliding_window >= {kernel_size}"
        )
    policy = PaddingPolicy.parse(padding)
    hidden_per_head = hidden_size // num_kv_heads
    raw = 2 * head_dim + 2 * hidden_per_head
    return {
        "num_kv_heads": num_kv_heads,
        "num_heads": num_kv_heads // tp_size,
        "head_dim": head_dim,
        "hidden_size": hidden_size,
        "hidden_per_head": hidden_per_head,
        "raw_head_size": raw,
        "head_size": policy.apply(raw),
        "kernel_size": kernel_size,
        "block_size": block_size,
        "sliding_window": sliding_window,
        "tp_size": tp_size,
        "padding": policy,
    }
