"""The transformers side of the vLLM-vs-transformers parity checks.

transformers' ``InklingForCausalLM`` is the reference implementation. These helpers
run it without any cache (full recompute per generated token: slow but with no
state that could hide a bug) in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["HfReference", "ParityReport", "compare_greedy", "compare_logprobs"]


class HfReference:
    """transformers' model loaded from ``path`` (float32, eval mode)."""

    def __init__(self, path: str | Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        self.model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        self.model.eval()

    def logits(self, token_ids: Sequence[int]) -> Any:
        """``[len(token_ids), vocab]`` float32 logits of one sequence."""
        torch = self._torch
        with torch.no_grad():
            ids = torch.tensor([list(token_ids)], dtype=torch.long)
            return self.model(input_ids=ids, use_cache=False).logits[0].float()

    def greedy(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        """Greedy continuation of ``prompt`` (no EOS stop)."""
        seq = list(prompt)
        out: list[int] = []
        for _ in range(max_tokens):
            nxt = int(self.logits(seq)[-1].argmax())
            out.append(nxt)
            seq.append(nxt)
        return out

    def greedy_margins(self, prompt: Sequence[int], generated: Sequence[int]) -> list[float]:
        """Top-1 minus top-2 logit at each generated position (near-ties flag
        positions where two float32 implementations may legitimately differ)."""
        logits = self.logits(list(prompt) + list(generated))
        rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(generated)]
        top2 = rows.topk(2, dim=-1).values
        return [float(a - b) for a, b in top2.tolist()]

    def token_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """log p(token_ids[i] | token_ids[:i]) for i >= 1 (teacher forcing)."""
        torch = self._torch
        logp = torch.log_softmax(self.logits(token_ids), dim=-1)
        ids = torch.tensor(list(token_ids[1:]), dtype=torch.long)
        return logp[:-1].gather(1, ids[:, None])[:, 0].tolist()


@dataclass(frozen=True)
class ParityReport:
    """Whether the comparison held, and a one-line account (counts; the first mismatch)."""

    ok: bool
    detail: str


def compare_greedy(vllm_tokens: Sequence[Sequence[int]], hf_tokens: Sequence[Sequence[int]]) -> ParityReport:
    """Every sequence identical token for token."""
    bad = [i for i, (a, b) in enumerate(zip(vllm_tokens, hf_tokens)) if list(a) != list(b)]
    if len(vllm_tokens) != len(hf_tokens):
        return ParityReport(False, f"{len(vllm_tokens)} vLLM sequences vs {len(hf_tokens)} transformers")
    if bad:
        i = bad[0]
        return ParityReport(
            False,
            f"{len(bad)}/{len(hf_tokens)} sequences differ; first #{i}: vLLM {list(vllm_tokens[i])} "
            f"vs transformers {list(hf_tokens[i])}",
        )
    return ParityReport(True, f"{len(hf_tokens)}/{len(hf_tokens)} sequences identical")


def compare_logprobs(
    vllm_lp: Sequence[Sequence[float]], hf_lp: Sequence[Sequence[float]], atol: float
) -> ParityReport:
    """Per-position logprobs within ``atol``."""
    worst = 0.0
    for a, b in zip(vllm_lp, hf_lp):
        if len(a) != len(b):
            return ParityReport(False, f"length {len(a)} vs {len(b)}")
        for x, y in zip(a, b):
            worst = max(worst, abs(x - y))
    ok = worst <= atol
    return ParityReport(ok, f"max |dlogprob| {worst:.2e} (tolerance {atol:.0e})")
