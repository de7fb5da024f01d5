"""Which Inkling model serves a checkpoint: this plugin's, or vLLM's in-tree one.

vLLM >= 0.26 ships its own GPU-only Inkling under the same architecture names; the
plugin replaces it (:mod:`inkling_vllm.plugin`), so a checkpoint the plugin cannot
serve but the in-tree model can (a quantised release, say) must not be refused
because the plugin is installed. The choice, per engine:

``auto`` (default)
    the plugin's model, unless the checkpoint needs something it lacks
    (:func:`unsupported_reasons`) and this vLLM build has an in-tree Inkling that runs
    on this platform: then the in-tree model, with one log line saying why.
``plugin``
    always the plugin's model (an unsupported checkpoint is then refused with the
    reason).
``builtin``
    always vLLM's in-tree model (with the environment variable the plugin does not
    even register itself, so vLLM sees its own class unchanged).

Set it with the environment variable :data:`SWITCH_ENV` or, per engine, the config
key :data:`SWITCH_KEY` (``hf_overrides={"inkling_vllm_model": "builtin"}``); the
config key wins.
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = [
    "CHOICES",
    "SWITCH_ENV",
    "SWITCH_KEY",
    "builtin_model_for",
    "remember_builtin",
    "switch",
    "unsupported_reasons",
]

logger = logging.getLogger(__name__)

SWITCH_ENV = "INKLING_VLLM_MODEL"
SWITCH_KEY = "inkling_vllm_model"
CHOICES = ("auto", "plugin", "builtin")

#: architecture -> vLLM's own registry entry, saved before the plugin replaced it
_builtin: dict[str, Any] = {}


def remember_builtin(architecture: str, entry: Any) -> None:
    """Keep vLLM's own registry entry for ``architecture`` (called by the plugin)."""
    if entry is not None and architecture not in _builtin:
        _builtin[architecture] = entry


def _check_choice(value: Any, where: str) -> str:
    text = str(value).strip().lower()
    if text not in CHOICES:
        raise ValueError(f"{where} is {value!r}: choose one of {', '.join(CHOICES)}")
    return text


def switch(hf_config: Any = None) -> str:
    """The choice for this engine: the config key, else the environment variable,
    else ``auto``."""
    value = getattr(hf_config, SWITCH_KEY, None) if hf_config is not None else None
    if value is not None:
        return _check_choice(value, f"the config key {SWITCH_KEY!r}")
    env = os.environ.get(SWITCH_ENV)
    if env:
        return _check_choice(env, f"the environment variable {SWITCH_ENV}")
    return "auto"


def unsupported_reasons(model_config: Any) -> list[str]:
    """What in the engine's model config this plugin's model cannot serve."""
    reasons: list[str] = []
    quantization = getattr(model_config, "quantization", None)
    hf_config = getattr(model_config, "hf_config", None)
    if quantization is None and hf_config is not None:
        quant_cfg = getattr(hf_config, "quantization_config", None)
        text = getattr(hf_config, "text_config", None)
        if quant_cfg is None and text is not None:
            quant_cfg = getattr(text, "quantization_config", None)
        if quant_cfg is not None:
            quantization = quant_cfg.get("quant_method", "yes") if isinstance(quant_cfg, dict) else "yes"
    if quantization:
        reasons.append(f"quantised weights ({quantization}): the plugin serves float32/bfloat16/float16 weights")
    return reasons


def _architecture(model_config: Any) -> str | None:
    archs = getattr(getattr(model_config, "hf_config", None), "architectures", None) or []
    for arch in archs:
        if arch in _builtin:
            return str(arch)
    return None


def _builtin_class(arch: str) -> type | None:
    entry = _builtin.get(arch)
    if entry is None:
        return None
    load = getattr(entry, "load_model_cls", None)
    return load() if callable(load) else entry if isinstance(entry, type) else None


def _platform_runs_builtin() -> bool:
    """vLLM's in-tree Inkling needs a GPU (FlashAttention 4 score modifiers)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_cuda_alike())


def builtin_model_for(vllm_config: Any) -> type | None:
    """vLLM's in-tree model class when it should serve this engine instead of the
    plugin's, else ``None``. Raises ``ValueError`` for a bad switch value or a
    ``builtin`` choice this vLLM build cannot honour."""
    if vllm_config is None:
        return None
    model_config = vllm_config.model_config
    choice = switch(getattr(model_config, "hf_config", None))
    if choice == "plugin":
        return None
    arch = _architecture(model_config)
    # vLLM's class is imported only where it may serve: importing it has side effects
    # (numba's LLVM binding, which vLLM's CPU worker cannot scan for kernel overrides)
    if choice == "builtin":
        builtin = _builtin_class(arch) if arch is not None else None
        if builtin is None:
            raise ValueError(
                f"{SWITCH_KEY}='builtin' but this vLLM build has no in-tree Inkling for "
                f"{getattr(model_config.hf_config, 'architectures', None)}; use 'plugin' or 'auto'"
            )
        logger.info("inkling-vllm: serving with vLLM's in-tree %s (%s='builtin')", arch, SWITCH_KEY)
        return builtin
    reasons = unsupported_reasons(model_config)
    builtin = _builtin_class(arch) if reasons and arch is not None and _platform_runs_builtin() else None
    if builtin is None:
        return None  # the plugin's model serves it (or refuses it, saying why)
    logger.warning(
        "inkling-vllm: stepping aside for vLLM's in-tree %s: %s (set %s=plugin to force the plugin)",
        arch,
        "; ".join(reasons),
        SWITCH_ENV,
    )
    return builtin
