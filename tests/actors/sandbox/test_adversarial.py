"""One hostile program per property: contained, the right verdict, no reward, and the pool still serves."""

from __future__ import annotations

import os
import socket
import time

import psutil
import pytest

from actors.sandbox import Isolation
from tests.actors.sandbox._pool_runner import PoolRunner

pytestmark = pytest.mark.timeout(30)
TRIVIAL_TESTS = "assert True"


def test_honest_program_passes(sandbox: PoolRunner) -> None:
    result = sandbox.run("def add(a, b):\n    return a + b", tests="assert add(2, 3) == 5")
    assert result.verdict == "pass" and result.isolation in {"bwrap", "unshare", "rlimits"}


def test_failing_test_is_named(sandbox: PoolRunner) -> None:
    result = sandbox.run("def add(a, b):\n    return a - b", tests="assert add(1, 1) == 0\nassert add(2, 3) == 5")
    assert result.verdict == "fail" and "line 2" in result.detail and "add(2, 3) == 5" in result.detail


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("infinite_loop", "while True:\n    pass"),
        ("sleep", "import time\ntime.sleep(60)"),
        (
            "ignores_sigterm_sigalrm",
            "import signal, time\nfor s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT):\n"
            "    signal.signal(s, signal.SIG_IGN)\nsignal.alarm(1)\nwhile True:\n    time.sleep(0.01)",
        ),
    ],
)
def test_runaway_programs_time_out(sandbox: PoolRunner, name: str, code: str) -> None:
    result = sandbox.run(code, tests=TRIVIAL_TESTS, timeout_s=1.0)
    assert result.verdict == "timeout", (name, result)
    sandbox.still_serves()


def test_memory_bomb(sandbox: PoolRunner) -> None:
    result = sandbox.run("x = bytearray(8 * 1024**3)", tests=TRIVIAL_TESTS)
    assert result.verdict == "memory_limit", result
    sandbox.still_serves()


def test_memory_bomb_that_swallows_memoryerror_still_fails(sandbox: PoolRunner) -> None:
    code = (
        "blocks = []\ntry:\n    while True:\n        blocks.append(bytearray(64 * 1024**2))\nexcept MemoryError:\n"
        "    blocks.clear()\n    print('PASS')"
    )
    result = sandbox.run(code, tests="assert len(blocks) > 100")
    assert result.verdict != "pass", result
    sandbox.still_serves()


def test_fork_bomb_is_bounded_by_nproc(sandbox: PoolRunner) -> None:
    code = (
        "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time\n"
        "            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass"
    )
    result = sandbox.run(code, tests="assert n > 1000", timeout_s=3.0)
    assert result.verdict == "fail", result  # RLIMIT_NPROC applied (unprivileged uid): n stayed small
    sandbox.still_serves()


def test_fork_bomb_that_never_stops(sandbox: PoolRunner) -> None:
    result = sandbox.run(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        tests=TRIVIAL_TESTS,
        timeout_s=1.0,
    )
    assert result.verdict in {"timeout", "fail"}, result
    sandbox.still_serves()


def test_thread_bomb(sandbox: PoolRunner) -> None:
    code = (
        "import threading, time\nts = []\nwhile True:\n    t = threading.Thread(target=time.sleep, args=(30,))\n"
        "    t.start()\n    ts.append(t)"
    )
    result = sandbox.run(code, tests=TRIVIAL_TESTS)
    assert result.verdict in {"fail", "memory_limit"}, result
    sandbox.still_serves()


def test_output_flood(sandbox: PoolRunner) -> None:
    result = sandbox.run("while True:\n    print('x' * 4096)", tests=TRIVIAL_TESTS)
    assert result.verdict == "output_limit", result
    assert len(result.stdout) <= sandbox.pool.limits.output_cap_bytes
    sandbox.still_serves()


def test_huge_file_write(sandbox: PoolRunner) -> None:
    code = "with open('big', 'wb') as f:\n    while True:\n        f.write(b'0' * 65536)"
    result = sandbox.run(code, tests=TRIVIAL_TESTS)
    assert result.verdict == "output_limit", result
    sandbox.still_serves()


def test_writes_outside_private_tmp_fail(sandbox: PoolRunner, tmp_path: object) -> None:
    targets = [
        "/usr/fw-escape",
        "/fw-escape",
        "/work/fw-escape",
        "/root/fw-escape",
        "/etc/fw-escape",
        str(tmp_path) + "/escape",
    ]
    code = (
        f"written = []\nfor p in {targets!r}:\n    try:\n        open(p, 'w').write('x')\n        written.append(p)\n"
        f"    except OSError:\n        pass"
    )
    result = sandbox.run(code, tests="assert written, 'nothing written'")
    assert result.verdict == "fail", result
    assert not any(os.path.exists(p) for p in targets)
    sandbox.still_serves()


def test_network_connect_fails(sandbox: PoolRunner) -> None:
    if sandbox.pool.isolation is not None and sandbox.pool.isolation < Isolation.UNSHARE:
        pytest.skip("rlimits-only isolation has the host network")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            f"import socket\nok = False\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
            f"    ok = True\nexcept OSError:\n    pass"
        )
        result = sandbox.run(code, tests="assert ok")
    assert result.verdict == "fail", result
    sandbox.still_serves()


def test_host_files_are_not_readable(sandbox: PoolRunner) -> None:
    if sandbox.pool.isolation is not Isolation.BWRAP:
        pytest.skip("only bubblewrap hides the host filesystem")
    paths = [
        "/etc/passwd",
        "/etc/shadow",
        "/work/main/pyproject.toml",
        os.path.expanduser("~/.bashrc"),
        "/proc/1/environ",
    ]
    code = (
        f"seen = []\nfor p in {paths!r}:\n    try:\n        open(p).read(1)\n        seen.append(p)\n"
        f"    except OSError:\n        pass"
    )
    result = sandbox.run(code, tests="assert seen, 'no host file readable'")
    assert result.verdict == "fail", result


def test_environment_is_cleared(sandbox: PoolRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_SECRET_TOKEN", "hunter2")
    result = sandbox.run(
        "import os\nenv = dict(os.environ)\nprint(env)",
        tests="assert any('hunter2' in v for v in env.values())",
    )
    assert result.verdict == "fail" and "hunter2" not in result.stdout, result


def test_setsid_grandchild_is_killed(sandbox: PoolRunner) -> None:
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        while True:\n"
        "            time.sleep(0.05)\n    os._exit(0)\ntime.sleep(0.2)"
    )
    result = sandbox.run(code, tests=TRIVIAL_TESTS)
    assert result.verdict == "pass", result  # the program itself is fine; what it left behind must die
    uid_base = sandbox.pool._uid_base

    def survivors() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["uids", "cmdline"]):
            try:
                if (
                    p.info["uids"]
                    and uid_base <= p.info["uids"].real < uid_base + 64
                    and p.status() != psutil.STATUS_ZOMBIE
                ):
                    found.append(p)
            except psutil.NoSuchProcess:
                pass
        return found

    deadline = time.monotonic() + 5.0  # the worker reaps after the job; a loaded machine may take a moment
    while survivors() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not survivors(), survivors()
    sandbox.still_serves()


def test_exit_before_tests_earns_nothing(sandbox: PoolRunner) -> None:
    for code in ("exit(0)", "import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"):
        result = sandbox.run(code, tests="assert False")
        assert result.verdict == "fail", (code, result)


def test_fake_pass_marker_earns_nothing(sandbox: PoolRunner) -> None:
    code = (
        "import os, sys\nfor fd in range(3, 64):\n    try:\n"
        "        os.write(fd, b'P 0123456789abcdef0123456789abcdef\\n')\n    except OSError:\n        pass\n"
        "print('PASS')\nprint('all tests passed')\nos._exit(0)"
    )
    result = sandbox.run(code, tests="assert False")
    assert result.verdict == "fail", result


def test_fd_exhaustion(sandbox: PoolRunner) -> None:
    result = sandbox.run("fs = []\nwhile True:\n    fs.append(open('/dev/null'))", tests=TRIVIAL_TESTS)
    assert result.verdict == "fail" and "Too many open files" in result.detail, result
    sandbox.still_serves()


def test_kill_init(sandbox: PoolRunner) -> None:
    code = (
        "import os, signal\nfor pid in (1, os.getppid()):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\nimport subprocess\nsubprocess.run(['kill', '-9', '1'])"
    )
    result = sandbox.run(code, tests="assert False")
    assert result.verdict != "pass", result
    sandbox.still_serves()


def test_many_concurrent_jobs_keep_their_own_results(sandbox: PoolRunner) -> None:
    async def many() -> list[str]:
        import asyncio

        results = await asyncio.gather(*(sandbox.pool.run(f"x = {i}", tests=f"assert x == {i}") for i in range(40)))
        return [str(r.verdict) for r in results]

    assert sandbox.call(many()) == ["pass"] * 40


def test_a_worker_killed_from_outside_mid_job_costs_the_job_nothing(sandbox: PoolRunner) -> None:
    async def run_and_kill() -> tuple[str, str, int]:
        import asyncio

        retries = sandbox.pool.statistics().crash_retries
        job = asyncio.ensure_future(sandbox.pool.run("import time\ntime.sleep(0.5)", tests=TRIVIAL_TESTS))
        await asyncio.sleep(0.2)
        for pid in sandbox.pool.worker_pids():  # every worker: whichever holds the job dies
            os.kill(pid, 9)
        result = await job
        return str(result.verdict), result.detail, sandbox.pool.statistics().crash_retries - retries

    verdict, detail, retries = sandbox.call(run_and_kill())
    assert (verdict, retries) == ("pass", 1), detail
    sandbox.still_serves()
