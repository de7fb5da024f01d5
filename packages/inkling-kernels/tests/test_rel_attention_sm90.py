"""What the GPU tilings of the relative attention promise about resources, checked on
any machine: the kernel is compiled for sm_90a (H100 / H200) by Triton's own compiler
and bundled ``ptxas`` at the tiling ``choose_rel_attention_config`` picks for Inkling
975B's shapes (``_sm90_resources.py``, in a process without the interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HELPER = Path(__file__).with_name("_sm90_resources.py")
SM_REGISTERS = 65536
SM_SHARED = 228 * 1024  # bytes an SM shares among its programs
PROGRAM_RESERVED = 1024  # shared memory the hardware reserves per program


def _compile(case: dict[str, Any]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(HELPER), json.dumps(case)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _programs_per_sm(launch: dict[str, Any], config: dict[str, Any]) -> int:
    """Programs an SM holds at once, by registers (allocated 8 a thread, whole warps) and
    shared memory."""
    threads = 32 * config["num_warps"]
    by_regs = SM_REGISTERS // (-(-launch["registers"] // 8) * 8 * threads)
    by_shared = SM_SHARED // (launch["shared"] + PROGRAM_RESERVED)
    return min(by_regs, by_shared)


def _only_launch(res: dict[str, Any]) -> dict[str, Any]:
    (launch,) = res["launches"]
    return launch


PREFILL = [
    ("prefill 8k", dict(mix=[(0, 8192)])),
    ("chunked 8k after 8k", dict(mix=[(8192, 8192)])),
    ("mixed 2048 after 2048 + 255 decodes", dict(mix=[(2048, 2048)] + [(4095, 1)] * 255, layer=dict(pad=9))),
    ("sliding prefill 8k", dict(mix=[(0, 8192)], layer=dict(hkv=16, window=512))),
]


@pytest.mark.parametrize(("name", "case"), PREFILL, ids=[n for n, _ in PREFILL])
def test_prefill_tilings_fit_two_programs_an_sm_without_spills(name: str, case: dict[str, Any]) -> None:
    """Prefill-like batches: the near tiles' width was chosen so that the pipeline's
    buffers leave room for two programs an SM (one an SM ran 1.33-1.38x slower on an
    H100, RESULTS.md), and no main launch may spill (the sliding prefill's old tiling
    spilled and ran 1.57x slower). A far launch (128-row tiles, the fastest measured)
    keeps the 160-byte stack it was measured with, no more."""
    res = _compile(case)
    for launch in res["launches"]:
        assert _programs_per_sm(launch, res["config"]) >= 2, f"{name}: {res}"
        if launch["pass_"] == 1:
            assert launch["stack"] <= 160 and launch["local"] == 0, f"{name}: far launch spills more ({res})"
        else:
            assert launch["stack"] == 0 and launch["local"] == 0, f"{name}: spills ({res})"


def test_few_long_decodes_fit_three_programs_an_sm() -> None:
    """Decode of one long request: registers capped so that 3 programs fit an SM, and
    the key splits sized to one wave of them: the compiled kernel must hold to both."""
    res = _compile(dict(mix=[(32767, 1)]))
    launch = _only_launch(res)
    assert res["config"]["max_registers"] is not None, res
    assert launch["registers"] <= res["config"]["max_registers"], res
    assert launch["stack"] == 0 and launch["local"] == 0, f"spills ({res})"
    assert _programs_per_sm(launch, res["config"]) >= 3, res


def test_the_check_sees_a_one_program_tiling() -> None:
    """The guard can fail: whole-width near tiles pipelined three deep (the tiling the
    default left) need more shared memory than two programs an SM have."""
    config = dict(block_q=8, block_n=64, bias="diag", num_warps=4, num_stages=3, near_block_n=64)
    res = _compile(dict(mix=[(0, 8192)], config=config))
    assert _programs_per_sm(_only_launch(res), config) == 1, res
