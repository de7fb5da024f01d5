"""The plugin's own settings and their checks, without vLLM or torch.

Each setting is a config key (in the checkpoint's config.json or, per engine,
``hf_overrides``), some also an environment variable; the config key wins:

- ``inkling_conv_state`` / ``INKLING_CONV_STATE``: ``tail`` (default) or ``window``;
- ``inkling_conv_retention_tokens`` / ``INKLING_CONV_RETENTION_TOKENS``: a whole
  number of tokens >= 0 (default 0);
- ``inkling_conv_state_padding``: ``pow2`` (default), ``none`` or ``k``;
- ``inkling_fused_conv_norm``: ``true`` (default) or ``false``;
- ``inkling_vllm_model`` / ``INKLING_VLLM_MODEL``: ``auto`` (default), ``plugin`` or
  ``builtin`` (:mod:`inkling_vllm.dispatch`).

The engine reads them when it builds the model and its KV-cache managers;
:func:`option_problems` checks them all on a config.json before any engine starts
(the checkpoint check of :mod:`inkling_vllm.demo.preflight`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from inkling_cache import PaddingPolicy

__all__ = [
    "FUSED_KEY",
    "MANAGER_CHOICES",
    "MANAGER_ENV",
    "MANAGER_KEY",
    "PADDING_KEY",
    "RETENTION_ENV",
    "RETENTION_KEY",
    "conv_padding",
    "conv_retention_tokens",
    "conv_state_manager",
    "fused_tails",
    "option_problems",
]

#: Environment variable choosing the conv-state manager (``tail`` or ``window``).
MANAGER_ENV = "INKLING_CONV_STATE"
#: Config key (``hf_overrides={"inkling_conv_state": "window"}``); wins over the env var.
MANAGER_KEY = "inkling_conv_state"
#: ``tail``: the plugin's tail manager (default); ``window``: vLLM's plain sliding window.
MANAGER_CHOICES = ("tail", "window")
#: Environment variable: prefix-cache checkpoint interval in tokens (0: prompt end only).
RETENTION_ENV = "INKLING_CONV_RETENTION_TOKENS"
#: Config key for the retention interval; wins over the env var.
RETENTION_KEY = "inkling_conv_retention_tokens"
#: Config key choosing how the packed conv head size ``D`` is padded: ``"pow2"``
#: (default, vLLM's choice), ``"none"``, ``k`` (a multiple of k).
PADDING_KEY = "inkling_conv_state_padding"
#: Config key turning the fused sublayer tails (conv + residual add [+ RMSNorm]) off:
#: ``false`` runs the plain sequence.
FUSED_KEY = "inkling_fused_conv_norm"


def _field(config: Any, key: str) -> Any:
    """``key`` of a config.json dict or of a parsed config object; None if absent."""
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def _config_value(hf_config: Any, key: str) -> Any:
    """``key`` of a config (dict or parsed object), else of its ``text_config``; None
    if neither has it."""
    if hf_config is None:
        return None
    value = _field(hf_config, key)
    text = _field(hf_config, "text_config")
    if value is None and text is not None:
        value = _field(text, key)
    return value


def conv_state_manager(hf_config: Any = None) -> str:
    """Which manager holds the conv state: the config key :data:`MANAGER_KEY`, else
    the environment variable :data:`MANAGER_ENV`, else ``tail``. Raises
    ``ValueError`` naming the choices for any other value."""
    value = _config_value(hf_config, MANAGER_KEY)
    where = f"the config key {MANAGER_KEY!r}"
    if value is None:
        value, where = os.environ.get(MANAGER_ENV) or None, f"the environment variable {MANAGER_ENV}"
    if value is None:
        return "tail"
    text = str(value).strip().lower()
    if text not in MANAGER_CHOICES:
        raise ValueError(
            f"{where} is {value!r}: choose 'tail' (conv state holds only the rows later "
            "steps read) or 'window' (vLLM's plain sliding-window manager)"
        )
    return text


def conv_retention_tokens(hf_config: Any = None) -> int:
    """The prefix-cache checkpoint interval ``R`` in tokens: the config key
    :data:`RETENTION_KEY`, else :data:`RETENTION_ENV`, else 0 (checkpoint only the
    prompt's last hit-aligned boundary; decode rows are cached anyway). Each
    checkpoint holds ``cdiv(W - 1, N)`` blocks while its chunk runs, then stays
    cached in the free queue. Must be a whole number >= 0 (``512`` or ``512.0``; a
    multiple of the engine's hit alignment, checked when the manager is built)."""
    value = _config_value(hf_config, RETENTION_KEY)
    where = f"the config key {RETENTION_KEY!r}"
    if value is None:
        value, where = os.environ.get(RETENTION_ENV) or None, f"the environment variable {RETENTION_ENV}"
    if value is None:
        return 0
    tokens = -1
    if isinstance(value, float):
        if value.is_integer():
            tokens = int(value)
    elif not isinstance(value, bool):
        try:
            tokens = int(str(value).strip())
        except ValueError:
            pass
    if tokens < 0:
        raise ValueError(
            f"{where} is {value!r}: give a non-negative whole number of tokens (0 keeps "
            "checkpoints only at the prompt's last hit-aligned boundary; R > 0 also every "
            "R tokens, R a multiple of the prefix-cache hit alignment)"
        )
    return tokens


def conv_padding(value: Any) -> str:
    """The conv-state padding of the config value ``value`` of :data:`PADDING_KEY`
    (None: ``"pow2"``), as the spelling the conv layers parse; raises ``ValueError``
    naming the key and the accepted values for anything else (``0``, ``false``, ...)."""
    if value is None:
        return "pow2"
    try:
        PaddingPolicy.parse(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the config key {PADDING_KEY!r} is {value!r}: {exc}") from None
    return str(value)


def fused_tails(value: Any) -> bool:
    """Whether the sublayer tails run fused, from the config value ``value`` of
    :data:`FUSED_KEY` (None: fused); raises ``ValueError`` for a non-boolean."""
    if value is None:
        return True
    if not isinstance(value, bool):
        raise ValueError(f"the config key {FUSED_KEY!r} must be true or false, got {value!r}")
    return value


def option_problems(config: dict[str, Any]) -> list[str]:
    """Every plugin setting of the config.json ``config`` (and the environment) that
    the engine would refuse, one line each naming the key or variable, its value and
    the accepted values; ``[]`` when all are valid."""
    from .dispatch import SWITCH_KEY, switch

    checks = (
        lambda: conv_state_manager(config),
        lambda: conv_retention_tokens(config),
        lambda: conv_padding(config.get(PADDING_KEY)),
        lambda: fused_tails(config.get(FUSED_KEY)),
        lambda: switch(SimpleNamespace(**{SWITCH_KEY: config.get(SWITCH_KEY)})),
    )
    problems = []
    for check in checks:
        try:
            check()
        except ValueError as exc:
            problems.append(str(exc))
    return problems
