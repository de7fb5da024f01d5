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
