"""Each Inkling feature is load-bearing in the parity runs.

vLLM's recorded outputs (the compiled engine on the every-feature tiny model) equal
transformers' (test_vllm_parity). Here transformers is run again with one feature
switched off, the way a model that lacked it would compute; its outputs must differ
from vLLM's by far more than the parity tolerance. So a served model missing any one
of these features would fail the parity tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

LOGPROB_ATOL = 1e-4
#: a feature switched off must move some teacher-forced logprob by at least this
MIN_EFFECT = 1e-2


def _zero_relative_bias(model: Any) -> None:
    for layer in model.model.layers:
        layer.self_attn.rel_logits_proj.proj.data.zero_()


def _skip_log_scaling(model: Any) -> None:
    model.config.log_scaling_n_floor = None


def _drop_first_sink_expert(model: Any) -> None:
    for layer in model.model.layers:
        shared = getattr(layer.mlp, "shared_experts", None)
        if shared is not None:
            shared.down_proj.data[0].zero_()


def _keep_padded_columns(model: Any) -> None:
    model.config.unpadded_vocab_size = None


@contextmanager
def _renormalise_without_sinks() -> Iterator[None]:
    """The router's weights normalised over the routed top-k only (the shared
    experts' logits left out of the normalisation)."""
    import torch
    from transformers.models.inkling import modeling_inkling as mi

    original = mi.InklingTopkRouter.forward

    def forward(self: Any, hidden_states: torch.Tensor) -> Any:
        routed_logits, _, topk_indices, _ = original(self, hidden_states)
        flat = hidden_states.reshape(-1, self.hidden_dim)
        logits = torch.nn.functional.linear(flat, self.weight)
        chosen = logits[..., : -self.n_shared_experts].gather(-1, topk_indices).sigmoid()
        shared = logits[..., -self.n_shared_experts :].sigmoid()
        scale = self.route_scale * self.global_scale
        weights = chosen / chosen.sum(-1, keepdim=True) * scale
        gammas = shared / shared.sum(-1, keepdim=True) * scale
        return routed_logits, weights, topk_indices, gammas

    mi.InklingTopkRouter.forward = forward
    try:
        yield
    finally:
        mi.InklingTopkRouter.forward = original


def _worst_logprob_gap(ref: Any, scenario: dict[str, Any]) -> float:
    worst = 0.0
    for prompt, got in zip(scenario["prompts"], scenario["logprobs"]):
        want = ref.token_logprobs(prompt)
        worst = max(worst, max(abs(a - b) for a, b in zip(got, want)))
    return worst


MUTATIONS: dict[str, Callable[[Any], None]] = {
    "relative bias zeroed": _zero_relative_bias,
    "log scaling skipped": _skip_log_scaling,
    "a sink expert dropped": _drop_first_sink_expert,
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_feature_changes_the_logprobs(engines: Any, checkpoints: dict[str, Any], name: str) -> None:
    from inkling_vllm.demo.parity import HfReference

    scenario = engines("compiled", "default")["logprobs"]
    ref = HfReference(checkpoints["default"])
    assert _worst_logprob_gap(ref, scenario) <= LOGPROB_ATOL  # the intact model matches
    MUTATIONS[name](ref.model)
    gap = _worst_logprob_gap(ref, scenario)
    assert gap >= MIN_EFFECT, f"with the {name}, transformers moved by only {gap:.2e}"


def test_routing_renormalisation_with_sinks_changes_the_logprobs(engines: Any, checkpoints: dict[str, Any]) -> None:
    from inkling_vllm.demo.parity import HfReference

    scenario = engines("compiled", "default")["logprobs"]
    ref = HfReference(checkpoints["default"])
    with _renormalise_without_sinks():
        gap = _worst_logprob_gap(ref, scenario)
    assert gap >= MIN_EFFECT, f"renormalising without the sink logits moved the logprobs by only {gap:.2e}"


def test_padded_columns_would_change_greedy_tokens(engines: Any, checkpoints: dict[str, Any]) -> None:
    from inkling_vllm.demo.parity import HfReference

    scenario = engines("compiled", "default")["concurrent"]
    ref = HfReference(checkpoints["default"])
    unpadded = ref.model.config.unpadded_vocab_size
    assert unpadded < ref.model.config.vocab_size
    # vLLM never sampled a padded column
    assert max(t for seq in scenario["tokens"] for t in seq) < unpadded
    _keep_padded_columns(ref.model)
    changed = sum(
        ref.greedy(prompt, len(got)) != got for prompt, got in zip(scenario["prompts"], scenario["tokens"])
    )
    assert changed > 0, "keeping the padded unembedding columns changed no greedy sequence"
