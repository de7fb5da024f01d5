"""Is a folder an Inkling checkpoint this plugin can serve? Answered before any engine
starts, from config.json and the safetensors headers alone (no tensor is read).

    problems = check_checkpoint_dir(path)   # [] when nothing is wrong

Each problem is one line naming what is wrong and what to do. In order, the check
stops at the first of: the folder is missing or a file; it has no config.json (an
empty folder, say); config.json is not JSON; its ``model_type`` is not Inkling's
(``inkling_mm_model`` / ``inkling_model``: release layout; ``inkling_text``:
transformers' layout); the config is not a valid Inkling config
(``inkling_cache.text_spec`` says which field); a setting of the plugin's own (config
key or environment variable, :mod:`inkling_vllm.options`) has a value the engine
would refuse (every such setting is named); the folder has no tokenizer (unless the
caller brings one); there are no ``*.safetensors`` files, or one's header cannot be
read. Then every text-model tensor the config implies is compared, by name and shape,
with the headers (``inkling_model.checkpoint.check_text_shapes``): missing tensors,
tensors of another shape, and tensors the text model has no place for. Quantised
checkpoints (a ``quantization_config``) skip the tensor comparison (on CUDA, vLLM's
own Inkling serves them: :mod:`inkling_vllm.dispatch`), or are refused where the
caller cannot serve them (``quantised=False``: the main job runs float32).

Imports nothing heavy until the tensor comparison (which imports ``inkling_model``,
hence torch): a bad folder or config is answered in well under a second.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "INKLING_MODEL_TYPES",
    "TOKENIZER_FILES",
    "check_checkpoint_dir",
    "format_problems",
    "read_safetensors_shapes",
]

#: config.json ``model_type`` values of Inkling checkpoints, and their layout.
INKLING_MODEL_TYPES = {
    "inkling_mm_model": "release layout",
    "inkling_model": "release layout, text only",
    "inkling_text": "transformers' layout",
}
_FOLDER_HINT = "pass the folder that holds config.json and the *.safetensors files"
#: Any one of these files gives the folder a tokenizer (transformers' fast or
#: sentencepiece tokenizer, or a tiktoken file).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "tokenizer.tiktoken")
#: safetensors header sizes above this are not a header (a truncated or foreign file)
_MAX_HEADER_BYTES = 1 << 28


def read_safetensors_shapes(file: str | os.PathLike[str]) -> dict[str, list[int]]:
    """``tensor name -> shape`` from a ``.safetensors`` file's header (the 8-byte
    little-endian length, then that many bytes of JSON); no tensor data is read.

    Raises:
        ValueError: the file is shorter than its header says, or the header is not a
            safetensors JSON header.
    """
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        size = int.from_bytes(head, "little")
        if size > _MAX_HEADER_BYTES:
            raise ValueError(f"header length {size} is implausible: not a safetensors file")
        raw = f.read(size)
    if len(raw) < size:
        raise ValueError(f"truncated: the header says {size} bytes, the file has {len(raw)}")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    shapes: dict[str, list[int]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
            raise ValueError(f"header entry {name!r} has no shape")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry["shape"]):
            raise ValueError(f"header entry {name!r} has shape {entry['shape']!r}, not a list of sizes")
        shapes[name] = list(entry["shape"])
    return shapes


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _more(count: int) -> str:
    return f" (and {count - 1} more)" if count > 1 else ""


def _config_problems(path: Path, absent_hint: str) -> tuple[list[str], dict[str, Any] | None]:
    if not path.exists():
        return [f"{path} does not exist: {absent_hint}."], None
    if not path.is_dir():
        return [f"{path} is a file, not a folder: {_FOLDER_HINT}."], None
    config_file = path / "config.json"
    if not config_file.is_file():
        what = "is empty" if not any(path.iterdir()) else "has no config.json"
        return [f"{path} {what}, so it is not a model checkpoint folder: {_FOLDER_HINT}."], None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [f"{config_file} cannot be read as JSON ({exc}): restore the config.json saved with the weights."], None
    if not isinstance(config, dict):
        return [f"{config_file} holds no JSON object: restore the config.json saved with the weights."], None
    model_type = config.get("model_type")
    if model_type not in INKLING_MODEL_TYPES:
        found = "gives no model_type" if model_type is None else f"has model_type {model_type!r}"
        return [
            f"config.json {found}: not an Inkling checkpoint. inkling-vllm serves model_type "
            "inkling_mm_model or inkling_model (release layout) and inkling_text (transformers' "
            "layout); serve other models with vLLM alone."
        ], None
    from inkling_cache import text_spec

    try:
        text_spec(config)
    except (ValueError, TypeError) as exc:
        message = " ".join(str(exc).split())
        return [f"config.json is not a valid Inkling config: {message}"], None
    from ..options import option_problems

    settings = option_problems(config)
    if settings:
        return [f"{problem}." for problem in settings], None
    return [], config


def _quantised(config: dict[str, Any]) -> bool:
    text = config.get("text_config")
    return config.get("quantization_config") is not None or (
        isinstance(text, dict) and text.get("quantization_config") is not None
    )


def check_checkpoint_dir(
    path: str | os.PathLike[str], *, absent_hint: str = _FOLDER_HINT, tokenizer: bool = True,
    quantised: bool = True,
) -> list[str]:
    """The problems that keep inkling-vllm from serving the checkpoint folder ``path``,
    one line each (problem, then what to do); ``[]`` when there are none. Reads
    config.json and the ``*.safetensors`` headers only; see the module docstring for
    the checks and their order.

    ``absent_hint``: what to do when ``path`` does not exist (the caller's options);
    ``tokenizer``: the folder must hold a tokenizer (False: the caller brings one);
    ``quantised``: the caller can serve quantised checkpoints."""
    path = Path(path).expanduser()
    problems, config = _config_problems(path, absent_hint)
    if problems or config is None:
        return problems
    if not quantised and _quantised(config):
        return [f"{path} holds quantised weights (a quantization_config): this runs float32 weights; "
                "serve a quantised checkpoint with vllm serve on a GPU (vLLM's own Inkling)."]
    if tokenizer and not any((path / name).is_file() for name in TOKENIZER_FILES):
        return [f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): copy the tokenizer "
                "files saved with the checkpoint into it."]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        others = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
        seen = f" (found {', '.join(others[:3])})" if others else ""
        return [
            f"{path} holds no *.safetensors weights{seen}: inkling-vllm loads safetensors only "
            "(transformers' save_pretrained writes them)."
        ]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            return [f"{index} cannot be read ({exc}): restore it or remove it."]
        absent = sorted(s for s in shards if not (path / s).is_file())
        if absent:
            return [f"{index.name} lists {len(absent)} shard(s) not in the folder, e.g. {absent[0]}: "
                    "copy every shard of the checkpoint."]
    shapes: dict[str, list[int]] = {}
    for file in files:
        try:
            shapes.update(read_safetensors_shapes(file))
        except (OSError, ValueError) as exc:
            return [f"{file.name} is not a readable safetensors file ({exc}): copy it again."]
    if _quantised(config):
        return []
    from inkling_cache import text_spec
    from inkling_model.checkpoint import check_text_shapes

    spec = text_spec(config)
    check = check_text_shapes(shapes, spec)
    if check.ok:
        return []
    out: list[str] = []
    if check.wrong:
        name, stored, expected = check.wrong[0]
        out.append(f"tensor {name} has shape {_shape(stored)}, config.json implies {_shape(expected)}"
                   + _more(len(check.wrong)) + ".")
    if check.missing:
        name, expected = check.missing[0]
        out.append(f"{len(check.missing)} tensor(s) the config implies are missing, e.g. {name} {_shape(expected)}.")
    if check.unknown:
        out.append(f"{len(check.unknown)} tensor(s) have no place in the Inkling text model ({spec.layout} "
                   f"layout), e.g. {check.unknown[0]}.")
    out.append("config.json and the weights disagree: use the config.json saved with these weights, "
               "or re-export the checkpoint.")
    return out


def format_problems(path: str | os.PathLike[str], problems: Sequence[str]) -> str:
    """The error text for ``problems`` of the folder ``path`` (at most five lines)."""
    lines = [f"error: cannot serve {path}"] + [f"  {p}" for p in problems[:4]]
    return "\n".join(lines)
