"""Which model serves a checkpoint: the plugin's, or vLLM's in-tree Inkling."""

from __future__ import annotations

import os
import subprocess
import sys
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


@pytest.mark.parametrize(("vllm_logging_first", "env_level"),
                         [(True, "INFO"), (False, "INFO"), (False, "info"), (False, "chatty")],
                         ids=["vllm-set-up-first", "vllm-set-up-later", "lower-case-level", "unknown-level"])
def test_plugin_log_lines_go_to_vllms_handlers(vllm_logging_first: bool, env_level: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's records reach vLLM's handlers once each, at vLLM's level, whether
    vLLM set its logging up before the plugin loaded or after (vLLM 0.32: after); a
    handler of the root logger (an application's, pytest's caplog) also gets each once."""
    import logging

    ours, theirs = logging.getLogger("inkling_vllm"), logging.getLogger("vllm")
    saved_ours = (list(ours.handlers), ours.level)
    saved_theirs = (list(theirs.handlers), theirs.level)
    seen: list[str] = []
    at_root: list[str] = []

    class Collect(logging.Handler):
        def __init__(self, into: list[str]) -> None:
            super().__init__()
            self.into = into

        def emit(self, record: logging.LogRecord) -> None:
            self.into.append(record.getMessage())

    probe, root_probe = Collect(seen), Collect(at_root)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", env_level)
    logging.getLogger().addHandler(root_probe)
    try:
        for h in list(ours.handlers) + list(theirs.handlers):
            ours.removeHandler(h)
            theirs.removeHandler(h)
        theirs.setLevel(logging.NOTSET)
        if vllm_logging_first:
            theirs.addHandler(probe)
            theirs.setLevel(logging.INFO)
        plugin.log_with_vllm()
        plugin.log_with_vllm()  # idempotent: no second route to vLLM's handlers
        if not vllm_logging_first:  # as vLLM 0.32 does, after loading its plugins
            theirs.addHandler(probe)
            theirs.setLevel(logging.INFO)
        warmup = logging.getLogger("inkling_vllm.warmup")
        warmup.info("warm-up line")
        warmup.debug("below vLLM's level")
        assert seen == ["warm-up line"]
        theirs.setLevel(logging.WARNING)
        warmup.info("below vLLM's level")
        warmup.warning("a warning")
        assert seen == ["warm-up line", "a warning"]
        assert at_root == ["warm-up line", "below vLLM's level", "a warning"]
    finally:
        logging.getLogger().removeHandler(root_probe)
        theirs.removeHandler(probe)
        for h in list(ours.handlers):
            ours.removeHandler(h)
        for h in saved_ours[0]:
            ours.addHandler(h)
        ours.setLevel(saved_ours[1])
        for h in saved_theirs[0]:
            theirs.addHandler(h)
        theirs.setLevel(saved_theirs[1])


def test_a_bad_switch_value_does_not_break_vllm_for_other_models() -> None:
    """A typo in the environment variable must not make vLLM's plugin loading fail (it
    runs for every model): the plugin warns and registers as for ``auto``; the bad
    value is refused where an Inkling engine reads the switch."""
    code = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stderr)\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
        "from vllm import ModelRegistry\n"
        "print(ModelRegistry.models['InklingForCausalLM'].module_name)\n"
    )
    env = {**os.environ, dispatch.SWITCH_ENV: "plug"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-1] == "inkling_vllm.model"
    assert "INKLING_VLLM_MODEL is 'plug'" in out.stderr
