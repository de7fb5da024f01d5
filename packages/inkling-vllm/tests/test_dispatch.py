"""Which model serves a checkpoint: the plugin's, or vLLM's in-tree Inkling."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from inkling_vllm import dispatch, plugin


class FakeBuiltin:
    """Stands in for vLLM's in-tree Inkling class."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class FakeEntry:
    def load_model_cls(self) -> type:
        return FakeBuiltin


def _vllm_config(*, quantization: Any = None, quant_cfg: Any = None, switch: str | None = None) -> Any:
    hf = SimpleNamespace(architectures=["InklingForCausalLM"])
    if quant_cfg is not None:
        hf.quantization_config = quant_cfg
    if switch is not None:
        setattr(hf, dispatch.SWITCH_KEY, switch)
    return SimpleNamespace(model_config=SimpleNamespace(hf_config=hf, quantization=quantization))


@pytest.fixture
def builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "_builtin", {"InklingForCausalLM": FakeEntry()})
    monkeypatch.delenv(dispatch.SWITCH_ENV, raising=False)


def test_plain_checkpoint_stays_with_the_plugin(builtin: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "_platform_runs_builtin", lambda: True)
    assert dispatch.unsupported_reasons(_vllm_config().model_config) == []
    assert dispatch.builtin_model_for(_vllm_config()) is None


def test_quantised_checkpoint_steps_aside_with_one_log_line(
    builtin: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(dispatch, "_platform_runs_builtin", lambda: True)
    config = _vllm_config(quant_cfg={"quant_method": "modelopt_fp4"})
    with caplog.at_level("WARNING", logger=dispatch.__name__):
        assert dispatch.builtin_model_for(config) is FakeBuiltin
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "modelopt_fp4" in lines[0] and "stepping aside" in lines[0]


def test_no_step_aside_where_the_builtin_cannot_run(builtin: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM's in-tree Inkling needs a GPU: on CPU the plugin keeps the checkpoint
    # (and its model refuses it, saying why)
    monkeypatch.setattr(dispatch, "_platform_runs_builtin", lambda: False)
    assert dispatch.builtin_model_for(_vllm_config(quantization="fp8")) is None
    assert "fp8" in dispatch.unsupported_reasons(_vllm_config(quantization="fp8").model_config)[0]


def test_switch_forces_either_model(builtin: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "_platform_runs_builtin", lambda: True)
    assert dispatch.builtin_model_for(_vllm_config(switch="builtin")) is FakeBuiltin
    assert dispatch.builtin_model_for(_vllm_config(quantization="fp8", switch="plugin")) is None
    monkeypatch.setenv(dispatch.SWITCH_ENV, "builtin")
    assert dispatch.builtin_model_for(_vllm_config()) is FakeBuiltin
    # the per-engine config key beats the environment variable
    assert dispatch.builtin_model_for(_vllm_config(switch="plugin")) is None


def test_bad_switch_values_and_missing_builtin_are_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "_builtin", {})
    monkeypatch.delenv(dispatch.SWITCH_ENV, raising=False)
    with pytest.raises(ValueError, match="choose one of auto, plugin, builtin"):
        dispatch.builtin_model_for(_vllm_config(switch="in-tree"))
    with pytest.raises(ValueError, match="no in-tree Inkling"):
        dispatch.builtin_model_for(_vllm_config(switch="builtin"))
    monkeypatch.setenv(dispatch.SWITCH_ENV, "yes")
    with pytest.raises(ValueError, match=dispatch.SWITCH_ENV):
        dispatch.switch(None)


def test_model_class_hands_back_the_builtin_instance(builtin: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from inkling_vllm.model import InklingForCausalLM

    monkeypatch.setattr(dispatch, "_platform_runs_builtin", lambda: True)
    config = _vllm_config(quant_cfg={"quant_method": "compressed-tensors"})
    model = InklingForCausalLM(vllm_config=config, prefix="")
    assert isinstance(model, FakeBuiltin) and model.kwargs["vllm_config"] is config


def test_plugin_keeps_vllms_own_entries() -> None:
    from vllm import ModelRegistry

    from inkling_vllm import plugin

    plugin.register()
    for arch in plugin.ARCHITECTURES:
        assert arch in dispatch._builtin, f"vLLM's own {arch} entry was not kept"
        assert "inkling_vllm" not in repr(dispatch._builtin[arch])
        assert arch in ModelRegistry.get_supported_archs()


def test_plugin_log_lines_go_to_vllms_handlers() -> None:
    import logging

    ours, theirs = logging.getLogger("inkling_vllm"), logging.getLogger("vllm")
    saved = (list(ours.handlers), ours.level)
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    probe = Collect()
    theirs.addHandler(probe)
    try:
        for h in list(ours.handlers):
            ours.removeHandler(h)
        plugin.log_with_vllm()
        logging.getLogger("inkling_vllm.warmup").log(max(theirs.getEffectiveLevel(), logging.INFO), "warm-up line")
        assert seen == ["warm-up line"]
        plugin.log_with_vllm()  # idempotent: no second copy of the handlers
        assert ours.handlers.count(probe) == 1
    finally:
        theirs.removeHandler(probe)
        for h in list(ours.handlers):
            ours.removeHandler(h)
        for h in saved[0]:
            ours.addHandler(h)
        ours.setLevel(saved[1])
