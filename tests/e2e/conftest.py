"""Fixtures for the end-to-end tests: tiny checkpoints, the transformers reference,
and vLLM engines run (once per session each) in subprocesses by run_scenarios.py.

The engines a session needs are known once the tests are collected (each test names
them literally: ``engines("compiled", "default")``), so they start right away, up to
``INKLING_E2E_JOBS`` at a time (default: 2 on a machine with 2 or more CPUs), while
the tests wait for the ones they read. An engine spends most of its time starting
three Python processes one after another, so two side by side nearly halve the
suite's time on two cores.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "run_scenarios.py"
#: per engine running alone; side by side each gets ``jobs`` times as long (the
#: longest, the interpreted-Triton engine, takes a few minutes beside another on two
#: cores)
ENGINE_TIMEOUT_S = 900
#: tiny checkpoints the engines run on: "default" (transformers' format, every
#: feature on), "padded" (the same with unpadded conv pages), "release" (the same
#: weights in the original release layout), "mtp" / "mtp-transformers" (a complete
#: multi-token-prediction head in either layout), "mtp-predictive" (a head whose drafts
#: are mostly accepted), "mtp-deep" (two depths, one sliding, a chain norm)
VARIANTS = ("default", "padded", "release", "mtp", "mtp-transformers", "mtp-predictive", "mtp-deep")
#: engines started first when several run side by side, longest first (two cores,
#: beside another: interp_map ~160 s, interp_attn ~110 s, the TP 2 engines and
#: "release" (their own processes) 75-85 s, the rest 40-100 s), so that no long one is
#: left running alone at the end
LONG_ENGINES = ("interp_map", "interp_attn", "tp2", "tp2_interp", "release", "small_padded", "eager_chunked_window",
                "eager_chunked")
_WANTED = pytest.StashKey[list[tuple[str, str]]]()
_TIMES = pytest.StashKey[dict[str, float]]()


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inkling_e2e")


@pytest.fixture(scope="session")
def checkpoints(scratch: Path) -> dict[str, Path]:
    from inkling_vllm.demo.tiny import build_tiny_checkpoint

    return {v: build_tiny_checkpoint(scratch / f"tiny-{v}", variant=v) for v in VARIANTS}


@pytest.fixture(scope="session")
def hf(checkpoints: dict[str, Path]) -> dict[str, Any]:
    """transformers' model of each variant (the release layout's from its
    transformers-format copy: the same weights)."""
    from inkling_vllm.demo.parity import HfReference
    from inkling_vllm.demo.tiny import reference_checkpoint

    return {v: HfReference(reference_checkpoint(p)) for v, p in checkpoints.items()}


# vLLM writes its own choice of breakable CUDA graphs into os.environ when it builds a
# config (unit tests in this process do): engines inherit only the value set before
# the session, as a user's choice
_GRAPH_CHOICE = "VLLM_USE_BREAKABLE_CUDAGRAPH"
_GRAPH_CHOICE_AT_START = os.environ.get(_GRAPH_CHOICE)


def engine_env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(_GRAPH_CHOICE, None)
    if _GRAPH_CHOICE_AT_START is not None:
        env[_GRAPH_CHOICE] = _GRAPH_CHOICE_AT_START
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    env["VLLM_CACHE_ROOT"] = str(scratch / "vllm-cache")
    return env


@pytest.fixture(scope="session")
def vllm_env(scratch: Path) -> dict[str, str]:
    """Environment for a vLLM subprocess (small KV cache, scratch compile cache)."""
    return engine_env(scratch)


def engine_calls(func: Any) -> list[tuple[str, str]]:
    """The ``(engine, variant)`` pairs a test function names literally in
    ``engines(...)`` calls (others still run, when first called)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return []
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "engines"
                and len(node.args) == 2
                and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args)):
            found.append((node.args[0].value, node.args[1].value))
    return found


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only the engines still wanted
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted: dict[tuple[str, str], None] = {}
    for item in items:
        func = getattr(item, "function", None)
        if func is not None and "engines" in getattr(item, "fixturenames", ()):
            wanted.update(dict.fromkeys(engine_calls(func)))
    config.stash[_WANTED] = list(wanted)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    times = config.stash.get(_TIMES, {})
    if times:
        line = ", ".join(f"{k} {v:.0f}s" for k, v in sorted(times.items(), key=lambda kv: -kv[1]))
        terminalreporter.write_line(f"e2e engines (wall time each, {len(times)} run): {line}")


class Engines:
    """Runs each engine configuration at most once per session, up to ``jobs`` at a
    time; with ``jobs > 1`` each engine's threads are bound to its own CPU."""

    def __init__(self, scratch: Path, checkpoints: dict[str, Path], jobs: int, times: dict[str, float]) -> None:
        self.scratch = scratch
        self.checkpoints = checkpoints
        self.jobs = jobs
        self.times = times
        self.results: dict[str, dict[str, Any]] = {}
        self._futures: dict[str, Future[tuple[int, str]]] = {}
        self._procs: set[subprocess.Popen[str]] = set()
        self._lock = threading.Lock()
        self._slots: SimpleQueue[int] = SimpleQueue()
        for slot in range(jobs):
            self._slots.put(slot)
        self._pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="e2e-engine")

    def start(self, engine: str, variant: str) -> Future[tuple[int, str]]:
        key = f"{engine}-{variant}"
        with self._lock:
            if key not in self._futures:
                self._futures[key] = self._pool.submit(self._run, engine, variant)
            return self._futures[key]

    def _run(self, engine: str, variant: str) -> tuple[int, str]:
        key = f"{engine}-{variant}"
        env = engine_env(self.scratch)
        slot = self._slots.get()
        try:
            env["VLLM_CACHE_ROOT"] = str(self.scratch / "vllm-cache" / key)  # no compile cache shared in flight
            if self.jobs > 1:
                env["INKLING_E2E_FIRST_CPU"] = str(slot)
            started = time.time()
            proc = subprocess.Popen(
                [sys.executable, str(RUNNER), engine, str(self.checkpoints[variant]), str(self.scratch / f"{key}.json")],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )
            with self._lock:
                self._procs.add(proc)
            timeout = ENGINE_TIMEOUT_S * self.jobs
            try:
                output, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
                output += f"\n[timed out after {timeout} s]"
            finally:
                with self._lock:
                    self._procs.discard(proc)
            self.times[key] = time.time() - started
            return proc.returncode, output[-6000:]
        finally:
            self._slots.put(slot)

    def __call__(self, engine: str, variant: str) -> dict[str, Any]:
        key = f"{engine}-{variant}"
        if key not in self.results:
            returncode, tail = self.start(engine, variant).result()
            if returncode != 0:
                pytest.fail(f"engine {key} failed (rc {returncode}):\n{tail}")
            self.results[key] = json.loads((self.scratch / f"{key}.json").read_text())
        return self.results[key]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for proc in self._procs:
                proc.kill()


def e2e_jobs() -> int:
    value = os.environ.get("INKLING_E2E_JOBS")
    if value is None:
        return 2 if (os.cpu_count() or 1) >= 2 else 1
    if not value.isdigit() or int(value) < 1:
        raise pytest.UsageError(f"INKLING_E2E_JOBS must be a positive integer, got {value!r}")
    return int(value)


@pytest.fixture(scope="session")
def engines(request: pytest.FixtureRequest, scratch: Path, checkpoints: dict[str, Path]) -> Iterator[Engines]:
    runner = Engines(scratch, checkpoints, e2e_jobs(), request.config.stash.setdefault(_TIMES, {}))
    wanted = request.config.stash.get(_WANTED, [])
    if runner.jobs > 1:  # the longest first: the shortest makespan on few CPUs
        wanted = sorted(wanted, key=lambda k: LONG_ENGINES.index(k[0]) if k[0] in LONG_ENGINES else len(LONG_ENGINES))
    for engine, variant in wanted:
        runner.start(engine, variant)
    yield runner
    runner.close()
