"""InklingMoE (vLLM fused MoE + shared experts) against transformers' InklingMoE.

Built inside a minimal vLLM context on CPU (TP 1, float32); weights are given in
transformers' names and loaded through ``InklingMoE.load_weight``. The negative
checks show that every piece of the routing is load-bearing at this tolerance.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

H, I, E, K, S = 64, 32, 8, 2, 2  # CPU fused-MoE kernels want H, I multiples of 32
ROUTE_SCALE, GLOBAL_SCALE = 2.5, 1.7
TOKENS = 24
ATOL = 1e-5
FAR = 100 * ATOL  # what a wrong variant must miss transformers by, at least


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    return {
        "gate.weight": rnd(E + S, H, scale=H**-0.5),
        # about the spread of sigmoid(logits): it moves many tokens' choice
        "gate.e_score_correction_bias": rnd(E, scale=0.3),
        "gate.global_scale": torch.tensor([GLOBAL_SCALE]),
        "experts.gate_up_proj": rnd(E, 2 * I, H, scale=H**-0.5),
        "experts.down_proj": rnd(E, H, I, scale=I**-0.5),
        "shared_experts.gate_proj": rnd(S, I, H, scale=H**-0.5),
        "shared_experts.up_proj": rnd(S, I, H, scale=H**-0.5),
        "shared_experts.down_proj": rnd(S, H, I, scale=I**-0.5),
    }


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return _weights()


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randn(TOKENS, H, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def hf_moe(weights: dict[str, torch.Tensor]) -> Any:
    from transformers.models.inkling.configuration_inkling import InklingTextConfig
    from transformers.models.inkling.modeling_inkling import InklingMoE as HFInklingMoE

    config = InklingTextConfig(
        hidden_size=H,
        moe_intermediate_size=I,
        n_routed_experts=E,
        num_experts_per_tok=K,
        n_shared_experts=S,
        route_scale=ROUTE_SCALE,
        hidden_act="silu",
        num_hidden_layers=1,
    )
    config._experts_implementation = "eager"
    moe = HFInklingMoE(config).eval()
    state = moe.state_dict()
    assert set(state) == set(weights)
    moe.load_state_dict(weights)
    return moe


@pytest.fixture(scope="module")
def hf_out(hf_moe: Any, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_moe(tokens.unsqueeze(0)).squeeze(0)


_built = iter(range(10**6))


def build(weights: dict[str, torch.Tensor], process: bool = True) -> Any:
    """An InklingMoE with ``weights`` loaded and (``process``) post-processed as
    vLLM's loader does (CPU kernels repack the weights, after which the weight
    loaders are gone)."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    from inkling_vllm.moe import InklingMoE

    layer = InklingMoE(
        hidden_size=H,
        moe_intermediate_size=I,
        n_routed_experts=E,
        num_experts_per_tok=K,
        n_shared_experts=S,
        route_scale=ROUTE_SCALE,
        quant_config=None,
        prefix=f"model.layers.{next(_built)}.mlp",
        params_dtype=torch.float32,
    )
    filled: set[str] = set()
    for name, tensor in weights.items():
        filled.update(layer.load_weight(name, tensor))
    assert filled == {n for n, _ in layer.named_parameters()}
    if not process:
        return layer
    for module in layer.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, QuantizeMethodBase):
            method.process_weights_after_loading(module)
    return layer


def run(layer: Any, config: Any, x: torch.Tensor) -> torch.Tensor:
    from vllm.forward_context import set_forward_context

    with torch.no_grad(), set_forward_context(None, config):
        return layer(x)


def reference(
    w: dict[str, torch.Tensor],
    x: torch.Tensor,
    *,
    use_bias: bool = True,
    shared_in_norm: bool = True,
    sinks: tuple[int, ...] = tuple(range(S)),
) -> torch.Tensor:
    """The MoE in plain torch, with switches that break one piece each."""
    logits = x @ w["gate.weight"].T
    routed, shared = logits[:, :E], logits[:, E:][:, list(sinks)]
    score = routed.sigmoid() + (w["gate.e_score_correction_bias"] if use_bias else 0)
    ids = score.topk(K, dim=-1).indices
    probs = torch.cat([routed.gather(1, ids), shared], dim=-1).sigmoid()
    denom = probs.sum(-1, keepdim=True) if shared_in_norm else probs[:, :K].sum(-1, keepdim=True)
    gammas = probs / denom * ROUTE_SCALE * w["gate.global_scale"]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(K):
            e = int(ids[t, j])
            gate, up = (w["experts.gate_up_proj"][e] @ x[t]).split(I)
            out[t] += gammas[t, j] * (w["experts.down_proj"][e] @ (F.silu(gate) * up))
    for j, s in enumerate(sinks):
        gate, up = x @ w["shared_experts.gate_proj"][s].T, x @ w["shared_experts.up_proj"][s].T
        out += gammas[:, K + j, None] * ((F.silu(gate) * up) @ w["shared_experts.down_proj"][s].T)
    return out


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# --- parity -----------------------------------------------------------------------
def test_layer_matches_transformers(vllm_ctx: Any, weights: dict[str, torch.Tensor], tokens: torch.Tensor, hf_out: torch.Tensor) -> None:
    layer = build(weights)
    out = run(layer, vllm_ctx, tokens)
    assert out.shape == (TOKENS, H) and out.dtype == torch.float32
    assert gap(out, hf_out) < ATOL, gap(out, hf_out)
    assert hf_out.abs().max() > 0.1  # not a vacuous comparison


def test_router_matches_transformers_gate(vllm_ctx: Any, weights: dict[str, torch.Tensor], tokens: torch.Tensor, hf_moe: Any) -> None:
    layer = build(weights)
    with torch.no_grad():
        _, hf_w, hf_ids, hf_gammas = hf_moe.gate(tokens)
        w, ids, gammas = layer.gate.route(layer.gate.logits(tokens))
        # the function handed to the fused MoE gives the same routed part
        fw, fids = layer.gate.select_routed(
            hidden_states=tokens, gating_output=layer.gate.logits(tokens), topk=K, renormalize=False
        )
    assert fids.dtype == torch.int32 and fw.dtype == torch.float32
    order, hf_order = ids.sort(-1), hf_ids.sort(-1)
    assert torch.equal(order.values, hf_order.values)
    assert torch.allclose(w.gather(1, order.indices), hf_w.gather(1, hf_order.indices), atol=1e-6)
    assert torch.allclose(gammas, hf_gammas, atol=1e-6)
    assert torch.equal(fids.long(), ids) and torch.equal(fw, w)
    # all k + S weights share one normalisation, then the two scales
    total = torch.cat([w, gammas], -1).sum(-1)
    assert torch.allclose(total, torch.full_like(total, ROUTE_SCALE * GLOBAL_SCALE), atol=1e-5)


def test_layer_traces_whole_under_torch_compile(
    vllm_ctx: Any, weights: dict[str, torch.Tensor], tokens: torch.Tensor, hf_out: torch.Tensor
) -> None:
    """On CPU vLLM calls the fused MoE (and so the routing function) inline: the
    layer must trace without graph breaks."""
    from vllm.forward_context import set_forward_context

    layer = build(weights)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    with torch.no_grad(), set_forward_context(None, vllm_ctx):
        out = compiled(tokens)
    assert gap(out, hf_out) < ATOL


# --- every piece is load-bearing ----------------------------------------------------
def test_reference_matches_transformers(weights: dict[str, torch.Tensor], tokens: torch.Tensor, hf_out: torch.Tensor) -> None:
    assert gap(reference(weights, tokens), hf_out) < ATOL


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(dict(shared_in_norm=False), id="renormalisation-without-shared-logits"),
        pytest.param(dict(use_bias=False), id="selection-bias-ignored"),
        pytest.param(dict(sinks=(0,)), id="sink-1-dropped"),
        pytest.param(dict(sinks=(1,)), id="sink-0-dropped"),
    ],
)
def test_wrong_variants_miss_transformers(
    broken: dict[str, Any], weights: dict[str, torch.Tensor], tokens: torch.Tensor, hf_out: torch.Tensor
) -> None:
    assert gap(reference(weights, tokens, **broken), hf_out) > FAR


def test_bias_changes_the_selection(weights: dict[str, torch.Tensor], tokens: torch.Tensor) -> None:
    logits = tokens @ weights["gate.weight"][:E].T
    with_bias = (logits.sigmoid() + weights["gate.e_score_correction_bias"]).topk(K).indices.sort(-1).values
    without = logits.sigmoid().topk(K).indices.sort(-1).values
    changed = (with_bias != without).any(-1).sum()
    assert changed >= TOKENS // 4, int(changed)


def test_layer_uses_bias_and_scales(vllm_ctx: Any, weights: dict[str, torch.Tensor], tokens: torch.Tensor, hf_out: torch.Tensor) -> None:
    """The same ablations on the layer itself, through its weights."""
    no_bias = dict(weights, **{"gate.e_score_correction_bias": torch.zeros(E)})
    assert gap(run(build(no_bias), vllm_ctx, tokens), hf_out) > FAR
    unit_scale = dict(weights, **{"gate.global_scale": torch.ones(1)})
    assert gap(run(build(unit_scale), vllm_ctx, tokens), hf_out) > FAR
    sink_down = weights["shared_experts.down_proj"].clone()
    sink_down[1] = 0
    no_sink = dict(weights, **{"shared_experts.down_proj": sink_down})
    assert gap(run(build(no_sink), vllm_ctx, tokens), hf_out) > FAR


# --- tensor-parallel layout of the shared experts --------------------------------------
@pytest.mark.parametrize("tp", [2, 4])
def test_shared_expert_shards_sum_to_the_whole(weights: dict[str, torch.Tensor], tokens: torch.Tensor, tp: int) -> None:
    """Emulate each rank's slice of the column/row-parallel shared experts as
    vLLM cuts them (per-output-chunk columns; contiguous down-input block) and
    check the per-rank partials sum to the unsharded result."""
    from inkling_vllm.moe import InklingSharedExperts

    gate, up, down = (weights[f"shared_experts.{n}_proj"] for n in ("gate", "up", "down"))
    gammas = torch.rand(TOKENS, S, generator=torch.Generator().manual_seed(2))
    full = sum(
        gammas[:, s, None] * ((F.silu(tokens @ gate[s].T) * (tokens @ up[s].T)) @ down[s].T) for s in range(S)
    )
    fake = SimpleNamespace(tp_size=tp)
    down_full = InklingSharedExperts.down_weight_for_row_split(fake, down)  # type: ignore[arg-type]
    assert down_full.shape == (H, S * I)
    per = I // tp
    total = torch.zeros_like(tokens)
    for r in range(tp):
        chunk = slice(r * per, (r + 1) * per)
        w13 = torch.cat([gate[s][chunk] for s in range(S)] + [up[s][chunk] for s in range(S)])
        gu = (tokens @ w13.T).view(TOKENS, 2, S, per)
        act = F.silu(gu[:, 0]) * gu[:, 1] * gammas.unsqueeze(-1)
        w2 = down_full[:, r * S * per : (r + 1) * S * per]
        total += act.reshape(TOKENS, -1) @ w2.T
    assert gap(total, full) < ATOL


# --- loading -------------------------------------------------------------------------
def test_load_weight_reports_names_and_refuses_bad_input(vllm_ctx: Any, weights: dict[str, torch.Tensor]) -> None:
    layer = build(weights, process=False)
    assert layer.load_weight("gate.weight", weights["gate.weight"]) == ["gate.weight"]
    assert layer.load_weight("gate.global_scale", torch.tensor(2.0)) == ["gate.global_scale"]
    assert layer.gate.global_scale.item() == 2.0
    assert layer.load_weight("shared_experts.down_proj", weights["shared_experts.down_proj"]) == [
        "shared_experts.down_proj.weight"
    ]
    with pytest.raises(ValueError, match=r"experts\.gate_up_proj.*shape"):
        layer.load_weight("experts.gate_up_proj", weights["experts.gate_up_proj"][:, :I])
    with pytest.raises(ValueError, match=r"gate\.weight.*shape"):
        layer.load_weight("gate.weight", weights["gate.weight"][:E])
    with pytest.raises(ValueError, match=r"gate\.global_scale"):
        layer.load_weight("gate.global_scale", torch.ones(2))
    with pytest.raises(ValueError, match=r"shared_experts\.up_proj.*shape"):
        layer.load_weight("shared_experts.up_proj", weights["shared_experts.up_proj"][:1])
    with pytest.raises(ValueError, match=r"experts\.gate_proj"):
        layer.load_weight("experts.gate_proj", weights["experts.down_proj"])


def test_warmup_reads_each_layer_shape_once(vllm_ctx: Any, weights: dict[str, torch.Tensor]) -> None:
    """The kernel warm-up finds the model's MoE layers and their fused-MoE shape (two
    layers of one shape: one entry), with vLLM's tile config for each row count."""
    from vllm.model_executor.layers.fused_moe.fused_moe import try_get_optimal_moe_config

    from inkling_vllm import warmup

    model = torch.nn.ModuleList([build(weights, process=False), build(weights, process=False)])
    (shape,) = warmup._fused_moe_shapes(model)
    assert (shape.top_k, shape.num_experts, shape.expert_map) == (K, E, False)
    for m in (1, 7, 40, 300, 4096):
        assert shape.config(m) == try_get_optimal_moe_config((E, 2 * I, H), (E, H, I), K, "float32", m)
