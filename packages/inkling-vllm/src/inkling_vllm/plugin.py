"""vLLM general plugin: registers the Inkling text model with vLLM.

Declared in ``pyproject.toml`` under the entry-point group
``vllm.general_plugins`` (``inkling = "inkling_vllm.plugin:register"``); vLLM calls
:func:`register` in every process it starts (engine, workers), possibly more than
once. Imports stay lazy so loading the plugin costs nothing until vLLM asks.
"""

from __future__ import annotations

__all__ = ["ARCHITECTURE", "MODEL_CLASS", "register"]

#: transformers' architecture name for Inkling text checkpoints (config.json "architectures").
ARCHITECTURE = "InklingForCausalLM"
MODEL_CLASS = "inkling_vllm.model:InklingForCausalLM"

_registered = False


def register() -> None:
    """Register :data:`ARCHITECTURE` -> :data:`MODEL_CLASS` (idempotent).

    vLLM >= 0.26 ships its own GPU-only Inkling under the same architecture name;
    the plugin replaces it with this implementation. An unsupported vLLM version is
    not refused here (that would break vLLM for every model): building the Inkling
    model raises ``UnsupportedVllmVersion`` instead.
    """
    global _registered
    if _registered:
        return
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
    _registered = True
