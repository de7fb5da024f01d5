"""Relative-logit attention (Inkling's attention core) over a paged KV cache.

Per layer, for a query row at absolute position ``p``, query head ``h`` (kv head
``h // (Hq // Hkv)``) and a key of the same request at position ``j``, ``d = p - j``::

    tau(p) = 1 + alpha * log(max((p + 1) / n_floor, 1))   global layers with log scaling, else 1
    rel    = r[p, h] @ rel_proj                             # [E]: bias per backward distance
    bias   = rel[d] if 0 <= d < E else 0
    logit  = ((tau(p) * q[p, h]) . k[j]) * scale + tau(p) * bias
    seen   = 0 <= d, and d < window on sliding layers
    out    = softmax over the seen keys (fp32) of logit, times v[j]

``scale`` is ``1 / head_dim`` in Inkling (q and k are RMS-normalised by the caller);
sliding layers use ``E = window``.

Shapes: ``q`` [T, Hq, Dh]; ``r`` [T, Hq, d_rel]; ``rel_proj`` [d_rel, E];
``key_cache`` / ``value_cache`` [num_blocks, N, Hkv, Dh] (any strides);
``positions`` [T] int64; ``block_table`` [R, max_blocks] int32/int64 on the device;
``query_start_loc`` [R + 1] and ``seq_lens`` [R] int tensors on the host;
``slot_mapping`` [T] int64 (-1 = pad row).

* :func:`write_kv` stores this step's K/V rows in their slots (call it first);
* :func:`paged_rel_attention` attends each request's rows to its keys in the cache,
  reading only the blocks its queries can see; pad rows (from
  ``query_start_loc[R]`` on) get zeros;
* :func:`rel_attention_ref` is the dense fp32 oracle for one sequence.

:func:`paged_rel_attention` is PyTorch only (the CPU path of the served model);
:func:`paged_rel_attention_triton` (module :mod:`.kernel`, Triton, imported on first
use) is the GPU path with the same arguments, taking device-side ``query_start_loc``
/ ``seq_lens``; :func:`write_kv_triton` is :func:`write_kv` without the host sync.
:func:`rel_attention_uses_triton` says which pair to call for a device.
"""

import os
from typing import Any

import torch

from .paged import paged_rel_attention, write_kv
from .reference import rel_attention_ref

__all__ = [
    "paged_rel_attention",
    "paged_rel_attention_triton",
    "rel_attention_ref",
    "rel_attention_uses_triton",
    "write_kv",
    "write_kv_triton",
]

_KERNEL_NAMES = ("paged_rel_attention_triton", "write_kv_triton")


CPU_ATTENTION_ENV = "INKLING_KERNELS_CPU_ATTENTION"


def rel_attention_uses_triton(device: "torch.device | str") -> bool:
    """Whether attention on ``device`` should run :func:`paged_rel_attention_triton`:
    always off the CPU; on the CPU only under ``INKLING_KERNELS_CPU_BACKEND=triton``
    (then ``TRITON_INTERPRET=1`` must be set before Triton is imported), unless
    ``INKLING_KERNELS_CPU_ATTENTION=reference`` keeps the attention alone on the
    PyTorch path (the interpreter runs it at about a second per layer and step: an
    engine that interprets the conv kernels over many steps may want that)."""
    from .._dispatch import uses_triton

    device = torch.device(device)
    if device.type == "cpu":
        value = os.environ.get(CPU_ATTENTION_ENV, "follow")
        if value not in ("follow", "reference"):
            raise ValueError(f"{CPU_ATTENTION_ENV} must be 'follow' or 'reference', got {value!r}")
        if value == "reference":
            return False
    return uses_triton(device)


def __getattr__(name: str) -> Any:
    # Triton is imported only when the GPU path is first asked for.
    if name in _KERNEL_NAMES:
        from . import kernel

        return getattr(kernel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
