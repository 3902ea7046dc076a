"""Hostile answers to the verifiers: each finishes within its limit, reward 0, this process's memory flat, and the
verifier still serves the next answer."""

from __future__ import annotations

import asyncio
import gc
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from actors.domains import build_verifier
from actors.domains._verifiers._helpers import shared_helpers
from actors.domains._verifiers._math import HELPER_MEMORY_MB
from actors.domains._verifiers._registry import FunctionVerifier
from tests.actors.sandbox._pool_runner import PoolRunner

pytestmark = pytest.mark.timeout(90)

SYMBOLIC_BOMBS = [
    "\\boxed{(a+b+c+d+f+g+h+k)^64}",
    "answer: (x+y+z+w+v+u)^60*(x-y)^60",
    "\\boxed{(1+x)^64*(1+y)^64*(1+z)^64}",
]


def _rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


@pytest.mark.parametrize("answer", SYMBOLIC_BOMBS)
def test_symbolic_bombs_are_killed_and_leave_memory_flat(answer: str) -> None:
    math = build_verifier("math")
    helpers = shared_helpers("math", memory_mb=HELPER_MEMORY_MB)
    assert asyncio.run(math.verify("answer: sqrt(2)/2", {"answer": "1/sqrt(2)"})).reward == 1.0  # helpers warm
    before = _rss_mb()
    result = asyncio.run(math.verify(answer, {"answer": "1"}))
    assert result.reward == 0.0 and result.verdict in {"timeout", "memory_limit", "fail"}, result
    assert result.isolation == "helper"
    gc.collect()
    time.sleep(1.5)  # the old code kept expanding in a thread here, at tens of MB a second
    assert _rss_mb() - before < 30, (before, _rss_mb())
    assert all(psutil.Process(pid).memory_info().vms <= (HELPER_MEMORY_MB + 64) << 20 for pid in helpers.pids())
    assert asyncio.run(math.verify("so \\boxed{2x+1}", {"answer": "1+2*x"})).reward == 1.0  # serves on


def test_hostile_texts_cost_bounded_time_in_process() -> None:
    math, fields = build_verifier("math"), build_verifier("json-fields")
    texts = ["\\boxed{" * 600, "\\boxed{" * 300 + "}" * 300, "{" * 20000, '{"a":' * 4000, "9" * 100_000]
    for text in texts:
        assert asyncio.run(math.verify(text, {"answer": "7"})).reward == 0.0
        assert asyncio.run(fields.verify(text, {"fields": {"a": 1}})).reward == 0.0


def _user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_user_verifier_that_hangs_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _user_module(tmp_path, monkeypatch, "fw_hang", "def score(text, task):\n    while True:\n        pass\n")
    verifier = build_verifier("fw_hang:score", user_timeout_s=1.0)
    result = asyncio.run(verifier.verify("anything", {}))
    assert (result.reward, result.verdict, result.isolation) == (0.0, "timeout", "helper"), result


def test_a_user_verifier_that_eats_memory_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = "def score(text, task):\n    blocks = []\n    while True:\n        blocks.append(bytearray(16 << 20))\n"
    _user_module(tmp_path, monkeypatch, "fw_eat", source)
    verifier = FunctionVerifier("fw_eat:score", {}, timeout_s=30.0, memory_mb=256)
    result = asyncio.run(verifier.verify("anything", {}))
    assert (result.reward, result.verdict) == (0.0, "memory_limit"), result


def test_a_user_verifier_runs_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = (
        "import time\ndef score(text, task, config):\n    time.sleep(0.5)\n"
        "    return {'reward': 1.0, 'detail': config['k']}\n"
    )
    _user_module(tmp_path, monkeypatch, "fw_slow", source)
    verifier = build_verifier("fw_slow:score", {"k": "v"})

    async def both() -> tuple[Any, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0)
        result = await verifier.verify("x", {})
        ticker.cancel()
        return result, ticks

    result, ticks = asyncio.run(both())
    assert result.reward == 1.0 and result.detail == "v", result
    assert ticks >= 5  # the loop kept turning while the function slept


def test_a_user_verifier_that_raises_or_lies_about_its_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = "def boom(text, task):\n    raise ValueError('no')\ndef odd(text, task):\n    return object()\n"
    _user_module(tmp_path, monkeypatch, "fw_odd", source)
    for name, verdict in (("fw_odd:boom", "internal_error"), ("fw_odd:odd", "internal_error")):
        result = asyncio.run(build_verifier(name).verify("x", {}))
        assert (result.reward, result.verdict) == (0.0, verdict), result


def test_the_python_expr_memo_is_bounded_in_bytes_and_keeps_no_output(sandbox: PoolRunner) -> None:
    v = build_verifier("python-expr", pool=sandbox.pool, config={"memo_max_bytes": 200_000})
    for i in range(12):
        assert sandbox.call(v.verify(f"'{i}' + 'x' * 20000", {"target": "no"})).reward == 0.0
        assert v.memo_bytes <= 200_000  # type: ignore[attr-defined]
    assert 1 <= len(v._memo) <= 3  # type: ignore[attr-defined]
    loud = "print('y' * 60000) or 5"
    assert sandbox.call(v.verify(loud, {"target": 5})).reward == 1.0
    assert v._memo[loud].stdout == ""  # type: ignore[attr-defined]
    assert sandbox.call(v.verify(loud, {"target": 5})).reward == 1.0 and v.memo_hits >= 1  # type: ignore[attr-defined]
