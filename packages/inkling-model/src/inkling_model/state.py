"""Per-layer conv-state owners and the way per-forward metadata reaches them.

One :class:`ConvStateOwner` per decoder layer holds that layer's
``ConvStateLayout`` (global and sliding layers differ) and the paged cache
``[num_blocks, H, N, D]`` an engine binds to it. Owners register by name in a
process-wide registry, so code that runs inside a compiled graph (the custom op in
:mod:`inkling_model.sconv`) can find them by a string.

Per-forward metadata comes from a *provider*: a function ``name -> SconvMetadata |
None``. An engine adapter installs one that reads its own forward context
(:func:`set_metadata_provider`); the standalone runtime and tests use
:func:`forward_metadata` as a context manager. ``None`` means "no metadata this
pass" (an engine's memory-profiling or warm-up pass): the convolutions are then the
identity.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import torch

from inkling_cache import ConvStateLayout, Stream, layer_layouts

from .metadata import RelAttentionMetadata, SconvMetadata

__all__ = [
    "ConvStateOwner",
    "MetadataProvider",
    "NamedRegistry",
    "current_metadata",
    "current_metadata_of",
    "live_state",
    "forward_metadata",
    "get_metadata_provider",
    "get_owner",
    "set_metadata_provider",
]

#: ``name -> metadata | None``: a :class:`SconvMetadata` for conv-state owners, an
#: :class:`~inkling_model.metadata.RelAttentionMetadata` for attention owners.
MetadataProvider = Callable[[str], Any]

_provider: MetadataProvider | None = None

T = TypeVar("T")


class NamedRegistry(Generic[T]):
    """Process-wide ``name -> live object`` table (weak: an object dropped by its
    model leaves the table). Code inside a compiled graph finds owners by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._table: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def register(self, name: str, obj: T, *, replace: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        with self._lock:
            other = self._table.get(name)
            if other is not None and other is not obj and not replace:
                raise ValueError(
                    f"a {self.kind} named {name!r} already exists: give each layer a unique "
                    "name (e.g. its module prefix) or pass replace=True"
                )
            self._table[name] = obj

    def get(self, name: str) -> T:
        obj = self._table.get(name)
        if obj is None:
            raise KeyError(f"no {self.kind} named {name!r} is alive; create one first")
        return obj  # type: ignore[no-any-return]


_registry: NamedRegistry[ConvStateOwner] = NamedRegistry("ConvStateOwner")


def get_owner(name: str) -> ConvStateOwner:
    """The live conv-state owner registered under ``name``."""
    return _registry.get(name)


class ConvStateOwner:
    """The conv state of one decoder layer: its layout and its bound paged cache.

    Args:
        layout: the layer's ``inkling_cache.ConvStateLayout`` (per-rank heads, packed
            head size ``D``, stream ranges).
        name: unique process-wide name (an engine uses the layer prefix).
        replace: re-use ``name`` even if another live owner holds it (the old
            owner is dropped from the registry); otherwise that is an error.
    """

    def __init__(self, layout: ConvStateLayout, name: str, *, replace: bool = False) -> None:
        if not isinstance(layout, ConvStateLayout):
            raise TypeError(
                f"layout must be an inkling_cache.ConvStateLayout, got {type(layout).__name__}"
            )
        self.layout = layout
        self.name = name
        # Placeholder until an engine binds the real cache (profiling passes run
        # before that and must see "no cache").
        self._cache: torch.Tensor = torch.empty(0)
        _registry.register(name, self, replace=replace)

    @classmethod
    def for_layer(
        cls,
        config: Any,
        layer_idx: int,
        name: str,
        *,
        tp_size: int = 1,
        padding: str = "pow2",
        replace: bool = False,
    ) -> ConvStateOwner:
        """The owner of decoder layer ``layer_idx`` of ``config`` (anything
        ``inkling_cache.layer_layouts`` accepts: a dict, a config.json path or a
        preset name; a transformers config object is converted with ``to_dict``)."""
        if hasattr(config, "to_dict") and not isinstance(config, Mapping):
            config = config.to_dict()
        layouts = layer_layouts(config, tp_size=tp_size, padding=padding)
        if not 0 <= layer_idx < len(layouts):
            raise ValueError(f"layer_idx {layer_idx} out of range: the config has {len(layouts)} layers")
        return cls(layouts[layer_idx], name, replace=replace)

    # --- cache -----------------------------------------------------------------
    @property
    def cache(self) -> torch.Tensor:
        """The bound ``[num_blocks, H, N, D]`` cache, or an empty placeholder."""
        return self._cache

    @property
    def is_bound(self) -> bool:
        return self._cache.dim() == 4

    def bind_cache(self, cache: torch.Tensor) -> None:
        """Bind the paged cache ``[num_blocks, H, N, D]`` (D stride 1; the block
        stride may be larger than ``H*N*D`` when the engine pads pages)."""
        if not isinstance(cache, torch.Tensor):
            raise TypeError(f"cache must be a torch.Tensor, got {type(cache).__name__}")
        if cache.dim() != 4:
            raise ValueError(
                f"cache must be 4-D [num_blocks, H, N, D], got shape {tuple(cache.shape)}"
            )
        if not cache.is_floating_point():
            raise TypeError(f"cache must be a floating-point tensor, got {cache.dtype}")
        _, heads, block_size, head_size = cache.shape
        if heads != self.layout.num_heads:
            raise ValueError(
                f"cache has {heads} heads but layer {self.name!r} holds "
                f"{self.layout.num_heads} KV heads per rank (tp_size {self.layout.tp_size})"
            )
        if head_size != self.layout.head_size:
            raise ValueError(
                f"cache head size {head_size} != the layout's packed head size "
                f"{self.layout.head_size} for layer {self.name!r}"
            )
        if block_size < 1:
            raise ValueError(f"cache block size must be >= 1, got {block_size}")
        if cache.stride(3) != 1:
            raise ValueError(f"the cache's last dim must be contiguous, got strides {cache.stride()}")
        self._cache = cache

    def unbind_cache(self) -> None:
        """Drop the bound cache (back to the placeholder)."""
        self._cache = torch.empty(0)

    @property
    def block_size(self) -> int:
        """Tokens per block: the bound cache's ``shape[2]`` (an engine may have
        enlarged it beyond W); the layout's default only while unbound."""
        if self.is_bound:
            return int(self._cache.shape[2])
        return int(self.layout.block_size)

    # --- layout shortcuts -----------------------------------------------------
    def stream_range(self, stream: Stream | int) -> tuple[int, int]:
        """``(offset, width)`` of ``stream`` inside a head's ``D``."""
        return tuple(self.layout.stream_range(Stream(stream)))  # type: ignore[return-value]

    def stream_dim(self, stream: Stream | int) -> int:
        """Flat channels of ``stream`` on this rank (``num_heads * width``)."""
        return int(self.layout.stream_dim(Stream(stream)))

    def metadata(self) -> SconvMetadata | None:
        """This layer's metadata for the current forward (``None`` if none)."""
        return current_metadata(self.name)

    def __repr__(self) -> str:
        bound = tuple(self._cache.shape) if self.is_bound else "unbound"
        return f"ConvStateOwner({self.name!r}, heads={self.layout.num_heads}, D={self.layout.head_size}, cache={bound})"


# --- metadata providers -------------------------------------------------------
def set_metadata_provider(fn: MetadataProvider | None) -> MetadataProvider | None:
    """Install ``fn(owner_name) -> SconvMetadata | None`` as the process-wide
    provider (``None`` removes it). Returns the previous provider."""
    global _provider
    if fn is not None and not callable(fn):
        raise TypeError(f"the metadata provider must be callable, got {type(fn).__name__}")
    previous = _provider
    _provider = fn
    return previous


def get_metadata_provider() -> MetadataProvider | None:
    """The installed metadata provider (:func:`set_metadata_provider`), or None."""
    return _provider


def current_metadata_of(owner_name: str, kind: type[T]) -> T | None:
    """Ask the installed provider for ``owner_name``'s metadata, which must be a
    ``kind`` (or ``None``)."""
    provider = _provider
    if provider is None:
        return None
    meta = provider(owner_name)
    if meta is not None and not isinstance(meta, kind):
        raise TypeError(
            f"the metadata provider returned {type(meta).__name__} for {owner_name!r}; "
            f"it must return {kind.__name__} or None"
        )
    return meta


def current_metadata(owner_name: str) -> SconvMetadata | None:
    """Ask the installed provider for conv-state owner ``owner_name``'s metadata."""
    return current_metadata_of(owner_name, SconvMetadata)


def live_state(owner_name: str) -> tuple[ConvStateOwner, SconvMetadata] | None:
    """The owner and the step's batch a paged op runs with, or ``None`` when the conv
    is the identity this forward (no metadata for the owner, or no bound cache: an
    engine's profiling pass). The op itself checks the launch against the batch once
    (``inkling_kernels.checks.check_conv_call``: token count, the cache's block size,
    dtype, device)."""
    owner = get_owner(owner_name)
    meta = current_metadata(owner_name)
    if meta is None or not owner.is_bound:
        return None
    return owner, meta


@contextlib.contextmanager
def forward_metadata(
    meta: SconvMetadata | RelAttentionMetadata | Mapping[str, Any] | None,
) -> Iterator[None]:
    """Make ``meta`` the metadata of every owner (one :class:`SconvMetadata` or
    :class:`RelAttentionMetadata`: a model with both kinds of layers needs a mapping),
    of the named owners (a mapping; others get ``None``), or of none (``None``), for
    the duration of the ``with`` block. The previous provider is restored."""
    if meta is None:
        def provider(name: str) -> Any:
            return None
    elif isinstance(meta, (SconvMetadata, RelAttentionMetadata)):
        single = meta

        def provider(name: str) -> Any:
            return single
    elif isinstance(meta, Mapping):
        table = dict(meta)

        def provider(name: str) -> Any:
            return table.get(name)
    else:
        raise TypeError(
            "forward_metadata takes SconvMetadata, RelAttentionMetadata, a mapping name -> "
            f"metadata, or None; got {type(meta).__name__}"
        )
    previous = set_metadata_provider(provider)
    try:
        yield
    finally:
        set_metadata_provider(previous)
