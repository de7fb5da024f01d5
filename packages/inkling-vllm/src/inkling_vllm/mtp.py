"""Inkling's multi-token-prediction (MTP) head as vLLM's drafter (``method="mtp"``).

Released Inkling checkpoints carry an MTP head: ``num_nextn_predict_layers`` depth
blocks under ``model.mtp.layers.{j}.*`` (both checkpoint layouts; the tensor names are
mapped by ``inkling_model.checkpoint.iter_mtp_weights``). Depth ``j`` drafts the
token after next from the previous hidden state ``h`` and the next token's embedding
``e`` (the target's embedding table and its ``embed_norm``)::

    x = input_proj(cat(hidden_norm(h), embed_norm(e)))     (2H -> H)
    y = transformer_block(x)        (one Inkling decoder layer, dense MLP: four short
                                     convs and relative-logit attention, global or
                                     sliding per ``mtp_local_layer_ids``)
    y = chain_norm(y)               (when ``chain_hidden_post_norm``)
    logits = the target's compute_logits(y)   (shared LM head, muP scale, padded
                                               vocabulary masked)

Draft step ``s`` runs depth ``s % depths`` (vLLM's in-tree Inkling MTP does the
same) and feeds its ``y`` to the next step as ``h``. The first step sees the target's
last hidden states of every verified position (vLLM's padded drafter batch), so each
depth block's layers keep their state like the target's: the block's conv inputs by
absolute position in its own paged conv-state cache (:class:`InklingConvStateLayer`)
and its keys/values in its own attention KV cache; a rejected draft's rows are
overwritten by the next step, never read.

The draft model is :class:`InklingMTP` (registered as :data:`MTP_ARCHITECTURE`); the
engine side (draft config, refusal of a checkpoint without a head, the proposer and
the hooks into vLLM) is :mod:`inkling_vllm.drafting`.

In an engine that compiles the target (vLLM's ``DYNAMO_TRACE_ONCE`` or
``VLLM_COMPILE`` mode: :func:`compiles_draft_model`) every depth block is compiled on
its own (:func:`compiled_depth_class`: one class per depth, so vLLM's compile caches,
keyed by the forward's name and the model tag, keep each depth's graph apart), with
the target's graph-splitting ops; the draft model's Python forward picks the depth for
``spec_step_idx`` outside any compiled code (vLLM's compiled forwards keep no guards,
so a choice traced inside one would stay frozen at the first trace). On CUDA vLLM
captures piecewise graphs of every depth (:class:`InklingMTPProposer` runs each depth
in vLLM's warm-up and capture runs), and inductor fuses the blocks' norms and
activation like the target's. Where the engine compiles only the target
(``STOCK_TORCH_COMPILE``) the draft model runs eagerly, its norms and activation on
the kernels of an uncompiled engine (:func:`use_fused_custom_ops`,
:func:`eager_ir_priority`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import types
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from vllm.compilation import backends as compile_backends
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
)
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear

from inkling_cache import InklingTextSpec
from inkling_model.checkpoint import iter_mtp_weights

from .drafting import MTP_ARCHITECTURE, MtpHead, mtp_head
from .model import (
    InklingDecoderLayer,
    UnsupportedCheckpoint,
    _conv_padding,
    _fused_tails,
    _join,
    _raw_config,
    check_supported_config,
    load_layer_tensor,
    refuse_unfilled,
    served_spec,
)

__all__ = [
    "MTP_ARCHITECTURE",
    "InklingMTP",
    "InklingMTPDepth",
    "compiled_depth_class",
    "compiles_draft_model",
    "draft_depths",
    "eager_ir_priority",
    "use_fused_custom_ops",
]

logger = logging.getLogger(__name__)


# --- the draft model ---------------------------------------------------------------
def _block_spec(spec: InklingTextSpec, head: MtpHead, depths: int) -> InklingTextSpec:
    """The text spec with the MTP depth blocks as its decoder layers (dense MLPs)."""
    return dataclasses.replace(
        spec,
        num_hidden_layers=depths,
        layer_types=tuple(head.layer_type(j) for j in range(depths)),
        mlp_layer_types=("dense",) * depths,
    )


def _fixed_norm(hidden_size: int, eps: float) -> RMSNorm:
    """An RMSNorm with unit weight held as a buffer (no checkpoint tensor): the fused
    sublayer tail always normalises its sum, the MTP block's output without a
    ``chain_norm`` is the sum itself."""
    norm = RMSNorm(hidden_size, eps=eps)
    weight = torch.ones_like(norm.weight.data)
    del norm.weight
    norm.register_buffer("weight", weight, persistent=False)
    return norm


class InklingMTPDepth(nn.Module):
    """One MTP depth block: both inputs RMS-normed, concatenated, projected
    ``2H -> H``, then one Inkling decoder layer with its own conv state and KV cache.

    ``forward(input_ids, positions, hidden_states, inputs_embeds=None)`` runs the block
    for one draft step (``[T]`` next tokens or ``[T, H]`` their embeddings, ``[T, H]``
    previous hidden states) and returns ``[T, H]``. The embedding, the output norm and
    the TP layout are the owning :class:`InklingMTP`'s. The draft model builds each
    depth as :func:`compiled_depth_class` (``depth``)."""

    def __init__(self, spec: InklingTextSpec, depth: int, quant_config: Any, prefix: str, padding: str,
                 fused: bool) -> None:
        super().__init__()
        self._owner: list[InklingMTP] = []  # not a submodule: the draft model holding this block
        hidden = spec.hidden_size
        self.hidden_norm = RMSNorm(hidden, eps=spec.rms_norm_eps)
        self.embed_norm = RMSNorm(hidden, eps=spec.rms_norm_eps)
        self.input_proj = ReplicatedLinear(2 * hidden, hidden, bias=False, quant_config=quant_config,
                                           prefix=f"{prefix}.input_proj")
        self.transformer_block = InklingDecoderLayer(spec, depth, quant_config, f"{prefix}.transformer_block",
                                                     padding, fused)

    def combine(self, previous_hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """``input_proj(cat(hidden_norm(h), embed_norm(e)))``: ``[T, H]`` each -> ``[T, H]``."""
        both = torch.cat([self.hidden_norm(previous_hidden), self.embed_norm(embeds)], dim=-1)
        out, _ = self.input_proj(both)
        return out

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        owner = self._owner[0]
        if inputs_embeds is None:
            assert input_ids is not None  # vLLM passes one of the two
            inputs_embeds = owner.embed_input_ids(input_ids)
        block = self.transformer_block
        x = self.combine(hidden_states, inputs_embeds)
        normed = block.input_layernorm(x)
        tp_size = get_tensor_model_parallel_world_size()
        sharded = owner.fused and tp_size > 1
        if sharded:  # the fused tails keep the residual stream sharded by columns
            x = x.chunk(tp_size, dim=-1)[get_tensor_model_parallel_rank()].contiguous()
        chain_norm = owner.chain_norm
        out, out_normed = block(positions, x, normed, chain_norm if chain_norm is not None else owner.tail_norm)
        if chain_norm is not None:
            return out_normed
        return tensor_model_parallel_all_gather(out, dim=-1) if sharded else out


#: The dimensions of a depth block's inputs that vary between steps (token rows).
_DEPTH_DYNAMIC_DIMS = {"input_ids": 0, "positions": 0, "hidden_states": 0, "inputs_embeds": 0}


@functools.cache
def compiled_depth_class(depth: int) -> type[InklingMTPDepth]:
    """:class:`InklingMTPDepth` for depth block ``depth`` under vLLM's compile decorator.

    One class per depth, each with its own ``forward`` function object named
    ``InklingMTPDepth{depth}.forward``: vLLM keys its ahead-of-time compile cache by the
    forward's qualified name and the engine config, so instances of one class would
    share one saved graph, and with it the first depth's attention and conv-state layer
    names. (The model tag, which names the inductor cache, is set per depth by
    :class:`InklingMTP`.) Compiled where vLLM compiles the models itself; eager
    elsewhere."""
    base = InklingMTPDepth.forward
    forward = types.FunctionType(base.__code__, base.__globals__, "forward", base.__defaults__, base.__closure__)
    forward.__kwdefaults__ = base.__kwdefaults__
    forward.__annotations__ = dict(base.__annotations__)
    forward.__doc__ = base.__doc__
    name = f"InklingMTPDepth{depth}"
    forward.__qualname__ = f"{name}.forward"
    cls = type(name, (InklingMTPDepth,), {"forward": forward, "__module__": __name__, "__qualname__": name})
    return support_torch_compile(dynamic_arg_dims=_DEPTH_DYNAMIC_DIMS)(cls)


def draft_depths(vllm_config: VllmConfig, head: MtpHead | None = None) -> int:
    """How many depth blocks :class:`InklingMTP` builds in ``vllm_config``'s engine:
    ``min(depths, num_speculative_tokens)`` (every depth where the speculative config
    names no count; 0 for a checkpoint without a head). ``head``: the checkpoint's
    head, where the caller has read it already."""
    if head is None:
        model_config = vllm_config.model_config
        raw = _raw_config(model_config)
        head = mtp_head(raw if raw is not None else model_config.hf_config)
    speculative = getattr(vllm_config, "speculative_config", None)
    num_spec = int(getattr(speculative, "num_speculative_tokens", 0) or 0)
    return min(head.num_layers, num_spec) if num_spec else head.num_layers


def compiles_draft_model(vllm_config: VllmConfig) -> bool:
    """Whether vLLM compiles :class:`InklingMTP`'s depth blocks in ``vllm_config``'s
    engine: where the engine compiles its models itself (vLLM's ``DYNAMO_TRACE_ONCE``
    or ``VLLM_COMPILE``; under ``STOCK_TORCH_COMPILE`` the model runner compiles the
    target alone)."""
    from vllm.config.compilation import CompilationMode

    mode = vllm_config.compilation_config.mode
    return mode not in (None, CompilationMode.NONE, CompilationMode.STOCK_TORCH_COMPILE)


class InklingMTP(nn.Module):
    """vLLM draft model for an Inkling checkpoint's MTP head (both layouts).

    Built from the checkpoint's own config.json (``served_spec``) and its MTP fields
    (:func:`mtp_head`); only the depths the drafts use (``min(depths,
    num_speculative_tokens)``) are built and loaded. The embedding and the LM head are
    the target model's (:meth:`attach_target`, called by :class:`InklingMTPProposer`).

    ``forward(input_ids, positions, hidden_states, inputs_embeds=None,
    spec_step_idx=0)``: ``hidden_states`` ``[T, H]`` the previous hidden state of each
    row (the target's for the first draft step), ``input_ids`` ``[T]`` the next tokens;
    returns ``[T, H]``, the logits input and the next step's ``hidden_states``.

    The forward runs depth block ``spec_step_idx % depths`` (:meth:`pinned_depth`
    overrides it for vLLM's warm-up and capture runs, which pass no step). In an engine
    that compiles (:func:`compiles_draft_model`) each block is compiled on its own
    (:func:`compiled_depth_class`), like the target (on CUDA vLLM captures piecewise
    graphs of each): its RMSNorms and activation stay in the torch-native forms
    inductor fuses. Where the engine compiles only the target, the blocks run eagerly,
    their RMSNorms and activation on the kernels of an uncompiled engine
    (:func:`use_fused_custom_ops`, :func:`eager_ir_priority`) rather than as
    torch-native forms launched op by op.
    """

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        model_config = vllm_config.model_config
        raw = _raw_config(model_config)
        spec = served_spec(vllm_config, raw)
        check_supported_config(spec)
        head = mtp_head(raw if raw is not None else model_config.hf_config)
        if head.num_layers < 1:
            raise UnsupportedCheckpoint(f"{getattr(model_config, 'model', '')}: the checkpoint declares no MTP head")
        depths = draft_depths(vllm_config, head)
        self.head = head
        self.spec = _block_spec(spec, head, depths)
        self.fused = _fused_tails(vllm_config, raw)
        padding = _conv_padding(vllm_config, raw)
        quant_config = vllm_config.quant_config
        blocks = []
        # depth 0 keeps the drafter's model tag (vLLM's "eagle_head"); later depths get
        # their own, which names their compile cache
        tag = compile_backends.model_tag
        for j in range(depths):
            with compile_backends.set_model_tag(f"{tag}_depth{j}") if j else nullcontext():
                block = compiled_depth_class(j)(
                    spec=self.spec, depth=j, quant_config=quant_config, prefix=_join(prefix, f"model.mtp.layers.{j}"),
                    padding=padding, fused=self.fused, vllm_config=vllm_config,
                )
            block._owner[:] = [self]
            blocks.append(block)
        self.layers = nn.ModuleList(blocks)
        self._pinned_depth: int | None = None
        eps = spec.rms_norm_eps
        self.chain_norm = RMSNorm(spec.hidden_size, eps=eps) if head.chain_hidden_post_norm else None
        self.tail_norm = _fixed_norm(spec.hidden_size, eps)
        self._target: list[nn.Module] = []  # not a submodule: its parameters are the target's
        _share_conv_pages(vllm_config)
        self._eager_priority: Any | None = None
        if compiles_draft_model(vllm_config):
            # compiled like the target: inductor fuses the torch-native forms
            logger.info("inkling-vllm: the MTP draft model's %d depth blocks are compiled with the target", depths)
            return
        # run eagerly: its norms and activation take the kernels an uncompiled engine
        # would, not the torch-native forms a compiled engine leaves to inductor
        switched = use_fused_custom_ops(self)
        self._eager_priority = eager_ir_priority(vllm_config)
        if switched or self._eager_priority is not None:
            logger.info("inkling-vllm: the MTP draft model (%d depths) runs eagerly in a compiled engine: %d custom "
                        "ops on their kernels, IR ops by %s", depths, switched, self._eager_priority)

    # -- the target's embedding and LM head ----------------------------------------
    def attach_target(self, target: nn.Module) -> None:
        """Share ``target``'s (an ``InklingForCausalLM``) embedding, ``embed_norm``
        and LM head."""
        self._target[:] = [target]

    @property
    def target(self) -> Any:
        if not self._target:
            raise RuntimeError("InklingMTP: attach_target() has not been called (vLLM's proposer does it)")
        return self._target[0]

    def embed_input_ids(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The target's normed embedding of ``input_ids``: ``[T]`` -> ``[T, H]``."""
        return self.target.embed_input_ids(input_ids)

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor | None:
        """The target's logits of ``hidden_states`` (shared LM head, muP scale, padded
        vocabulary masked)."""
        return self.target.compute_logits(hidden_states)

    def get_top_tokens(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        """Greedy draft tokens ``[T]``."""
        logits = self.compute_logits(hidden_states, spec_step_idx)
        assert logits is not None
        return logits.argmax(dim=-1)

    @contextmanager
    def pinned_depth(self, depth: int) -> Iterator[None]:
        """Run depth block ``depth`` whatever ``spec_step_idx`` the forward is given
        (vLLM's warm-up and capture runs of a drafter pass none)."""
        if not 0 <= depth < len(self.layers):
            raise ValueError(f"InklingMTP: depth {depth} is not built (depths 0..{len(self.layers) - 1})")
        self._pinned_depth = depth
        try:
            yield
        finally:
            self._pinned_depth = None

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
        spec_step_idx: int = 0,
        **kwargs: object,
    ) -> torch.Tensor:
        pinned = self._pinned_depth
        block = self.layers[pinned if pinned is not None else spec_step_idx % len(self.layers)]
        priority = self._eager_priority
        if priority is None:
            return block(input_ids, positions, hidden_states, inputs_embeds)
        with priority.set_priority():
            return block(input_ids, positions, hidden_states, inputs_embeds)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load the ``model.mtp.*`` tensors of the depths built (either layout; every
        other tensor belongs to the target). Returns the parameters filled; raises
        :class:`UnsupportedCheckpoint` naming what is missing or does not fit."""
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        tp_rank, tp_size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        loaded: set[str] = set()
        try:
            for depth, name, tensor in iter_mtp_weights(weights):
                if depth is None:
                    if self.chain_norm is None:
                        raise UnsupportedCheckpoint(
                            "the checkpoint holds model.mtp.chain_norm.weight but its config does not set "
                            "chain_hidden_post_norm"
                        )
                    target = "chain_norm.weight"
                elif depth >= len(self.layers):
                    continue  # a depth no draft step uses
                else:
                    target = f"layers.{depth}.{name}"
                try:
                    loaded |= load_layer_tensor(target, tensor, params, modules, tp_rank, tp_size, "InklingMTP")
                except UnsupportedCheckpoint:
                    raise
                except (AssertionError, RuntimeError, ValueError, KeyError) as exc:
                    raise UnsupportedCheckpoint(
                        f"MTP tensor {name!r} (depth {depth}) {tuple(tensor.shape)} does not fit the head built "
                        f"from the config: {exc}"
                    ) from None
        except UnsupportedCheckpoint:
            raise
        except ValueError as exc:  # the name map refuses names it has no rule for
            raise UnsupportedCheckpoint(str(exc)) from None
        refuse_unfilled(params, loaded, "MTP tensor")
        return loaded


def eager_ir_priority(vllm_config: VllmConfig) -> Any | None:
    """The IR-op priority (vLLM's ``IrOpPriorityConfig``: which kernel implements
    ``rms_norm`` and ``fused_add_rms_norm``) for a module that runs eagerly inside
    ``vllm_config``'s engine: the platform's default for the same engine without
    ``torch.compile`` (on CUDA: vLLM's fused C kernels; a compiled engine's default is
    the torch-native form, for inductor). None where nothing needs changing: the
    engine does not compile, its priority is not the platform's default (set by the
    user), or the two defaults agree (the CPU platform)."""
    from types import SimpleNamespace

    from vllm.config.compilation import CompilationMode
    from vllm.platforms import current_platform

    compilation = vllm_config.compilation_config
    if compilation.mode == CompilationMode.NONE:
        return None
    engine = vllm_config.kernel_config.ir_op_priority
    try:
        if engine != current_platform.get_default_ir_op_priority(vllm_config):
            return None  # the user's choice
        uncompiled = SimpleNamespace(
            compilation_config=SimpleNamespace(backend=compilation.backend, mode=CompilationMode.NONE))
        eager = current_platform.get_default_ir_op_priority(uncompiled)
    except AttributeError:  # a platform whose default reads more of the config
        return None
    return None if eager == engine else eager


def use_fused_custom_ops(module: nn.Module) -> int:
    """Run every vLLM custom op in ``module`` (its RMSNorms, the MLP activation) on
    the platform's fused kernel. Returns how many ops were switched.

    Under ``torch.compile`` vLLM turns its custom ops off and runs their torch-native
    forms, for inductor to fuse into the compiled graph. A draft model that runs
    eagerly there (the runner compiling the target alone) would launch each native norm's several
    elementwise kernels one by one, every step (paused steps included); the fused
    kernel is one launch.
    Ops already on (an uncompiled engine, or ``custom_ops`` naming them) are left as
    they are."""
    from vllm.model_executor.custom_op import CustomOp

    switched = 0
    for op in module.modules():
        if isinstance(op, CustomOp) and not (op._enforce_enable or type(op).enabled()):
            op._enforce_enable = True
            op._forward_method = op.dispatch_forward(compile_native=False)
            switched += 1
    return switched


def _share_conv_pages(vllm_config: VllmConfig) -> None:
    """Size the rows per block of every conv-state layer in the engine (the target's
    and the drafter's) together, so that vLLM's page unification pads no page with the
    drafter's layers added (:func:`inkling_vllm.conv_state.share_pages_without_padding`)."""
    from .attention import InklingAttentionLayer
    from .conv_state import InklingConvStateLayer, share_pages_without_padding

    context = vllm_config.compilation_config.static_forward_context
    convs = [layer for layer in context.values() if isinstance(layer, InklingConvStateLayer)]
    attention = [layer for layer in context.values() if isinstance(layer, InklingAttentionLayer)]
    share_pages_without_padding(convs, [a.get_kv_cache_spec(vllm_config).page_size_bytes for a in attention])


