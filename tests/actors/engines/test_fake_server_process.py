"""``python -m actors.testing``: the fakes as a server process of their own, as a user rehearses an SGLang or vLLM
spec without a GPU."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "actors.testing", *args]


@contextmanager
def _serving(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    env = {**os.environ, "PYTHONPATH": ROOT}
    process = subprocess.Popen(_command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+) ", line)
        assert found, f"no URL in {line!r}; stderr: {process.stderr.read() if process.poll() is not None else ''}"
        yield process, found.group(1)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def test_a_fake_sglang_process_generates_until_it_is_stopped() -> None:
    with _serving("sglang", "--port", "0") as (process, url):
        info = httpx.get(f"{url}/get_model_info", timeout=30).json()
        assert info["model_path"] == "fake/tiny-gpt" and info["weight_version"] == "default"  # as a fresh server
        reply = httpx.post(
            f"{url}/generate",
            json={"text": "1+1=", "sampling_params": {"max_new_tokens": 3, "temperature": 0}},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["meta_info"]["completion_tokens"] >= 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def test_a_fake_vllm_process_lists_its_model() -> None:
    with _serving("vllm", "--port", "0") as (process, url):
        models = httpx.get(f"{url}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0


def test_a_model_that_cannot_be_loaded_is_one_line_and_exit_2(tmp_path: pytest.TempPathFactory) -> None:
    done = subprocess.run(
        _command("sglang", "--port", "0", "--model", f"hf:{tmp_path}/nothing-here"),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert done.returncode == 2
    assert done.stderr.startswith("python -m actors.testing: ") and done.stderr.count("\n") == 1, done.stderr


def test_a_taken_port_says_so_and_exits_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            _command("vllm", "--port", str(port)),
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
    assert done.returncode == 1
    assert f"cannot serve on port {port}" in done.stderr and "--port" in done.stderr, done.stderr
