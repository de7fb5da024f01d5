"""vLLM 0.33.0's in-tree Triton short conv, swapped in behind the plugin's conv ops.

For the engine benchmark only (``gpu_engine bench --conv peer``): the same engine,
model and metadata, with the implementations behind the four conv custom ops
(``inkling_model::paged_short_conv_out``, ``paged_short_conv_kv_out``,
``paged_short_conv_add_out``, ``paged_short_conv_add_rmsnorm_out``) replaced by the arrangement vLLM's in-tree Inkling
model runs:

* K and V: the peer's ``fused_sconv`` twice, on contiguous copies of the column
  slices of the QKV projection;
* ATTN / MLP: the peer's ``fused_sconv``, then an unfused torch residual add and
  ``F.rms_norm`` (or the add alone at tp > 1).

The peer kernel takes "loose" metadata ``(positions, block_table, seq_idx,
slot_mapping, query_start)`` with its own ``seq_idx`` / ``query_start``, which its
``sconv_seq_metadata`` fills from the step's ``query_start_loc``. That launch runs once
per forward step and KV-cache group: the first conv op of the step that sees a batch
launches it into buffers allocated once per group (fixed addresses, no host sync), so
a full CUDA graph captures it with the step's convolutions. The step's
``query_start_loc`` and request counts come from the metadata builder
(:func:`note_step`; :func:`install` wraps the plugin's builder to call it).

The peer module is the file ``vllm_sconv_peer.py`` that
``packages/inkling-kernels/benchmarks/fetch_peer.py`` extracts from the vllm 0.33.0
wheel (nothing of it is committed here).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from inkling_cache import Stream
from inkling_model import SconvMetadata
from inkling_model.sconv import described_rows, zero_padding
from inkling_model.state import live_state

__all__ = ["PEER_MODULE", "PeerConv", "install", "load_peer", "note_step"]

PEER_MODULE = "vllm_sconv_peer.py"

#: The plugin's conv functions this swap replaces: (activations, outputs) of each. The
#: custom op behind ``name`` is ``inkling_model::{name}_out``; it takes the function's
#: arguments (the activations, ``[T, C]``, first) followed by the outputs to write.
CONV_OPS = {"paged_short_conv": (1, 1), "paged_short_conv_kv": (2, 2), "paged_short_conv_add": (2, 1),
            "paged_short_conv_add_rmsnorm": (2, 2)}


def load_peer(folder: str | Path) -> ModuleType:
    """Import ``folder/vllm_sconv_peer.py`` (the peer's ``fused_sconv`` and
    ``sconv_seq_metadata``)."""
    path = Path(folder) / PEER_MODULE
    if not path.is_file():
        raise FileNotFoundError(
            f"no {PEER_MODULE} in {folder}: extract it from the vllm 0.33.0 wheel with "
            "`python3 -m pip download --no-deps vllm==0.33.0 -d .whl && python3 "
            f"packages/inkling-kernels/benchmarks/fetch_peer.py .whl/vllm-0.33.0-*.whl --out {folder}`"
        )
    spec = importlib.util.spec_from_file_location("vllm_sconv_peer", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("fused_sconv", "sconv_seq_metadata"):
        if not callable(getattr(module, name, None)):
            raise ImportError(f"{path} defines no {name}: not the vLLM 0.33.0 sconv module")
    return module


@dataclass
class _Step:
    """One step's batch of a KV-cache group and what the peer's metadata needs."""

    batch: SconvMetadata
    query_start_loc: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    seq_idx: torch.Tensor  # the group's fixed buffers
    query_start: torch.Tensor
    loose: tuple[torch.Tensor, ...] | None = None  # filled by the step's first conv op


class PeerConv:
    """The peer's ops on the plugin's owners, caches and step metadata."""

    def __init__(self, peer: ModuleType) -> None:
        self.peer = peer
        self._steps: dict[int, _Step] = {}  # id(batch) -> step (the batch is held: ids stay unique)
        self._group_step: dict[int, int] = {}  # id(group) -> id of its current batch
        self._buffers: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}  # id(group) -> (group, seq, qs)
        self._weights: dict[tuple[int, tuple[int, ...], tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = {}
        self.launches = 0  # peer metadata launches (once per step and group)

    # --- per-step metadata ------------------------------------------------------
    def note_step(self, group: Any, batch: SconvMetadata, query_start_loc: torch.Tensor, num_reqs: int,
                  num_actual_tokens: int, capacity: int) -> None:
        """Record the step's ``batch`` of KV-cache group ``group`` (any object, e.g. its
        metadata builder) and its request offsets; ``capacity``: the most rows a forward
        of the group may hold (the peer buffers are allocated once, for it)."""
        key = id(group)
        held = self._buffers.get(key)
        if held is None:
            seq = torch.zeros(capacity, dtype=torch.int32, device=batch.device)
            held = self._buffers[key] = (group, seq, torch.zeros_like(seq))
        _, seq, qs = held
        if batch.num_tokens > seq.shape[0]:
            raise ValueError(f"a step of {batch.num_tokens} rows exceeds the peer buffers' {seq.shape[0]}")
        previous = self._group_step.pop(key, None)
        if previous is not None:
            self._steps.pop(previous, None)
        self._steps[id(batch)] = _Step(batch, query_start_loc, num_reqs, num_actual_tokens, seq, qs)
        self._group_step[key] = id(batch)

    def loose(self, batch: SconvMetadata) -> tuple[torch.Tensor, ...]:
        """The peer's loose metadata of ``batch``: its ``sconv_seq_metadata`` is launched
        by the first call of the step, later calls reuse the buffers."""
        step = self._steps.get(id(batch))
        if step is None or step.batch is not batch:
            raise RuntimeError(
                "the peer conv found no noted step for this forward's metadata: the step's "
                "batch must go through note_step (install() wraps the plugin's builder)"
            )
        if step.loose is None:
            rows = batch.num_tokens
            self.peer.sconv_seq_metadata(step.query_start_loc, step.num_reqs, step.num_actual_tokens,
                                         step.seq_idx, step.query_start, rows)
            self.launches += 1
            step.loose = (batch.positions, batch.block_table, step.seq_idx[:rows], batch.slot_mapping,
                          step.query_start[:rows])
        return step.loose

    # --- the ops ------------------------------------------------------------------
    def _weight(self, weight: torch.Tensor) -> torch.Tensor:
        """``(C, 1, W)`` -> the ``(C, W)`` contiguous weight the peer's model keeps, copied
        once per parameter (the tap-major storage of the fused tails is a transposed
        view). A copy made while a graph captures lives in the graph pool and is kept."""
        if weight.dim() == 3:
            weight = weight[:, 0, :]
        if weight.is_contiguous():
            return weight
        key = (weight.data_ptr(), tuple(weight.shape), tuple(weight.stride()))
        held = self._weights.get(key)
        if held is None:  # the source is held too: its memory cannot pass to another tensor
            held = self._weights[key] = (weight, weight.contiguous())
        return held[1]

    def conv(self, x: torch.Tensor, weight: torch.Tensor, owner_name: str, stream: int) -> torch.Tensor | None:
        """``x + conv(x)`` by the peer on ``owner_name``'s ``stream``; ``None`` when the
        conv is the identity this forward (no metadata or no bound cache)."""
        state = live_state(owner_name)
        if state is None:
            return None
        owner, batch = state
        offset, width = owner.stream_range(stream)
        return self.peer.fused_sconv(x.contiguous(), self._weight(weight), owner.cache, *self.loose(batch),
                                     offset, width, batch.block_size)

    def paged_short_conv(self, x: torch.Tensor, weight: torch.Tensor, owner_name: str,
                         stream: int) -> torch.Tensor:
        y = self.conv(x, weight, owner_name, stream)
        return x.clone() if y is None else y

    def paged_short_conv_kv(self, k: torch.Tensor, v: torch.Tensor, k_weight: torch.Tensor,
                            v_weight: torch.Tensor, owner_name: str) -> tuple[torch.Tensor, torch.Tensor]:
        k_out = self.conv(k, k_weight, owner_name, int(Stream.K))
        if k_out is None:
            like = dict(memory_format=torch.contiguous_format)
            return k.clone(**like), v.clone(**like)
        v_out = self.conv(v, v_weight, owner_name, int(Stream.V))
        assert v_out is not None  # the same owner and step as k
        return k_out, v_out

    def paged_short_conv_add(self, hidden: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, owner_name: str,
                             stream: int) -> torch.Tensor:
        y = self.conv(d, weight, owner_name, stream)
        return hidden + (d if y is None else y)

    def paged_short_conv_add_rmsnorm(self, hidden: torch.Tensor, d: torch.Tensor, weight: torch.Tensor,
                                     norm_weight: torch.Tensor, owner_name: str, stream: int,
                                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        new_hidden = self.paged_short_conv_add(hidden, d, weight, owner_name, stream)
        return new_hidden, F.rms_norm(new_hidden, (new_hidden.shape[-1],), norm_weight, eps)

    # --- registration -------------------------------------------------------------
    def register(self, device_types: tuple[str, ...] = ("CUDA", "CPU")) -> torch.library.Library:
        """Put these implementations behind the plugin's conv ops for ``device_types``
        (dispatch keys). They stay until the returned library is destroyed
        (``library._destroy()``, or dropping it), which restores the project's."""
        library = torch.library.Library("inkling_model", "IMPL")
        for name, (activations, outputs) in CONV_OPS.items():
            impl = _writing_outputs(getattr(self, name), activations, outputs)
            for key in device_types:
                library.impl(f"{name}_out", impl, key)
        return library


def _writing_outputs(function: Callable[..., Any], activations: int, outputs: int) -> Callable[..., None]:
    """An ``*_out`` op implementation: ``function`` on the arguments before the trailing
    ``outputs`` tensors, its result(s) copied into those. As the project's ops do, rows
    of the leading ``activations`` past the step's batch are padding: left out of the
    call, zeros in the outputs."""
    def write(*args: Any) -> None:
        owner_name = next(a for a in args if isinstance(a, str))
        rows = args[0].shape[0]
        state = live_state(owner_name)
        n = rows if state is None else described_rows(rows, state[1].num_tokens)
        result = function(*(a[:n] for a in args[:activations]), *args[activations:-outputs])
        outs = args[-outputs:]
        for out, value in zip(outs, result if outputs > 1 else (result,)):
            out[:n].copy_(value)
        zero_padding(outs, n)

    return write


_active: PeerConv | None = None
_library: torch.library.Library | None = None


def note_step(group: Any, batch: SconvMetadata, query_start_loc: torch.Tensor, num_reqs: int,
              num_actual_tokens: int, capacity: int) -> None:
    """:meth:`PeerConv.note_step` of the installed swap (nothing when none is)."""
    if _active is not None:
        _active.note_step(group, batch, query_start_loc, num_reqs, num_actual_tokens, capacity)


def install(folder: str | Path) -> PeerConv:
    """Swap the peer in for this process, before the engine is built: the conv ops'
    CPU and CUDA implementations, and the plugin's conv metadata builder, which then
    notes each step for the peer (and builds no tap map: the peer does not read one)."""
    global _active, _library
    from ..conv_state import InklingSconvMetadataBuilder

    if _active is not None:
        raise RuntimeError("the peer conv is already installed in this process")
    swap = PeerConv(load_peer(folder))
    original_init = InklingSconvMetadataBuilder.__init__
    original_build = InklingSconvMetadataBuilder.build

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self._builder.tap_map_buffer = None

    def build(self: Any, common_prefix_len: int, common_attn_metadata: Any, fast_build: bool = False) -> Any:
        batch = original_build(self, common_prefix_len, common_attn_metadata, fast_build)
        cm = common_attn_metadata
        num_reqs = int(cm.num_reqs)
        note_step(self, batch, cm.query_start_loc, num_reqs, int(cm.query_start_loc_cpu[num_reqs]),
                  self._builder.max_num_tokens)
        return batch

    InklingSconvMetadataBuilder.__init__ = __init__  # type: ignore[method-assign]
    InklingSconvMetadataBuilder.build = build  # type: ignore[method-assign]
    _active, _library = swap, swap.register()
    return swap
