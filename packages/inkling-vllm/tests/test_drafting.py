"""The MTP drafter's config side (no engine): which head a config declares, the draft
config vLLM gets, and the refusal of a checkpoint without (a complete) head."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from inkling_vllm.drafting import (
    MTP_ARCHITECTURE,
    MTP_MODEL_TYPE,
    MtpHead,
    MtpRefused,
    check_mtp_checkpoint,
    mtp_draft_config,
    mtp_head,
)

RELEASE: dict[str, Any] = {
    "model_type": "inkling_mm_model",
    "text_config": {"local_layer_ids": [0, 2], "num_nextn_predict_layers": 2},
    "mtp_config": {"num_nextn_predict_layers": 2, "local_layer_ids": [1], "chain_hidden_post_norm": True},
}
BLOCK = ["attn_norm.weight", "mlp_norm.weight", "attn.wq_du.weight", "attn.wk_dv.weight", "attn.wv_dv.weight",
         "attn.wr_du.weight", "attn.wo_ud.weight", "attn.q_norm.weight", "attn.k_norm.weight",
         "attn.k_sconv.weight", "attn.v_sconv.weight", "attn.rel_logits_proj.proj", "attn_sconv.weight",
         "mlp_sconv.weight", "mlp.w13_dn.weight", "mlp.w2_md.weight", "mlp.global_scale"]


def test_release_head_comes_from_mtp_config_not_the_main_models_local_layers() -> None:
    assert mtp_head(RELEASE) == MtpHead(2, (1,), True)
    assert mtp_head(RELEASE).layer_type(1) == "hybrid_sliding" and mtp_head(RELEASE).layer_type(0) == "hybrid"
    text_only = {"model_type": "inkling_model", "num_nextn_predict_layers": 1, "local_layer_ids": [0, 2]}
    assert mtp_head(text_only) == MtpHead(1, (), False)


def test_transformers_and_draft_config_fields() -> None:
    tf = {"model_type": "inkling_text", "num_mtp_layers": 3, "mtp_local_layer_ids": [2],
          "chain_hidden_post_norm": True}
    assert mtp_head(tf) == MtpHead(3, (2,), True)
    draft = {"model_type": MTP_MODEL_TYPE, "num_nextn_predict_layers": 1, "local_layer_ids": [0]}
    assert mtp_head(draft) == MtpHead(1, (0,), False)
    assert mtp_head({"model_type": "inkling_text"}) == MtpHead(0)


@pytest.mark.parametrize(
    ("config", "field"),
    [({"model_type": "inkling_text"}, "num_mtp_layers"),
     ({"model_type": "inkling_mm_model", "text_config": {}}, "mtp_config.num_nextn_predict_layers"),
     ({"model_type": "inkling_text", "num_mtp_layers": 0}, "num_mtp_layers")],
)
def test_no_head_is_refused_naming_the_field(config: dict[str, Any], field: str) -> None:
    with pytest.raises(MtpRefused, match=field.replace(".", r"\.")):
        check_mtp_checkpoint(config)


def _folder(tmp_path: Path, depths: int, drop: tuple[str, ...] = ()) -> Path:
    names = [f"model.mtp.layers.{j}.{n}" for j in range(depths)
             for n in ["hidden_norm.weight", "embed_norm.weight", "input_proj.weight"]
             + [f"transformer_block.{b}" for b in BLOCK]]
    tensors = {n: torch.zeros(1) for n in names if n not in drop}
    tensors["model.llm.embed.weight"] = torch.zeros(1)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(RELEASE))
    return tmp_path


def test_missing_head_tensors_are_named(tmp_path: Path) -> None:
    gone = "model.mtp.layers.1.transformer_block.attn.wq_du.weight"
    folder = _folder(tmp_path, 2, drop=(gone,))
    with pytest.raises(MtpRefused, match=gone.replace(".", r"\.")):
        check_mtp_checkpoint(RELEASE, folder)
    # one draft token uses depth 0 only: the head is complete for it
    assert check_mtp_checkpoint(RELEASE, folder, num_speculative_tokens=1).num_layers == 2


def test_a_complete_head_passes(tmp_path: Path) -> None:
    assert check_mtp_checkpoint(RELEASE, _folder(tmp_path, 2)) == MtpHead(2, (1,), True)


def test_draft_config_for_transformers_layout() -> None:
    from transformers import InklingTextConfig

    config = InklingTextConfig(num_mtp_layers=1, mtp_local_layer_ids=[0])
    draft = mtp_draft_config(config)
    assert draft.model_type == MTP_MODEL_TYPE and draft.architectures == [MTP_ARCHITECTURE]
    assert draft.num_nextn_predict_layers == 1 and draft.local_layer_ids == [0]
    with pytest.raises(MtpRefused, match="num_mtp_layers"):
        mtp_draft_config(InklingTextConfig())


def test_other_models_pass_through_unchanged() -> None:
    class Other:
        model_type = "llama"

    other = Other()
    assert mtp_draft_config(other) is other


def test_mtp_engines_run_the_v1_model_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's V2 GPU runner drafts through speculators that cannot drive the Inkling
    MTP head: an engine drafting with one is served by the V1 runner (where the
    plugin's proposer is); other engines keep vLLM's choice; asking for V2 (by the
    environment or by a feature vLLM serves only there) is refused."""
    from types import SimpleNamespace

    from vllm.config import VllmConfig

    from inkling_vllm.drafting import V2_RUNNER_ENV, install_mtp_hooks

    assert install_mtp_hooks() in (True, False)  # the runner hook needs a GPU build's runner
    choose = VllmConfig.use_v2_model_runner.fget
    assert getattr(choose, "_inkling_mtp", False)
    draft = SimpleNamespace(hf_config=SimpleNamespace(architectures=[MTP_ARCHITECTURE]))

    def config(method: str, draft_config: Any = draft, **extra: Any) -> SimpleNamespace:
        return SimpleNamespace(speculative_config=SimpleNamespace(method=method, draft_model_config=draft_config),
                               attention_config=SimpleNamespace(hisparse_config=None), **extra)

    for value in (None, "0"):
        if value is None:
            monkeypatch.delenv(V2_RUNNER_ENV, raising=False)
        else:
            monkeypatch.setenv(V2_RUNNER_ENV, value)
        assert choose(config("mtp")) is False
    with pytest.raises(ValueError, match="watermarking needs V2"):
        choose(config("mtp", watermark_config=object()))
    monkeypatch.setenv(V2_RUNNER_ENV, "1")
    with pytest.raises(ValueError, match=f"{V2_RUNNER_ENV}=1 needs V2"):
        choose(config("mtp"))
    # any other engine reaches vLLM's own rule (here: the environment's explicit choice)
    assert choose(config("ngram", None)) is True
    monkeypatch.setenv(V2_RUNNER_ENV, "0")
    assert choose(config("ngram", None)) is False
