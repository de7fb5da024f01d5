"""vLLM general plugin: registers the Inkling text model with vLLM.

Declared in ``pyproject.toml`` under the entry-point group
``vllm.general_plugins`` (``inkling = "inkling_vllm.plugin:register"``); vLLM calls
:func:`register` in every process it starts (engine, workers), possibly more than
once. Imports stay lazy so loading the plugin costs nothing until vLLM asks.
"""

from __future__ import annotations

import logging
import os

__all__ = ["ARCHITECTURES", "ARCHITECTURE", "MODEL_CLASS", "register"]

#: transformers' architecture name for Inkling text checkpoints (config.json "architectures").
ARCHITECTURE = "InklingForCausalLM"
#: Every architecture name Inkling checkpoints carry: transformers' format and the
#: original release layout (``inkling_mm_model``; the plugin serves its text model).
ARCHITECTURES = (ARCHITECTURE, "InklingForConditionalGeneration")
MODEL_CLASS = "inkling_vllm.model:InklingForCausalLM"

_registered = False
logger = logging.getLogger(__name__)


def register() -> None:
    """Register :data:`ARCHITECTURES` -> :data:`MODEL_CLASS` (idempotent).

    vLLM >= 0.26 ships its own GPU-only Inkling under the same names; the plugin
    replaces it but keeps vLLM's entry, so a checkpoint only the in-tree model can
    serve still gets it (:mod:`inkling_vllm.dispatch`). It also maps the conv-state
    spec to its manager in vLLM's KV-cache spec registry
    (:func:`inkling_vllm.conv_manager.register_conv_state_spec`) and, on CUDA, makes
    the GPU worker compile the model's kernels before serving
    (:func:`inkling_vllm.warmup.install_warmup_hook`) and keeps the capture sizes vLLM
    rounds for drafting engines
    (:func:`inkling_vllm.one_row_graphs.install_capture_size_record`). On every
    platform it keeps vLLM's breakable CUDA graphs off for the engines it serves, so
    they are torch-compiled (:func:`inkling_vllm.attention.keep_breakable_graphs_off`; vLLM
    turns them on for the Inkling architectures on CPU too, where they only switch
    compilation off). It registers the
    checkpoint's multi-token-prediction head as the drafter for speculative method
    ``"mtp"`` (:data:`inkling_vllm.drafting.MTP_ARCHITECTURE`,
    :func:`inkling_vllm.drafting.install_mtp_hooks`), whose drafts vLLM's scheduler
    pauses while they are mostly rejected (:mod:`inkling_vllm.draft_gate`). With the environment
    variable ``INKLING_VLLM_MODEL=builtin`` the plugin registers nothing. An
    unsupported vLLM version is not refused here (that would break vLLM for every
    model): building the Inkling model raises ``UnsupportedVllmVersion`` instead.
    """
    global _registered
    if _registered:
        return
    from vllm import ModelRegistry

    from .dispatch import SWITCH_ENV, remember_builtin, switch

    log_with_vllm()

    try:
        builtin_only = bool(os.environ.get(SWITCH_ENV)) and switch() == "builtin"
    except ValueError as exc:
        # (refused when an Inkling model is built, which reads the switch again)
        logger.warning("%s; registering the plugin's model as for 'auto'", exc)
        builtin_only = False
    if builtin_only:
        _registered = True
        return
    # The conv-state spec -> manager mapping must exist in every process that
    # groups specs or builds managers (engine core) or emits specs (workers).
    from .conv_manager import register_conv_state_spec

    register_conv_state_spec()
    # torch.compile for the plugin's engines (vLLM's breakable graphs would skip it)
    from .attention import keep_breakable_graphs_off

    keep_breakable_graphs_off()
    # GPU workers compile the model's kernels at start-up, not while serving.
    from vllm.platforms import current_platform

    if current_platform.is_cuda():
        from .one_row_graphs import install_capture_size_record
        from .warmup import install_warmup_hook

        install_warmup_hook()
        install_capture_size_record()
    models = getattr(ModelRegistry, "models", {})
    for arch in ARCHITECTURES:
        remember_builtin(arch, models.get(arch))
        ModelRegistry.register_model(arch, MODEL_CLASS)
    # The checkpoint's MTP head as vLLM's drafter (speculative method "mtp").
    from .drafting import MTP_ARCHITECTURE, MTP_MODEL_CLASS, install_mtp_hooks

    remember_builtin(MTP_ARCHITECTURE, models.get(MTP_ARCHITECTURE))
    ModelRegistry.register_model(MTP_ARCHITECTURE, MTP_MODEL_CLASS)
    install_mtp_hooks()
    _registered = True


class _ToVllm(logging.Handler):
    """Hands the plugin's log records to the handlers of vLLM's logger ``vllm`` when
    that logger takes their level: the handlers present when a record is made, not
    those present when the plugin loaded. Only that logger's own handlers: the record
    goes on to the root logger's by the plugin's logger, as any record does."""

    def emit(self, record: logging.LogRecord) -> None:
        theirs = logging.getLogger("vllm")
        if not theirs.isEnabledFor(record.levelno):
            return
        for handler in theirs.handlers:
            if record.levelno >= handler.level:
                handler.handle(record)


def log_with_vllm() -> None:
    """Send the plugin's log records (``inkling_vllm.*``) through vLLM's logger, at
    vLLM's level and in its format, so the plugin's start-up lines (the kernel warm-up's
    progress, the one-row graphs, a changed graph mode) appear in the engine's log.
    vLLM 0.32 sets its logging up only after it has loaded the plugins, so the records
    are handed over as they are made, and the plugin's logger takes vLLM's level or,
    where vLLM has not set one yet, the one it will set (``VLLM_LOGGING_LEVEL``; INFO
    for a value logging does not know). A logging set-up of the application's own
    (handlers on ``inkling_vllm``) is left alone."""
    ours = logging.getLogger("inkling_vllm")
    if ours.handlers:
        return
    ours.addHandler(_ToVllm())
    theirs = logging.getLogger("vllm")
    if theirs.level != logging.NOTSET:
        ours.setLevel(theirs.level)
    else:
        from vllm import envs

        try:
            ours.setLevel(str(envs.VLLM_LOGGING_LEVEL).upper())
        except ValueError:
            ours.setLevel(logging.INFO)
