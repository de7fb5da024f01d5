"""Packaging promises: no runtime dependencies, no heavy imports, a typed public API."""

from __future__ import annotations

import importlib.metadata
import inspect
import subprocess
import sys

import inkling_cache


def test_metadata_declares_no_dependencies() -> None:
    assert not importlib.metadata.requires("inkling-cache")
    assert importlib.metadata.version("inkling-cache") == inkling_cache.__version__
    scripts = [ep for ep in importlib.metadata.entry_points(group="console_scripts")
               if ep.name == "inkling-cache"]
    assert [ep.value for ep in scripts] == ["inkling_cache.cli:main"]


def test_import_pulls_in_nothing_heavy() -> None:
    code = ("import sys, inkling_cache, inkling_cache.cli; "
            "print(sorted(m for m in ('torch', 'numpy', 'triton', 'vllm', 'transformers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_api_is_exported_and_documented() -> None:
    for name in inkling_cache.__all__:
        obj = getattr(inkling_cache, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), f"{name} has no docstring"


def test_readme_api_example_runs_and_its_comments_hold() -> None:
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = readme.split("\n## API\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    lay = namespace["lay"]
    assert isinstance(lay, inkling_cache.ConvStateLayout)
    assert (lay.num_heads, lay.raw_head_size, lay.head_size) == (1, 1792, 2048)
    assert lay.stream_range(inkling_cache.Stream.ATTN) == (256, 768)
    assert lay.channel_to_head(inkling_cache.Stream.MLP, 5) == (0, 1029)
    assert (lay.page_bytes("bf16"), lay.slot_bytes("bf16")) == (16384, 4096)
    assert lay.min_state_bytes("bf16") == 10752
    assert lay.with_block_size(32).cache_shape(100) == (100, 1, 32, 2048)
    assert inkling_cache.slot_of(position=9, block_table_row=[7, 3, 5], block_size=4) == 21
