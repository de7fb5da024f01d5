"""The adapter proper and the demo stay apart: the import contract that forbids the
adapter to import ``inkling_vllm.demo`` names every adapter module."""

from __future__ import annotations

import configparser
import pkgutil
from pathlib import Path

import inkling_vllm
import inkling_vllm.demo

ROOT = Path(__file__).resolve().parents[3]
CONTRACT = "importlinter:contract:adapter-does-not-import-demo"


def contract() -> configparser.SectionProxy:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter", encoding="utf-8")
    return config[CONTRACT]


def test_the_demo_contract_covers_every_adapter_module() -> None:
    section = contract()
    sources = set(section["source_modules"].split())
    modules = {f"inkling_vllm.{m.name}" for m in pkgutil.iter_modules(inkling_vllm.__path__)}
    assert "inkling_vllm.demo" in modules
    assert sources == (modules - {"inkling_vllm.demo"}) | {"inkling_vllm"}, (
        "a new module of inkling_vllm: add it to the contract's source_modules in .importlinter "
        "(or, if it is demo code, put it in inkling_vllm/demo/)"
    )
    assert set(section["forbidden_modules"].split()) == {"inkling_vllm.demo", "inkling_vllm.demo.**"}


def test_the_demo_modules_live_in_the_demo_package() -> None:
    demo = {m.name for m in pkgutil.iter_modules(inkling_vllm.demo.__path__)}
    assert demo == {"conv_memory_sim", "diagnostics", "gpu_engine", "main", "parity", "peer_conv", "preflight", "quiet",
                    "serve", "tiny"}
    adapter = {m.name for m in pkgutil.iter_modules(inkling_vllm.__path__)}
    assert not adapter & demo
