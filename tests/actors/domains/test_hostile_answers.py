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


def test_a_module_slow_to_import_is_not_timed_with_the_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that loads a model or a table at import outlasted the call's limit every time: the import ran on the
    call's clock, the helper was killed, and the next helper imported it again — every answer a timeout."""
    _user_module(
        tmp_path, monkeypatch, "fw_slow_import", "import time\ntime.sleep(1.5)\ndef score(t, task):\n    return 1.0\n"
    )
    verifier = build_verifier("fw_slow_import:score", user_timeout_s=1.0)
    for _ in range(2):
        result = asyncio.run(verifier.verify("x", {}))
        assert (result.reward, result.verdict) == (1.0, "pass"), result


def test_an_error_says_where_in_the_users_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _user_module(tmp_path, monkeypatch, "fw_where", "def score(t, task):\n    x = 1\n    return task['solution']\n")
    result = asyncio.run(build_verifier("fw_where:score").verify("x", {}))
    assert result.verdict == "internal_error" and "KeyError: 'solution' (at fw_where.py:3 in score)" in result.detail


def test_what_a_user_verifier_prints_reaches_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """It went to /dev/null: a user debugging a verifier saw nothing of its prints in the replica's log."""
    _user_module(tmp_path, monkeypatch, "fw_prints", "def score(t, task):\n    print('DEBUG-fw', t)\n    return 0.5\n")
    verifier = FunctionVerifier("fw_prints:score", {}, memory_mb=1000)  # a pool of its own: started under capfd
    result = asyncio.run(verifier.verify("hello", {}))
    assert result.reward == 0.5
    assert "DEBUG-fw hello" in capfd.readouterr().err


def test_a_timeout_takes_the_processes_the_verifier_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verifier that shells out (a compiler, a prover) and hangs: its child outlived the killed helper, one
    process leaked per timeout."""
    marker = f"fw-child-{time.monotonic_ns()}"
    source = f"import subprocess\ndef score(t, task):\n    subprocess.run(['sleep', '300', '{marker}'])\n"
    _user_module(
        tmp_path, monkeypatch, "fw_child", source.replace("'sleep', '300', ", "'bash', '-c', 'sleep 300; : ' + ")
    )
    result = asyncio.run(build_verifier("fw_child:score", user_timeout_s=1.5).verify("x", {}))
    assert result.verdict == "timeout", result
    deadline = time.monotonic() + 10
    while any(marker in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])):
        assert time.monotonic() < deadline, "the verifier's child is still running"
        time.sleep(0.1)


def test_a_verifier_that_forks_gets_its_own_verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forked child returned into the helper's loop and replied too: each call got the previous call's second
    reply (pass, fail, pass for fail, pass, fail)."""
    source = "import os\ndef score(t, task):\n    pid = os.fork()\n    return 1.0 if pid == 0 else 0.0\n"
    _user_module(tmp_path, monkeypatch, "fw_fork", source)
    verifier = build_verifier("fw_fork:score")
    assert [asyncio.run(verifier.verify("x", {})).reward for _ in range(3)] == [0.0, 0.0, 0.0]


def test_a_verifier_that_hangs_holds_only_its_own_helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every user verifier shared one pool of two helpers: a domain whose verifier hung on each answer held both, and
    every other user-verifier domain waited behind it. Each function has its own pool, of ``verifier_processes``."""
    source = "import os, time\ndef hang(t, task):\n    time.sleep(60)\ndef pid(t, task):\n"
    source += "    time.sleep(0.3)\n    return {'reward': 1.0, 'detail': str(os.getpid())}\n"
    _user_module(tmp_path, monkeypatch, "fw_pools", source)
    hang = build_verifier("fw_pools:hang", user_timeout_s=5.0)  # (its calls' threads end, and free, soon after)
    fast = build_verifier("fw_pools:pid", user_processes=4)

    async def both() -> tuple[list[str], list[str]]:
        done: list[str] = []

        async def one(verifier: Any, name: str) -> str:
            result = await verifier.verify("x", {})
            done.append(name)
            return str(result.detail)

        hung = [asyncio.ensure_future(one(hang, "hang")) for _ in range(4)]
        await asyncio.sleep(0.5)  # both of hang's helpers busy
        pids = await asyncio.gather(*(one(fast, "fast") for _ in range(8)))
        for future in hung:
            future.cancel()
        return done, list(pids)

    done, pids = asyncio.run(both())
    assert done == ["fast"] * 8  # every fast call came back while the hanging ones were still out
    assert len(set(pids)) == 4  # eight calls at once ran on four helpers


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
