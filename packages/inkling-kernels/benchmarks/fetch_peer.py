"""Extract the peer kernels (vLLM's in-tree Inkling ``fused_sconv`` /
``sconv_seq_metadata``) from an official vllm wheel into an ignored folder.

Nothing from vllm is committed to this repository: ``run.py`` imports the peer from
the folder this script writes (default ``.peer`` at the repository root, git-ignored;
``run.py --peer DIR`` for another).

    python3 -m pip download --no-deps vllm==0.33.0 -d .whl
    python3 packages/inkling-kernels/benchmarks/fetch_peer.py .whl/vllm-0.33.0-*.whl

The module is found by content (the file defining both ``def fused_sconv`` and
``def sconv_seq_metadata``; the NVIDIA copy is preferred). Its only vllm import,
``from vllm.triton_utils import tl, triton``, is replaced by plain triton imports.
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import re
import sys
import zipfile

PEER_MODULE = "vllm_sconv_peer.py"
VLLM_IMPORT = re.compile(r"^from vllm\.triton_utils import tl, triton$", re.M)


def find_module(wheel: zipfile.ZipFile) -> tuple[str, str]:
    found = []
    for name in wheel.namelist():
        if not name.endswith(".py"):
            continue
        text = wheel.read(name).decode("utf-8", errors="replace")
        if "def fused_sconv(" in text and "def sconv_seq_metadata(" in text:
            found.append((name, text))
    if not found:
        raise SystemExit("no module defining fused_sconv and sconv_seq_metadata in this wheel")
    found.sort(key=lambda nt: ("/nvidia/" not in nt[0], nt[0]))
    return found[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheel", type=pathlib.Path, help="path to vllm-0.33.0-*.whl")
    default_out = pathlib.Path(__file__).resolve().parents[3] / ".peer"
    ap.add_argument("--out", type=pathlib.Path, default=default_out, help=f"output folder (default {default_out})")
    args = ap.parse_args(argv)
    with zipfile.ZipFile(args.wheel) as wheel:
        name, text = find_module(wheel)
    other_imports = [ln for ln in text.splitlines() if re.match(r"^(from|import) vllm", ln)]
    if other_imports != ["from vllm.triton_utils import tl, triton"]:
        raise SystemExit(f"unexpected vllm imports in {name}: {other_imports}; extend the shim")
    shimmed = VLLM_IMPORT.sub("import triton\nimport triton.language as tl", text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / PEER_MODULE).write_text(shimmed)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    (args.out / "PROVENANCE.txt").write_text(
        f"wheel: {args.wheel.name}\nmodule: {name}\nsha256[:16] of original: {digest}\n"
        "shim: 'from vllm.triton_utils import tl, triton' -> plain triton imports\n"
    )
    print(f"peer: {name} -> {args.out / PEER_MODULE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
