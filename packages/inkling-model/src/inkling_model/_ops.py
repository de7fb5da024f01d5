"""How the model's custom ops are defined: ``torch.ops.inkling_model.*``.

Every model op reads the step's metadata when it runs and writes its results into
outputs allocated by its Python function before the call (so an engine that captures
the graph pieces between these ops hands each piece outputs of fixed address). The
ops are defined on a ``torch.library.Library`` directly, with one implementation for
every device (``CompositeExplicitAutograd``) and a fake implementation that writes
nothing, rather than through ``torch.library.custom_op``: an engine calls them once
per layer and step between its compiled pieces, and the lower-level definition skips
``custom_op``'s Python wrappers (autograd, argument defaults, in-place bookkeeping) on
every call. They are inference ops: no autograd formula.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["NAMESPACE", "fake_writes_only", "out_op"]

NAMESPACE = "inkling_model"
_LIBRARY = torch.library.Library(NAMESPACE, "DEF")


def fake_writes_only(*args: object) -> None:
    """The fake implementation of an op that only writes into its outputs (arguments
    allocated before the call): under fake tensors it does nothing."""
    return None


def out_op(schema: str) -> Callable[[Callable[..., None]], Any]:
    """Define ``inkling_model::<name>`` with ``schema`` (its arguments, the mutated
    outputs marked ``Tensor(a!)``, returning ``()``), implemented by the decorated
    function, whose name less its leading underscores is ``<name>``. Returns the op
    (``torch.ops.inkling_model.<name>.default``), called like the function."""

    def define(fn: Callable[..., None]) -> Any:
        name = fn.__name__.lstrip("_")
        _LIBRARY.define(name + schema)
        _LIBRARY.impl(name, fn, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake_writes_only, lib=_LIBRARY)
        return getattr(getattr(torch.ops, NAMESPACE), name).default

    return define
