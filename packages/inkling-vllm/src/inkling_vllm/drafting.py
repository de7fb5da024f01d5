"""The MTP drafter's engine side: draft config, refusal, proposer, vLLM hooks.

Kept apart from the draft model (:mod:`inkling_vllm.mtp`) so that the plugin can
install its hooks without importing vLLM's model layers:

* :func:`mtp_head` / :class:`MtpHead`: the MTP head a checkpoint config declares
  (both layouts);
* :func:`check_mtp_checkpoint`: refuse an MTP request on a checkpoint without a head
  (the config field, or its ``model.mtp.*`` tensors read from safetensors headers)
  before anything is loaded or allocated;
* :func:`mtp_draft_config`: vLLM's draft config (``inkling_mtp``, architecture
  :data:`MTP_ARCHITECTURE`) for either layout (vLLM 0.32 converts only the release
  layout);
* ``InklingMTPProposer`` (:func:`proposer_class`): vLLM's multi-group MTP proposer
  with per-group block sizes, the drafter's own positions for the conv metadata, and
  the target's embedding and LM head shared with the draft model;
* :func:`install_mtp_hooks`: vLLM's draft-config override and the model runner's
  choice of proposer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from copy import copy
from pathlib import Path
from typing import Any

from inkling_model.checkpoint import missing_mtp_tensors

__all__ = [
    "MTP_ARCHITECTURE",
    "MTP_MODEL_CLASS",
    "MTP_MODEL_TYPE",
    "MtpHead",
    "MtpRefused",
    "check_mtp_checkpoint",
    "install_mtp_hooks",
    "mtp_draft_config",
    "mtp_head",
    "proposer_class",
    "uses_inkling_mtp",
]

#: The draft architecture vLLM's speculative config names for Inkling MTP heads.
MTP_ARCHITECTURE = "InklingMTPModel"
#: This package's class for it.
MTP_MODEL_CLASS = "inkling_vllm.mtp:InklingMTP"
#: vLLM's model type of an Inkling MTP draft config.
MTP_MODEL_TYPE = "inkling_mtp"
_RELEASE_TYPES = ("inkling_mm_model", "inkling_model")
_TRANSFORMERS_TYPES = ("inkling_text", "inkling")
_SLIDING = "hybrid_sliding"


class MtpRefused(ValueError):
    """Speculative decoding with ``method="mtp"`` was asked of a checkpoint without
    (a complete) MTP head."""


@dataclasses.dataclass(frozen=True)
class MtpHead:
    """The MTP head a checkpoint declares.

    ``num_layers``: depth blocks (``num_nextn_predict_layers`` /
    ``num_mtp_layers``; 0: no head); ``local_layer_ids``: depths whose attention is
    sliding-window; ``chain_hidden_post_norm``: a shared ``chain_norm`` follows every
    depth."""

    num_layers: int
    local_layer_ids: tuple[int, ...] = ()
    chain_hidden_post_norm: bool = False

    def layer_type(self, depth: int) -> str:
        """``"hybrid_sliding"`` or ``"hybrid"`` (global) for depth block ``depth``."""
        return _SLIDING if depth in self.local_layer_ids else "hybrid"


def _get(config: Any, key: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def mtp_head(config: Any) -> MtpHead:
    """The MTP head declared by a checkpoint config (config.json as a dict, or a
    transformers / vLLM config object), in either layout: the release layout's
    top-level ``mtp_config`` (``num_nextn_predict_layers``, ``local_layer_ids``,
    ``chain_hidden_post_norm``) or its text config's ``num_nextn_predict_layers``;
    transformers' ``num_mtp_layers``, ``mtp_local_layer_ids``, ``chain_hidden_post_norm``;
    vLLM's draft config (``num_nextn_predict_layers``, ``local_layer_ids``)."""
    text = _get(config, "text_config")
    sources = [config] + ([text] if text is not None else [])
    mtp = _get(config, "mtp_config")
    mtp = mtp if isinstance(mtp, Mapping) else {}

    def first(*keys: str) -> Any:
        for key in keys:
            if mtp.get(key) is not None:
                return mtp[key]
        for source in sources:
            for key in keys:
                value = _get(source, key)
                if value is not None:
                    return value
        return None

    layers = first("num_nextn_predict_layers", "num_mtp_layers")
    # a release text config's own local_layer_ids are the main model's sliding layers:
    # the MTP depths' come from mtp_config (or transformers' mtp_local_layer_ids, or a
    # draft config this module made)
    local = mtp.get("local_layer_ids")
    if local is None:
        local = first("mtp_local_layer_ids")
    if local is None and _get(config, "model_type") == MTP_MODEL_TYPE:
        local = _get(config, "local_layer_ids")
    chain = first("chain_hidden_post_norm")
    return MtpHead(
        num_layers=int(layers or 0),
        local_layer_ids=tuple(int(i) for i in (local or ())),
        chain_hidden_post_norm=bool(chain),
    )


def _stored_names(folder: Path) -> list[str] | None:
    """Tensor names of a local checkpoint folder (safetensors headers only), or
    ``None`` when the folder holds no safetensors files."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    names: list[str] = []
    for file in files:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        names += [k for k in header if k != "__metadata__"]
    return names


def check_mtp_checkpoint(config: Any, folder: str | Path | None = None, num_speculative_tokens: int | None = None) -> MtpHead:
    """Refuse a speculative-decoding request with ``method="mtp"`` on a checkpoint
    without an MTP head, before anything is loaded or allocated; returns the head.

    Raises :class:`MtpRefused` naming the missing config
    field (``num_nextn_predict_layers`` in ``mtp_config`` for the release layout,
    ``num_mtp_layers`` for transformers' format) or, for a local ``folder``, the
    ``model.mtp.*`` tensors the depth blocks need that its safetensors files lack
    (only the depths ``num_speculative_tokens`` drafts use are required)."""
    head = mtp_head(config)
    model_type = _get(config, "model_type")
    if head.num_layers < 1:
        field = (
            "num_mtp_layers" if model_type in _TRANSFORMERS_TYPES
            else "mtp_config.num_nextn_predict_layers"
        )
        raise MtpRefused(
            f"speculative decoding with method 'mtp' needs the checkpoint's multi-token-prediction "
            f"head, but its config.json declares none ({field} is missing or 0); use another "
            "speculative method (e.g. 'ngram') or a checkpoint with model.mtp.* tensors"
        )
    if folder is not None and Path(folder).is_dir():
        names = _stored_names(Path(folder))
        if names is not None:
            used = head.num_layers if not num_speculative_tokens else min(head.num_layers, num_speculative_tokens)
            missing = missing_mtp_tensors(names, used)
            if missing:
                shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
                raise MtpRefused(
                    f"speculative decoding with method 'mtp': the config declares {head.num_layers} MTP "
                    f"depth block(s) but the checkpoint lacks {len(missing)} of their tensors: {shown}"
                )
    return head


def mtp_draft_config(hf_config: Any, num_speculative_tokens: int | None = None) -> Any:
    """vLLM's draft config for an Inkling checkpoint's MTP head: ``hf_config`` (the
    target's, either layout) turned into an ``inkling_mtp`` config naming
    :data:`MTP_ARCHITECTURE` (for the release layout its text config, as vLLM 0.32
    does), after :func:`check_mtp_checkpoint` and the check of the draft gate's
    threshold (:func:`inkling_vllm.draft_gate.min_acceptance`), so either is refused
    while vLLM reads its speculative config. Other configs come back unchanged."""
    from .draft_gate import min_acceptance

    model_type = _get(hf_config, "model_type")
    if model_type not in _RELEASE_TYPES + _TRANSFORMERS_TYPES:
        return hf_config
    min_acceptance()
    folder = getattr(hf_config, "_name_or_path", None) or getattr(hf_config, "name_or_path", None)
    head = check_mtp_checkpoint(hf_config, folder, num_speculative_tokens)
    draft = getattr(hf_config, "text_config", None) if model_type in _RELEASE_TYPES else None
    draft = draft if draft is not None else hf_config
    draft.model_type = MTP_MODEL_TYPE
    draft.update({
        "n_predict": head.num_layers,
        "num_nextn_predict_layers": head.num_layers,
        "chain_hidden_post_norm": head.chain_hidden_post_norm,
        "local_layer_ids": list(head.local_layer_ids),
        "architectures": [MTP_ARCHITECTURE],
    })
    return draft


# --- the proposer ------------------------------------------------------------------
def _proposer_base() -> type:
    from vllm.v1.spec_decode.step3p5 import Step3p5MTPProposer

    return Step3p5MTPProposer


def _make_proposer_class() -> type:
    import torch
    from torch import nn

    base = _proposer_base()

    class InklingMTPProposer(base):  # type: ignore[misc, valid-type]
        """vLLM's drafter for :class:`InklingMTP`.

        vLLM 0.32's EAGLE proposer drives one KV-cache group; an Inkling MTP block has
        two kinds of layers (its conv state and its attention), each its own group. The
        base class (vLLM's multi-group MTP proposer, which the model runner feeds every
        group's block table and slot mapping each step) is kept, with four changes:
        each group's slot mapping for the later draft steps is computed with that
        group's own block size; the conv metadata reads the drafter's positions, not the
        target's; on CPU the attention's host copy of the sequence lengths is kept exact
        after rejected drafts shortened them; and the target's embedding and LM head are
        shared through :meth:`InklingMTP.attach_target`. A step given no drafts runs
        only the drafter's first forward (:meth:`propose`). vLLM's warm-up and capture
        runs (:meth:`dummy_run`) run every depth block, so each compiles and has its
        graphs captured at start-up.
        """

        def initialize_attn_backend(self, kv_cache_config: Any, kernel_block_sizes: list[int] | None = None) -> None:
            super().initialize_attn_backend(kv_cache_config, kernel_block_sizes)
            self._group_block_sizes = {
                g.kv_cache_group_id: int(g.kv_cache_spec.block_size) for g in self.draft_attn_groups
            }

        def _update_positions_dependent_metadata(
            self, positions: torch.Tensor, common_attn_metadata: Any, batch_size: int, input_batch_size: int,
            block_size: int,
        ) -> torch.Tensor:
            from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

            old = positions[0] if self.uses_mrope else positions
            exceeds = old + 1 >= self.max_model_len
            # the primary group's slots (and positions, seq_lens) through vLLM's own step
            primary = self.kv_cache_gid
            positions = super(base, self)._update_positions_dependent_metadata(
                positions, common_attn_metadata, batch_size, input_batch_size,
                self._group_block_sizes.get(primary, block_size),
            )
            self._per_group_slot_mappings[primary] = common_attn_metadata.slot_mapping
            new = positions[0] if self.uses_mrope else positions
            for group in self.draft_attn_groups:
                gid = group.kv_cache_group_id
                if gid == primary:
                    continue
                table = self._per_group_block_tables.get(gid)
                if table is None:
                    continue
                size = self._group_block_sizes[gid]
                index = (new // size).clamp_(max=table.shape[1] - 1).to(torch.long)
                blocks = table[:batch_size].gather(1, index.unsqueeze(1)).squeeze(1)
                slots = blocks.to(torch.int64) * size + new % size
                slots.masked_fill_(exceeds, PADDING_SLOT_ID)
                buffer = self._slot_mapping_buffer_for(gid)
                buffer[:batch_size].copy_(slots)
                if input_batch_size > batch_size:
                    buffer[batch_size:input_batch_size].fill_(PADDING_SLOT_ID)
                self._per_group_slot_mappings[gid] = buffer[:batch_size]
            return positions

        def build_per_group_and_layer_attn_metadata(
            self, common_attn_metadata: Any, draft_index: int = 0
        ) -> tuple[list[object], dict[str, object]]:
            cm = copy(common_attn_metadata)
            # the runner's positions buffer holds the target's rows; later draft steps
            # advance the drafter's own (the conv metadata reads cm.positions)
            cm.positions = self.positions
            if cm.seq_lens.device.type == "cpu":
                # vLLM's host copy of the lengths is an upper bound once rejected drafts
                # shortened them; the attention's host path needs them exact (on CPU the
                # copy costs no device sync)
                cm.seq_lens_cpu_upper_bound = cm.seq_lens.clone()
            return super().build_per_group_and_layer_attn_metadata(cm, draft_index)

        def propose(self, num_speculative_tokens: int, *args: Any, **kwargs: Any) -> torch.Tensor:
            if num_speculative_tokens != 0:
                return super().propose(num_speculative_tokens, *args, **kwargs)
            # A step the scheduler gave no drafts (its dynamic draft count, or
            # inkling_vllm.draft_gate): the first forward still runs, writing the
            # drafter's KV cache and conv state for the step's tokens, so drafting can
            # resume later; its LM head and sampling are skipped. (vLLM 0.32's base
            # class would draft one token here.)
            def no_draft(hidden: torch.Tensor, *_: Any, **__: Any) -> tuple[torch.Tensor, None]:
                return torch.zeros(hidden.shape[0], dtype=torch.long, device=hidden.device), None

            self._sample_draft_tokens_for_step = no_draft
            try:
                drafts = super().propose(1, *args, **kwargs)
            finally:
                del self._sample_draft_tokens_for_step
            return drafts[:, :0]

        def dummy_run(self, num_tokens: int, *args: Any, **kwargs: Any) -> None:
            # vLLM's base runs the draft model without a draft step index (its depth 0);
            # a compiled depth block first run while serving would compile then, and
            # its graphs, never captured, could not be replayed
            for depth in range(len(self.model.layers)):
                with self.model.pinned_depth(depth):
                    super().dummy_run(num_tokens, *args, **kwargs)

        def _maybe_share_embeddings(self, target_language_model: nn.Module) -> None:
            self.model.attach_target(target_language_model)

        def _maybe_share_lm_head(self, target_language_model: nn.Module) -> None:
            self.model.attach_target(target_language_model)
            self._share_mtp_indices = False

    return InklingMTPProposer


@functools.cache
def proposer_class() -> type:
    """:class:`InklingMTPProposer` (built on first use: its vLLM base class is
    imported only by the processes that draft)."""
    return _make_proposer_class()


def __getattr__(name: str) -> Any:
    if name == "InklingMTPProposer":
        return proposer_class()
    raise AttributeError(name)


# --- hooks into vLLM ---------------------------------------------------------------
def uses_inkling_mtp(vllm_config: Any) -> bool:
    """Whether the engine drafts with an Inkling MTP head (``method="mtp"`` and a draft
    config this module made)."""
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is None or getattr(speculative, "method", None) != "mtp":
        return False
    draft = getattr(speculative, "draft_model_config", None)
    architectures = getattr(getattr(draft, "hf_config", None), "architectures", None) or []
    return MTP_ARCHITECTURE in architectures


def install_mtp_hooks() -> bool:
    """Make vLLM 0.32 draft with :class:`InklingMTP` (idempotent): its speculative
    config turns Inkling checkpoints of either layout into the MTP draft config (and
    refuses one without a head, :func:`check_mtp_checkpoint`), and its model runner
    drafts for such engines with :class:`InklingMTPProposer`, whose drafts vLLM's
    scheduler pauses while they are mostly rejected
    (:class:`inkling_vllm.draft_gate.DraftGate`). Returns False where a hook point is
    missing (another vLLM version): MTP then stays vLLM's own."""
    try:
        from vllm.config.speculative import SpeculativeConfig
    except ImportError:
        return False
    original = SpeculativeConfig.__dict__.get("hf_config_override")
    function = getattr(original, "__func__", original)
    if function is None:
        return False
    if not getattr(function, "_inkling_mtp", False):

        @functools.wraps(function)
        def hf_config_override(hf_config: Any) -> Any:
            if _get(hf_config, "model_type") in _RELEASE_TYPES + _TRANSFORMERS_TYPES:
                return mtp_draft_config(hf_config)
            return function(hf_config)

        hf_config_override._inkling_mtp = True  # type: ignore[attr-defined]
        SpeculativeConfig.hf_config_override = staticmethod(hf_config_override)
    from .draft_gate import install_draft_gate_hook

    if not _install_runner_choice_hook() or not install_draft_gate_hook():
        return False
    return _install_runner_hook()


#: vLLM's switch between its model runners (unset: V2 wherever V2 supports the engine).
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def _install_runner_choice_hook() -> bool:
    """Serve MTP drafting engines with vLLM's V1 GPU model runner.

    vLLM 0.32 picks its V2 model runner on CUDA wherever V2 supports the engine; V2
    drafts through its own speculators, which load a draft model by vLLM's EAGLE
    conventions and know nothing of :class:`InklingMTPProposer` (the multi-group conv
    metadata, the shared embedding and LM head). An engine drafting with an Inkling
    MTP head therefore runs the V1 runner, where the proposer is installed; asking
    for V2 (``VLLM_USE_V2_MODEL_RUNNER=1``, or a feature vLLM serves only there) is
    refused at configuration. Returns False where vLLM has no such property."""
    try:
        from vllm.config import VllmConfig
    except ImportError:
        return False
    prop = VllmConfig.__dict__.get("use_v2_model_runner")
    if not isinstance(prop, property) or prop.fget is None:
        return False
    if getattr(prop.fget, "_inkling_mtp", False):
        return True
    original = prop.fget

    @functools.wraps(original)
    def use_v2_model_runner(self: Any) -> bool:
        if not uses_inkling_mtp(self):
            return bool(original(self))
        import vllm.envs as envs

        asks = [f"{V2_RUNNER_ENV}=1"] if envs.VLLM_USE_V2_MODEL_RUNNER is True else []
        # features vLLM serves only on V2 (it switches to V2 for them)
        asks += [name for name, value in (
            ("hisparse attention", getattr(getattr(self, "attention_config", None), "hisparse_config", None)),
            ("watermarking", getattr(self, "watermark_config", None)),
        ) if value is not None]
        if asks:
            raise ValueError(
                f"Inkling MTP drafting runs on vLLM's V1 GPU model runner, but {' and '.join(asks)} needs V2 "
                f"(whose speculators cannot drive the Inkling MTP head); drop it, or draft with another method"
            )
        return False

    use_v2_model_runner._inkling_mtp = True  # type: ignore[attr-defined]
    VllmConfig.use_v2_model_runner = property(use_v2_model_runner)  # type: ignore[method-assign,assignment]
    return True


def _install_runner_hook() -> bool:
    try:
        from vllm.v1.worker import gpu_model_runner

        _proposer_base()
    except Exception:  # CPU builds may not import the CUDA runner; other versions lack the base
        return False
    runner_cls = gpu_model_runner.GPUModelRunner
    original = runner_cls.__init__
    if getattr(original, "_inkling_mtp", False):
        return True

    @functools.wraps(original)
    def __init__(self: Any, vllm_config: Any, device: Any, *args: Any, **kwargs: Any) -> None:
        original(self, vllm_config, device, *args, **kwargs)
        if hasattr(self, "drafter") and uses_inkling_mtp(vllm_config):
            self.drafter = proposer_class()(vllm_config, device, self)

    __init__._inkling_mtp = True  # type: ignore[attr-defined]
    runner_cls.__init__ = __init__
    return True
