"""The pool against a worker whose channel speaks nonsense: the job fails, its future resolves, the pool serves on.

A job cannot reach the pool's pipe (test_adversarial shows that); these tests stand in for the day it could, or a
worker breaks: a real process that sends a valid ready frame, then one bad answer, then becomes the real worker.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from actors.sandbox import SandboxLimits, SandboxPool
from actors.sandbox._isolation import default_python

pytestmark = pytest.mark.timeout(60)

LIAR = """#!{python}
import json, os, struct, sys
state = {state!r}
first = not os.path.exists(state)
if first:
    open(state, "w").close()
if not first:  # from now on, the real worker
    os.execv({python!r}, [{python!r}, *sys.argv[1:]])
out, inp = sys.stdout.buffer, sys.stdin.buffer
ready = json.dumps({{"ready": True}}).encode()
out.write(struct.pack(">I", len(ready)) + ready)
out.flush()
size = struct.unpack(">I", inp.read(4))[0]
job = json.loads(inp.read(size))
answer = {answer}
out.write(answer)
out.flush()
inp.read()  # wait for the pool to let go
"""


ANSWERS = {
    "a 4 GiB length header": "struct.pack('>I', 0xFFFFFFF0) + b'x' * (32 << 20)",  # never buffered
    "a malformed frame": "struct.pack('>I', 8) + b'not json'",
    "a frame that is not an object": "struct.pack('>I', 2) + b'[]'",
    "an answer to another job": "(lambda d: struct.pack('>I', len(d)) + d)(json.dumps({'id': -5, 'passed': True})"
    ".encode())",
    "a report with wrong types": "(lambda d: struct.pack('>I', len(d)) + d)(json.dumps({'id': job['id'], "
    "'elapsed_s': 'soon', 'passed': True}).encode())",
    "half a frame, then silence": "struct.pack('>I', 100) + b'{'",
}


@pytest.mark.parametrize("kind", sorted(ANSWERS))
def test_a_bad_frame_fails_the_job_and_the_pool_serves_on(tmp_path: Path, kind: str) -> None:
    python = default_python()
    liar = tmp_path / "liar"
    liar.write_text(LIAR.format(python=python, state=str(tmp_path / "state"), answer=ANSWERS[kind]))
    liar.chmod(0o755)

    async def scenario() -> tuple[str, str, str]:
        limits = SandboxLimits(timeout_s=1.0)
        async with SandboxPool(
            workers=1, limits=limits, python=str(liar), isolation="rlimits", min_isolation="rlimits"
        ) as pool:
            first = await asyncio.wait_for(pool.run("x = 1", tests="assert x == 1"), 30)
            second = await asyncio.wait_for(pool.run("x = 1", tests="assert x == 1"), 30)
            return str(first.verdict), first.detail, str(second.verdict)

    verdict, detail, after = asyncio.run(scenario())
    expected = "timeout" if kind == "half a frame, then silence" else "internal_error"  # never a pass, never a hang
    assert verdict == expected, (kind, verdict, detail)
    assert after == "pass", (kind, detail)
    assert sys.executable  # the pool ran in this process


def test_closing_the_pool_resolves_the_jobs_in_flight() -> None:
    async def scenario() -> str:
        pool = SandboxPool(workers=1)
        await pool.start()
        job = asyncio.ensure_future(pool.run("import time\ntime.sleep(5)", tests="assert True", timeout_s=10))
        await asyncio.sleep(0.5)
        await pool.aclose()
        return str((await asyncio.wait_for(job, 10)).verdict)

    assert asyncio.run(scenario()) == "internal_error"
