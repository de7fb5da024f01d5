"""Bad checkpoints are refused by a real vLLM engine before it allocates anything,
with a message naming the field or tensor to fix: config fields that disagree, a
missing tensor, a tensor of the wrong shape, an unknown ``model_type``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# One process tries each checkpoint; the engine core runs in-process so the
# model's exception reaches the caller unchanged. A refusal must come before the
# KV cache is allocated: the runner logs the cache size once it allocates.
TRY_LOAD = r"""
import json, sys
if __name__ == "__main__":
    from vllm import LLM
    results = {}
    for path in sys.argv[1:]:
        try:
            LLM(model=path, dtype="float32", max_model_len=256, enforce_eager=True)
            results[path] = "loaded"
        except Exception as exc:
            results[path] = f"{type(exc).__name__}: {exc}"
    print("RESULTS " + json.dumps(results))
"""


def _edit_config(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    cfg = json.loads((path / "config.json").read_text())
    change(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


#: cases refused while vLLM reads the config (before any model is built)
CONFIG_CASES = ("layer_types", "heads", "model_type")


def _cases() -> dict[str, tuple[Callable[[Path], None], tuple[str, ...]]]:
    """name -> (edit of a copy of the default tiny checkpoint, fragments the error must hold)"""
    import torch

    def short_layer_types(p: Path) -> None:
        _edit_config(p, lambda c: c.update(layer_types=c["layer_types"][:3]))

    def heads(p: Path) -> None:
        _edit_config(p, lambda c: c.update(num_key_value_heads=3))

    def d_rel(p: Path) -> None:
        _edit_config(p, lambda c: c.update(d_rel=c["d_rel"] + 1))

    def model_type(p: Path) -> None:
        _edit_config(p, lambda c: c.update(model_type="inkling_unknown"))

    def missing(p: Path) -> None:
        _edit_tensors(p, lambda t: t.pop("model.layers.2.self_attn.r_proj.weight"))

    def wrong_shape(p: Path) -> None:
        key = "model.layers.1.self_attn.rel_logits_proj.proj"
        _edit_tensors(p, lambda t: t.update({key: torch.zeros(t[key].shape[0], t[key].shape[1] + 3)}))

    return {
        "layer_types": (short_layer_types, ("layer_types",)),
        "heads": (heads, ("num_key_value_heads",)),
        "d_rel": (d_rel, ("d_rel", "r_proj")),
        "model_type": (model_type, ("model_type", "inkling_unknown")),
        "missing": (missing, ("model.layers.2.self_attn.r_proj.weight",)),
        "wrong_shape": (wrong_shape, ("model.layers.1.self_attn.rel_logits_proj.proj",)),
    }


@pytest.fixture(scope="module")
def refusals(checkpoints: dict[str, Path], scratch: Path, vllm_env: dict[str, str]) -> dict[str, tuple[str, str]]:
    cases = _cases()
    paths = {}
    for name, (edit, _) in cases.items():
        path = scratch / f"refuse-{name}"
        if path.exists():
            shutil.rmtree(path)
        shutil.copytree(checkpoints["default"], path)
        edit(path)
        paths[name] = path
    env = {**vllm_env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    # Config errors stop an engine before it builds anything, so they share one
    # process; after a failed model load vLLM's process state does not allow another
    # engine, so each load-time case gets its own.
    groups = [[paths[n] for n in CONFIG_CASES]] + [[paths[n]] for n in paths if n not in CONFIG_CASES]
    out: dict[str, tuple[str, str]] = {}
    for group in groups:
        proc = subprocess.run(
            [sys.executable, "-c", TRY_LOAD, *[str(p) for p in group]],
            env=env, capture_output=True, text=True, timeout=1200,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
        assert lines, (proc.stdout + proc.stderr)[-5000:]
        results: dict[str, Any] = json.loads(lines[-1][len("RESULTS "):])
        for name, path in paths.items():
            if str(path) in results:
                out[name] = (results[str(path)], proc.stdout + proc.stderr)
    return out


@pytest.mark.parametrize("case", sorted(_cases()))
def test_bad_checkpoint_is_refused_naming_what_to_fix(refusals: dict[str, tuple[str, str]], case: str) -> None:
    message, _ = refusals[case]
    assert message != "loaded", f"{case}: the engine started on a bad checkpoint"
    fragments = _cases()[case][1]
    assert any(f in message for f in fragments), f"{case}: {message[:2000]}"


@pytest.mark.parametrize("case", sorted(_cases()))
def test_refusals_come_before_the_kv_cache_is_allocated(refusals: dict[str, tuple[str, str]], case: str) -> None:
    # vLLM logs the KV cache it allocates ("KV cache size"); no engine got that far
    _, log = refusals[case]
    assert "KV cache size" not in log, log[-3000:]


# --- the main job and the serve command refuse a bad folder before any engine starts ---


def _bad_folders(root: Path, good: Path) -> dict[str, tuple[Path, str]]:
    """name -> (folder, text the one-problem message must hold)"""
    import torch

    (root / "empty").mkdir(exist_ok=True)
    llama = root / "llama"
    llama.mkdir(exist_ok=True)
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    shape = root / "shape"
    if shape.exists():
        shutil.rmtree(shape)
    shutil.copytree(good, shape)
    key = "model.layers.1.self_attn.rel_logits_proj.proj"
    _edit_tensors(shape, lambda t: t.update({key: torch.zeros(t[key].shape[0], t[key].shape[1] + 3)}))

    def copy(name: str, change_config: Any = None, drop: tuple[str, ...] = ()) -> Path:
        folder = root / name
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(good, folder, ignore=shutil.ignore_patterns(*drop) if drop else None)
        if change_config is not None:
            config = json.loads((folder / "config.json").read_text())
            change_config(config)
            (folder / "config.json").write_text(json.dumps(config))
        return folder

    return {
        "missing": (root / "missing", "does not exist"),
        "empty": (root / "empty", "is empty"),
        "llama": (llama, "model_type 'llama'"),
        "shape": (shape, f"tensor {key} has shape [4, 67], config.json implies [4, 64]"),
        # a setting of the plugin's own, refused naming the key (not inside the engine)
        "padding": (copy("padding", lambda c: c.update(inkling_conv_state_padding="bogus")),
                    "the config key 'inkling_conv_state_padding' is 'bogus'"),
        "tokenizer": (copy("tokenizer", drop=("tokenizer*",)), "has no tokenizer"),
    }


@pytest.mark.parametrize("module", ["main", "serve"])
def test_commands_refuse_a_bad_folder_in_a_few_lines(
    checkpoints: dict[str, Path], scratch: Path, vllm_env: dict[str, str], module: str
) -> None:
    root = scratch / f"bad-folders-{module}"
    root.mkdir(exist_ok=True)
    cases = _bad_folders(root, checkpoints["default"])
    if module == "main":  # (float32 only: quantised weights are vLLM's own Inkling's, on a GPU)
        quantised = root / "quantised"
        if quantised.exists():
            shutil.rmtree(quantised)
        shutil.copytree(checkpoints["default"], quantised)
        config = json.loads((quantised / "config.json").read_text())
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
        (quantised / "config.json").write_text(json.dumps(config))
        cases["quantised"] = (quantised, "holds quantised weights")
    for name, (folder, fragment) in cases.items():
        args = ["--model", str(folder)] if module == "main" else [str(folder), "--port", "1"]
        proc = subprocess.run([sys.executable, "-m", f"inkling_vllm.demo.{module}", *args],
                              env=vllm_env, capture_output=True, text=True, timeout=300)
        text = proc.stdout + proc.stderr
        assert proc.returncode == 2, f"{name}: {text[-3000:]}"
        assert fragment in proc.stderr and "Traceback" not in text, f"{name}: {text[-3000:]}"
        assert len(proc.stderr.splitlines()) <= 5 and len(text.splitlines()) <= 6, f"{name}: {text}"
        assert "vLLM" not in proc.stdout.replace("starting vLLM", "")  # no engine was started
    assert not (checkpoints["default"] / "transformers-reference").exists()
