"""The checkpoint-folder check of the main job and the serve command: each kind of bad
folder gets its own short message naming the problem; good folders (the tiny model,
written by transformers, in both layouts) pass. Bad tensors are made by editing a good
checkpoint written by transformers, so the expected shapes are not this package's own."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from inkling_vllm.demo.preflight import check_checkpoint_dir, format_problems, read_safetensors_shapes
from inkling_vllm.demo.tiny import REFERENCE_DIR, build_tiny_checkpoint

@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint in the release layout, with its transformers-format copy."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("preflight") / "tiny", variant="release")


@pytest.fixture
def release(tiny: Path, tmp_path: Path) -> Path:
    """A copy of the release-layout folder (without the transformers copy) to edit."""
    path = tmp_path / "release"
    shutil.copytree(tiny, path, ignore=shutil.ignore_patterns(REFERENCE_DIR))
    return path


def _edit_tensors(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def _edit_config(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    config = json.loads((path / "config.json").read_text())
    change(config)
    (path / "config.json").write_text(json.dumps(config))


def _one(problems: list[str]) -> str:
    assert len(problems) == 1, problems
    return problems[0]


def test_good_checkpoints_pass(tiny: Path) -> None:
    assert check_checkpoint_dir(tiny) == []
    assert check_checkpoint_dir(tiny / REFERENCE_DIR) == []  # transformers' layout


def test_missing_folder(tmp_path: Path) -> None:
    text = _one(check_checkpoint_dir(tmp_path / "nowhere"))
    assert "does not exist" in text and "config.json" in text
    # the caller's own advice (the main job: --model, or the tiny model)
    text = _one(check_checkpoint_dir(tmp_path / "nowhere", absent_hint="leave --model out"))
    assert text.endswith("does not exist: leave --model out.")


def test_a_file_is_not_a_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert "is a file, not a folder" in _one(check_checkpoint_dir(tmp_path / "config.json"))


def test_empty_folder(tmp_path: Path) -> None:
    text = _one(check_checkpoint_dir(tmp_path))
    assert "is empty" in text and "config.json" in text


def test_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert "has no config.json" in _one(check_checkpoint_dir(tmp_path))


def test_config_that_is_not_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{model_type: inkling")
    assert "cannot be read as JSON" in _one(check_checkpoint_dir(tmp_path))


def test_other_model_type_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    text = _one(check_checkpoint_dir(tmp_path))
    assert "'llama'" in text and "inkling_mm_model" in text and "inkling_text" in text


def test_config_without_model_type(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 128}))
    assert "gives no model_type" in _one(check_checkpoint_dir(tmp_path))


def test_invalid_inkling_config_names_the_field(release: Path) -> None:
    _edit_config(release, lambda c: c["text_config"].update(num_key_value_heads=3))
    text = _one(check_checkpoint_dir(release))
    assert "not a valid Inkling config" in text and "num_key_value_heads" in text


@pytest.mark.parametrize("key,value,fragment", [
    ("inkling_conv_state_padding", "bogus", "use 'pow2', 'none'"),
    ("inkling_conv_state_padding", 0, "padding multiple"),
    ("inkling_conv_state_padding", False, "a bool"),
    ("inkling_fused_conv_norm", "no", "must be true or false"),
    ("inkling_conv_state", "paged", "choose 'tail'"),
    ("inkling_conv_retention_tokens", -64, "non-negative whole number"),
    ("inkling_vllm_model", "plug", "choose one of auto, plugin, builtin"),
])
def test_plugin_settings_are_checked_naming_the_key(release: Path, key: str, value: object, fragment: str) -> None:
    """The plugin's own config keys, refused before any engine starts (the engine
    would refuse them only while building its layers)."""
    _edit_config(release, lambda c: c.update({key: value}))
    text = _one(check_checkpoint_dir(release))
    assert key in text and repr(value) in text and fragment in text, text


def test_plugin_settings_from_the_environment(release: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INKLING_CONV_STATE", "paged")
    monkeypatch.setenv("INKLING_VLLM_MODEL", "plug")
    problems = check_checkpoint_dir(release)
    assert len(problems) == 2 and "INKLING_CONV_STATE" in problems[0] and "INKLING_VLLM_MODEL" in problems[1]
    _edit_config(release, lambda c: c.update(inkling_conv_state="window", inkling_vllm_model="auto"))
    assert check_checkpoint_dir(release) == []  # the config keys win over the variables


def test_valid_plugin_settings_pass(release: Path) -> None:
    _edit_config(release, lambda c: c.update(inkling_conv_state_padding=8, inkling_fused_conv_norm=False,
                                             inkling_conv_state="window", inkling_conv_retention_tokens=512.0,
                                             inkling_vllm_model="plugin"))
    assert check_checkpoint_dir(release) == []


def test_folder_without_a_tokenizer(release: Path) -> None:
    for file in release.glob("tokenizer*"):
        file.unlink()
    text = _one(check_checkpoint_dir(release))
    assert "has no tokenizer" in text and "tokenizer.json" in text
    assert check_checkpoint_dir(release, tokenizer=False) == []  # the caller brings one


def test_quantised_checkpoints_are_refused_where_the_caller_runs_float32(release: Path) -> None:
    _edit_config(release, lambda c: c.update(quantization_config={"quant_method": "fp8"}))
    assert check_checkpoint_dir(release) == []
    assert "holds quantised weights" in _one(check_checkpoint_dir(release, quantised=False))


def test_header_with_a_shape_that_is_not_sizes(release: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [None, 4], "data_offsets": [0, 0]}}).encode()
    (release / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    text = _one(check_checkpoint_dir(release))
    assert "not a readable safetensors file" in text and "not a list of sizes" in text


def test_no_safetensors(release: Path) -> None:
    (release / "model.safetensors").rename(release / "pytorch_model.bin")
    text = _one(check_checkpoint_dir(release))
    assert "no *.safetensors" in text and "pytorch_model.bin" in text


def test_truncated_safetensors(release: Path) -> None:
    data = (release / "model.safetensors").read_bytes()
    (release / "model.safetensors").write_bytes(data[:100])
    assert "not a readable safetensors file" in _one(check_checkpoint_dir(release))


def test_wrong_shape_names_the_tensor_and_both_shapes(release: Path) -> None:
    import torch

    key = "model.llm.layers.1.attn.rel_logits_proj.proj"
    _edit_tensors(release, lambda t: t.update({key: torch.zeros(4, 67)}))
    problems = check_checkpoint_dir(release)
    assert f"tensor {key} has shape [4, 67], config.json implies [4, 64]." in problems[0]
    assert len(problems) == 2 and "config.json and the weights disagree" in problems[1]


def test_missing_tensor_is_named(release: Path) -> None:
    key = "model.llm.layers.2.attn.wr_du.weight"
    _edit_tensors(release, lambda t: t.pop(key))
    problems = check_checkpoint_dir(release)
    assert problems[0].startswith(f"1 tensor(s) the config implies are missing, e.g. {key} [16, 128]")


def test_unknown_tensor_is_named(release: Path) -> None:
    import torch

    _edit_tensors(release, lambda t: t.update({"model.llm.layers.0.attn.wq_du.weight_scale": torch.ones(1)}))
    problems = check_checkpoint_dir(release)
    assert "no place in the Inkling text model" in problems[0] and "weight_scale" in problems[0]


def test_config_for_another_size_is_caught_by_shapes(release: Path) -> None:
    # a valid config that does not describe these weights: every layer's widths differ
    _edit_config(release, lambda c: c["text_config"].update(hidden_size=256))
    problems = check_checkpoint_dir(release)
    assert "config.json implies" in problems[0] and "and " in problems[0]  # many tensors


def test_quantised_checkpoints_skip_the_tensor_comparison(release: Path) -> None:
    _edit_tensors(release, lambda t: t.pop("model.llm.norm.weight"))
    assert check_checkpoint_dir(release) != []
    _edit_config(release, lambda c: c.update(quantization_config={"quant_method": "fp8"}))
    assert check_checkpoint_dir(release) == []


def test_headers_are_read_without_the_weights(tiny: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(tiny / "model.safetensors"), "pt") as f:
        want = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    assert read_safetensors_shapes(tiny / "model.safetensors") == want


def test_format_problems_is_at_most_five_lines() -> None:
    text = format_problems("/x", ["a", "b", "c", "d", "e", "f"])
    assert text.splitlines() == ["error: cannot serve /x", "  a", "  b", "  c", "  d"]


def test_config_errors_are_answered_without_torch(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    code = (
        "import sys; from inkling_vllm.demo.preflight import check_checkpoint_dir; "
        f"assert check_checkpoint_dir({str(tmp_path)!r}); print(sorted(m for m in ('torch', 'vllm', 'transformers') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
