"""Which implementation an op runs for a device (shared by every op folder).

CPU tensors run the PyTorch references (no Triton needed); CUDA tensors the Triton
kernels. Testing aid: with ``INKLING_KERNELS_CPU_BACKEND=triton`` (and
``TRITON_INTERPRET=1`` set before Triton is imported) CPU tensors run the Triton
kernels under Triton's interpreter instead, so a whole engine on CPU exercises the GPU
code path (slowly; large tiles keep the interpreter's per-program cost down).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["CPU_BACKEND_ENV", "has_memory", "run_op", "traced", "uses_triton"]

CPU_BACKEND_ENV = "INKLING_KERNELS_CPU_BACKEND"


def _interpreted() -> bool:
    """``TRITON_INTERPRET=1``: Triton runs kernels in its interpreter (the only way it
    runs CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def uses_triton(device: torch.device) -> bool:
    """Whether the ops run the Triton kernels for tensors on ``device``: always off
    the CPU; on the CPU only with ``INKLING_KERNELS_CPU_BACKEND=triton`` (read at
    each call), which needs ``TRITON_INTERPRET=1`` (Triton runs CPU tensors only in its
    interpreter; set it before Triton is imported). Builders use it to decide whether a
    tap map is worth building."""
    if torch.device(device).type != "cpu":
        return True
    value = os.environ.get(CPU_BACKEND_ENV, "reference")
    if value not in ("reference", "triton"):
        raise ValueError(f"{CPU_BACKEND_ENV} must be 'reference' or 'triton', got {value!r}")
    if value == "triton" and not _interpreted():
        raise ValueError(f"{CPU_BACKEND_ENV}=triton runs CPU tensors in Triton's interpreter: set "
                         "TRITON_INTERPRET=1 before Triton is imported, or unset "
                         f"{CPU_BACKEND_ENV} to run the PyTorch path")
    return value == "triton"


#: ``torch.Tensor``'s own (disabled) ``__torch_dispatch__``: a tensor whose class keeps it
#: (a plain tensor, ``nn.Parameter`` and its subclasses such as vLLM's weight parameters)
#: needs nothing from the dispatcher that a direct call skips.
_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def traced() -> bool:
    """Whether calls are being traced rather than run: under ``torch.compile``, any
    dispatch mode (fake tensors, ``make_fx``, ``torch.export``) or a functorch transform."""
    return (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
            or torch._C._are_functorch_transforms_active())


def has_memory(t: torch.Tensor) -> bool:
    """Whether ``t`` owns real memory whose address means something: a tensor without a
    ``__torch_dispatch__`` of its own (not a fake or functional tensor) off the meta device."""
    return type(t).__torch_dispatch__ is _PLAIN_DISPATCH and not t.is_meta


def run_op(op: Any, *args: Any, direct: Optional[Callable[[], Any]] = None) -> Any:
    """Call the custom op ``op`` (a ``torch.library.custom_op``) on ``args``.

    On tensors without a ``__torch_dispatch__`` of their own (plain tensors and
    parameters, as a model passes its weights) that need no gradient, with nothing
    tracing the call, the op's implementation runs directly, without the dispatcher's
    own host work (schema checks, the mutation and aliasing bookkeeping of a Python
    custom op), which the ops would otherwise pay once per layer and step:
    ``direct()`` when given (the caller's shortcut to the same work, e.g. on the shapes
    its checks already derived, skipping the unpacking of ``args``), else the
    implementation on ``args``.
    Otherwise the call goes through ``torch.ops``: under ``torch.compile``, any dispatch
    mode (fake tensors, ``make_fx``, ``torch.export``) or functorch transform, on tensor
    subclasses that dispatch (fake tensors outside their mode included), and where
    autograd would record the call, so traced graphs keep the op and autograd sees it
    as before. The direct call does not bump the version counters of the arguments it
    writes."""
    impl = getattr(op, "_init_fn", None)
    if impl is None or traced():
        return op(*args)
    grad = torch.is_grad_enabled()
    for arg in args:
        if isinstance(arg, torch.Tensor) and (
            type(arg).__torch_dispatch__ is not _PLAIN_DISPATCH or (grad and arg.requires_grad)
        ):
            return op(*args)
    return impl(*args) if direct is None else direct()
