"""SandboxPool: N warm sandbox workers behind a bounded queue, with an async API.

    async with SandboxPool(workers=2) as pool:
        result = await pool.run("def f(x): return x + 1", tests="assert f(1) == 2", timeout_s=2)

Contract: ``run`` waits for room in a bounded queue (backpressure), then for a worker; it always returns
a ``SandboxResult`` (never raises for anything the job does) that names the isolation level in force. PASS
means that the worker's judge ran every test to its end on values the job returned (see ``_worker``): the
job holds no descriptor that could report a result. The pool starts only at ``min_isolation`` or stronger —
``bwrap`` unless the caller opts in to less — and `IsolationRefused` says how to install bubblewrap or opt in.

Each worker slot owns one warm process; a slot enforces a parent-side deadline (the job's timeout plus a
grace) on the worker's reply and kills the worker's whole pid namespace when it expires, so a wedged or
killed worker costs one job, not the pool. Frames from a worker are length-prefixed and capped
(``max_frame_bytes``): a frame over the cap, a malformed or out-of-order one, and any other failure in a
slot resolve that job as ``internal_error`` and replace the worker — a slot never dies with a job pending.
Workers are replaced after ``max_jobs_per_worker`` jobs and after any job that hit a limit, crashed, or
left processes or files behind. A job whose worker died before answering runs once more on a fresh worker;
it is ``crashed`` only if that worker dies too (counted in ``crash_retries``). The pool never waits on a
pipe's EOF. ``statistics()`` counts jobs per verdict; every non-pass verdict is logged.

Non-goals: scheduling fairness between callers, cross-host pools.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import struct
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import structlog

from actors.sandbox._isolation import (
    IS_ROOT,
    Isolation,
    IsolationRefused,
    default_python,
    probe_isolation,
    slot_tmp_dir,
    worker_command,
)
from actors.sandbox._verdict import RECYCLE_AFTER, SandboxResult, Verdict, classify

_log = structlog.get_logger("flywheel.sandbox")
_GRACE_S = 2.0  # parent-side deadline beyond the job's own timeout, for a worker that stopped answering
INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora/RHEL: `dnf install bubblewrap`; "
    "as a normal user it also needs unprivileged user namespaces), or opt in to weaker isolation with "
    "`min_isolation: unshare` (or `rlimits`) in the verify actor's `sandbox` block, `--min-isolation` on the "
    "command line, or `SandboxPool(min_isolation=...)`"
)


class _BadFrame(ValueError):
    """A worker's frame that is over the size cap or not a JSON object."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0  # wall clock per job
    memory_mb: int = 512  # RLIMIT_AS of the job process (address space, not RSS)
    cpu_s: int = 10  # RLIMIT_CPU, rounded up to whole seconds (SIGXCPU, then SIGKILL one second later)
    max_processes: int = 32  # RLIMIT_NPROC for the job's private uid (threads count too)
    max_file_mb: float = 4.0  # RLIMIT_FSIZE: any one file, stdout and stderr included
    max_open_files: int = 64  # RLIMIT_NOFILE
    output_cap_bytes: int = 64 * 1024  # stdout/stderr returned to the caller are truncated to this


@dataclass
class PoolStatistics:
    isolation: str
    workers: int
    queued: int
    queue_size: int
    jobs: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    workers_started: int = 0
    workers_recycled: int = 0
    crash_retries: int = 0  # jobs run again on a fresh worker after their worker died mid-job

    def as_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items() if k != "verdicts"},
            "verdicts": dict(self.verdicts),
        }


@dataclass
class _Job:
    frame: dict[str, Any]
    timeout_s: float
    file_limit: int
    future: asyncio.Future[SandboxResult]


class _Worker:
    """One warm process; owned by one slot task, so never used concurrently."""

    def __init__(self, proc: asyncio.subprocess.Process, max_frame_bytes: int) -> None:
        self.proc = proc
        self.jobs = 0
        self.max_frame_bytes = max_frame_bytes

    async def read_frame(self) -> dict[str, Any]:
        """The next frame; `_BadFrame` when its length header is over the cap (nothing more is read) or it is not a
        JSON object, `asyncio.IncompleteReadError` when the worker is gone."""
        assert self.proc.stdout is not None
        (size,) = struct.unpack(">I", await self.proc.stdout.readexactly(4))
        if size > self.max_frame_bytes:
            raise _BadFrame(f"a frame of {size} bytes (the cap is {self.max_frame_bytes})")
        try:
            frame = json.loads(await self.proc.stdout.readexactly(size))
        except (ValueError, RecursionError) as exc:
            raise _BadFrame(f"a malformed frame ({type(exc).__name__})") from None
        if not isinstance(frame, dict):
            raise _BadFrame("a frame that is not a JSON object")
        return frame

    async def exit_status(self) -> str:
        """How the process ended, for a crash's detail ("exit 1", "killed by SIGKILL", "still running")."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.proc.wait()
        code = self.proc.returncode
        if code is None:
            return "worker still running"
        if code < 0:
            try:
                return f"worker killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"worker killed by signal {-code}"
        return f"worker exit {code}"

    async def send(self, frame: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        data = json.dumps(frame).encode()
        self.proc.stdin.write(struct.pack(">I", len(data)) + data)
        await self.proc.stdin.drain()

    async def close(self) -> None:
        """Let the worker go: it exits on its stdin's EOF (reaping its own processes); killed if it does not."""
        if self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
        try:
            async with asyncio.timeout(1.0):
                await self.proc.wait()
        except (TimeoutError, Exception):
            await self.kill()

    async def kill(self) -> None:
        # Killing bwrap (or unshare --kill-child) takes the namespace's init down, and with it every
        # process in the pid namespace, setsid grandchildren included.
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.proc.wait()


class SandboxPool:
    def __init__(
        self,
        *,
        workers: int = 2,
        limits: SandboxLimits | None = None,
        min_isolation: Literal["bwrap", "unshare", "rlimits"] | Isolation = "bwrap",
        isolation: Literal["auto", "bwrap", "unshare", "rlimits"] = "auto",
        max_jobs_per_worker: int = 1000,
        queue_size: int | None = None,
        python: str | None = None,
        tmp_mb: int = 64,
        job_uid_base: int | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.limits = limits or SandboxLimits()
        self.python = python or default_python()
        self._min = min_isolation if isinstance(min_isolation, Isolation) else Isolation.parse(min_isolation)
        self._wanted = isolation
        self._n = workers
        self._max_jobs = max_jobs_per_worker
        self._tmp_mb = tmp_mb
        # Each pool needs uids of its own: RLIMIT_NPROC counts a uid's processes machine-wide, so two pools (two
        # verify replicas, two test workers) sharing uids would let a fork bomb in one starve the other's jobs.
        self._uid_base = job_uid_base if job_uid_base is not None else _private_uid_base(workers)
        self._queue: asyncio.Queue[_Job] = asyncio.Queue(maxsize=queue_size or 4 * workers)
        self._tasks: list[asyncio.Task[None]] = []
        self._live: dict[int, _Worker] = {}  # slot -> its running worker
        self._host_tmp: str | None = None
        self.isolation: Isolation | None = None
        self._stats = PoolStatistics(isolation="", workers=workers, queued=0, queue_size=self._queue.maxsize)
        self._next_id = 0

    @property
    def max_frame_bytes(self) -> int:
        """The largest report frame a worker may send: two capped outputs (JSON may spell a byte as six), the
        detail and an expression's value; a longer length header is a broken worker, never buffered."""
        return 16 * self.limits.output_cap_bytes + (2 << 20)

    @classmethod
    def from_config(cls, config: Any) -> SandboxPool:
        """A pool from a spec's ``sandbox`` block (``actors.verify._config.SandboxConfig``)."""
        limits = SandboxLimits(
            timeout_s=config.wall_s,
            memory_mb=config.memory_mb,
            cpu_s=max(1, int(config.cpu_s + 0.999)),
            max_processes=config.max_processes,
            max_file_mb=config.max_file_mb,
            max_open_files=config.max_open_files,
            output_cap_bytes=config.max_output_kb * 1024,
        )
        return cls(
            workers=config.workers,
            limits=limits,
            isolation=config.isolation,
            min_isolation=config.min_isolation,
            max_jobs_per_worker=config.max_jobs_per_worker,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self._wanted == "auto":
            level, reasons = await asyncio.to_thread(probe_isolation, self.python, job_uid_base=self._uid_base)
        else:
            level, reasons = Isolation.parse(self._wanted), []
        if level < self._min:
            why = "; ".join(reasons) if reasons else f"isolation={self._wanted} was asked for"
            raise IsolationRefused(
                f"sandbox isolation {self._min} is required but only {level} is available here ({why}); " + INSTALL_HINT
            )
        if level < Isolation.BWRAP:
            _log.warning("sandbox_isolation_weaker_than_bwrap", isolation=str(level), min_isolation=str(self._min))
        if not IS_ROOT and level < Isolation.UNSHARE:
            _log.warning(
                "sandbox_no_private_uid",
                hint="setsid grandchildren of a job cannot be reaped without a pid namespace",
            )
        self.isolation = level
        self._stats.isolation = str(level)
        if level < Isolation.BWRAP:
            self._host_tmp = tempfile.mkdtemp(prefix="flywheel-sandbox-")
            os.chmod(self._host_tmp, 0o711)
            for slot in range(self._n):
                self._reset_slot_tmp(slot)
        first = await asyncio.gather(*(self._spawn(slot) for slot in range(self._n)))
        self._tasks = [asyncio.create_task(self._slot(slot, worker)) for slot, worker in enumerate(first)]
        _log.info("sandbox_pool_started", isolation=str(level), workers=self._n)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.future.done():
                job.future.set_result(SandboxResult(Verdict.INTERNAL_ERROR, "sandbox pool closed", str(self.isolation)))
        if self._host_tmp:
            shutil.rmtree(self._host_tmp, ignore_errors=True)
            self._host_tmp = None

    # -- API -------------------------------------------------------------------------------------

    async def run(
        self,
        code: str,
        *,
        tests: str | None = None,
        mode: Literal["exec", "expr"] = "exec",
        timeout_s: float | None = None,
        memory_mb: int | None = None,
    ) -> SandboxResult:
        """Run ``code`` (then ``tests``) in a sandbox; ``mode="expr"`` evaluates ``code`` as an expression."""
        if not self._tasks:
            raise RuntimeError("SandboxPool is not started; use `async with SandboxPool(...)`")
        lim = self.limits
        timeout = float(timeout_s if timeout_s is not None else lim.timeout_s)
        memory = int(memory_mb if memory_mb is not None else lim.memory_mb)
        file_limit = int(lim.max_file_mb * (1 << 20))
        self._next_id += 1
        frame = {
            "id": self._next_id,
            "code": code,
            "tests": tests or "",
            "mode": mode,
            "timeout_s": timeout,
            "output_cap": lim.output_cap_bytes,
            "limits": {
                "memory_bytes": memory << 20,
                "cpu_s": max(1, int(min(lim.cpu_s, timeout + 1) + 0.999)),
                "nproc": lim.max_processes,
                "file_bytes": file_limit,
                "nofile": lim.max_open_files,
            },
        }
        future: asyncio.Future[SandboxResult] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(frame, timeout, file_limit, future))
        return await future

    def worker_pids(self) -> list[int]:
        """Host pids of the running workers' top processes (bwrap, unshare or python), by slot."""
        return [self._live[slot].proc.pid for slot in sorted(self._live)]

    def statistics(self) -> PoolStatistics:
        self._stats.queued = self._queue.qsize()
        return self._stats

    # -- workers ---------------------------------------------------------------------------------

    async def _spawn(self, slot: int) -> _Worker:
        assert self.isolation is not None
        cmd = worker_command(
            self.isolation,
            python=self.python,
            slot=slot,
            job_uid_base=self._uid_base,
            tmp_mb=self._tmp_mb,
            host_tmp=self._host_tmp,
        )
        proc = await asyncio.create_subprocess_exec(
            *cmd.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={},
            start_new_session=True,
            limit=1 << 22,
        )
        worker = _Worker(proc, self.max_frame_bytes)
        try:
            async with asyncio.timeout(15):
                hello = await worker.read_frame()
        except (TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            await worker.kill()
            raise RuntimeError(f"sandbox worker ({self.isolation}) failed to start: {exc!r}") from exc
        if not hello.get("ready"):
            await worker.kill()
            raise RuntimeError(f"sandbox worker sent {hello!r} instead of a ready frame")
        self._stats.workers_started += 1
        self._live[slot] = worker
        return worker

    async def _reap_uid(self, slot: int) -> None:
        """Without a pid namespace, kill whatever still runs as the slot's private uid (``kill -9 -1`` as that uid)."""
        kill = shutil.which("kill")
        if self.isolation is not Isolation.RLIMITS or not IS_ROOT or kill is None:
            return
        uid = self._uid_base + slot
        with contextlib.suppress(OSError):
            proc = await asyncio.create_subprocess_exec(
                kill,
                "-9",
                "-1",
                user=uid,
                group=uid,
                extra_groups=[],
                env={},
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await proc.wait()

    def _reset_slot_tmp(self, slot: int) -> None:
        """Outside bubblewrap: the slot's scratch directory, empty, owned by its job uid (when we are root)."""
        if self._host_tmp is None:
            return
        path = slot_tmp_dir(self._host_tmp, slot)
        shutil.rmtree(path, ignore_errors=True)
        os.mkdir(path, 0o700)
        if IS_ROOT:
            os.chown(path, self._uid_base + slot, self._uid_base + slot)

    async def _slot(self, slot: int, worker: _Worker | None) -> None:
        job: _Job | None = None
        try:
            while True:
                job = await self._queue.get()
                if job.future.cancelled():
                    continue
                try:
                    worker = await self._serve(slot, worker, job)
                except Exception as exc:  # a bug or a broken worker: this job fails, the slot and the pool go on
                    _log.error("sandbox_slot_failed", slot=slot, error=repr(exc)[:300])
                    self._finish(job, SandboxResult(Verdict.INTERNAL_ERROR, f"sandbox slot failed: {exc!r}"[:300]))
                    if worker is not None:
                        with contextlib.suppress(Exception):
                            await self._recycle(slot, worker)
                    worker = None
        finally:  # the pool is closing (this task was cancelled)
            if job is not None and not job.future.done():
                job.future.set_result(SandboxResult(Verdict.INTERNAL_ERROR, "sandbox pool closed", str(self.isolation)))
            current = self._live.pop(slot, None)
            if worker is not None and worker is not current:
                await asyncio.shield(worker.kill())
            if current is not None:
                await asyncio.shield(current.close())

    async def _serve(self, slot: int, worker: _Worker | None, job: _Job) -> _Worker | None:
        """Run one job on the slot's worker (started when there is none); returns the worker to keep, if any."""
        if worker is None:
            try:
                worker = await self._spawn(slot)
            except Exception as exc:
                self._finish(job, SandboxResult(Verdict.INTERNAL_ERROR, str(exc)))
                await asyncio.sleep(0.5)
                return None
        result, healthy = await self._one(worker, job)
        worker.jobs += 1
        if result.extra.get("worker_died"):
            # The worker died before answering. Its job may have killed it, or something outside did
            # (seen once in CI, cause unknown): a correct answer must not score 0 for that, so the job
            # runs once more on a fresh worker, and `crashed` stands only if that one dies too.
            _log.warning("sandbox_worker_died", slot=slot, detail=result.detail, retrying=True)
            await self._recycle(slot, worker)
            self._stats.crash_retries += 1
            try:
                worker = await self._spawn(slot)
            except Exception:
                worker = None
            else:
                result, healthy = await self._one(worker, job)
                worker.jobs += 1
                if result.extra.get("worker_died"):
                    result = replace(result, detail=result.detail + ", on a fresh worker too")
        self._finish(job, result)
        if worker is not None and (not healthy or result.verdict in RECYCLE_AFTER or worker.jobs >= self._max_jobs):
            await self._recycle(slot, worker)
            worker = None
        return worker

    async def _recycle(self, slot: int, worker: _Worker) -> None:
        self._live.pop(slot, None)
        await worker.kill()
        await self._reap_uid(slot)
        self._reset_slot_tmp(slot)
        self._stats.workers_recycled += 1

    async def _one(self, worker: _Worker, job: _Job) -> tuple[SandboxResult, bool]:
        iso = str(self.isolation)
        started = time.monotonic()
        sent = False
        try:
            async with asyncio.timeout(job.timeout_s + _GRACE_S):  # writing the job waits on the worker too
                await worker.send(job.frame)
                sent = True
                report = await worker.read_frame()
        except TimeoutError:
            return SandboxResult(
                Verdict.TIMEOUT,
                f"worker did not {'answer' if sent else 'take the job'} within {job.timeout_s + _GRACE_S:g} s",
                iso,
                time.monotonic() - started,
            ), False
        except _BadFrame as exc:
            return SandboxResult(Verdict.INTERNAL_ERROR, f"the worker sent {exc}", iso), False
        except (asyncio.IncompleteReadError, ConnectionError, BrokenPipeError) as exc:
            # The worker died mid-job (e.g. killed by its own job, or its namespace's init was killed).
            elapsed = time.monotonic() - started
            return SandboxResult(
                Verdict.CRASHED,
                f"sandbox worker died during the job ({type(exc).__name__}; {await worker.exit_status()})",
                iso,
                elapsed,
                extra={"worker_died": True},
            ), False
        if report.get("id") != job.frame["id"]:
            return SandboxResult(Verdict.INTERNAL_ERROR, "worker answered out of order", iso), False
        if report.get("worker_died"):  # a process of the worker's own died during the job: as if the worker had
            detail = f"sandbox worker failed during the job ({str(report['worker_died'])[:200]})"
            return SandboxResult(Verdict.CRASHED, detail, iso, extra={"worker_died": True}), False
        verdict, detail = classify(report, file_limit_bytes=job.file_limit, timeout_s=job.timeout_s)
        result = SandboxResult(
            verdict=verdict,
            detail=detail,
            isolation=iso,
            elapsed_s=float(report.get("elapsed_s", time.monotonic() - started)),
            stdout=str(report.get("stdout", "")),
            stderr=str(report.get("stderr", "")),
            value=str(report["value"]) if verdict is Verdict.PASS and report.get("value") is not None else None,
            extra={"stray_processes": report.get("stray_processes", 0)},
        )
        if report.get("replace_worker"):
            _log.info("sandbox_worker_replaced", reason=str(report["replace_worker"])[:200])
        return result, not report.get("stray_processes") and not report.get("replace_worker")

    def _finish(self, job: _Job, result: SandboxResult) -> None:
        self._stats.jobs += 1
        self._stats.verdicts[str(result.verdict)] += 1
        if result.verdict is not Verdict.PASS:
            _log.debug("sandbox_verdict", verdict=str(result.verdict), detail=result.detail[:200])
        if not result.isolation:
            result = replace(result, isolation=str(self.isolation))
        if not job.future.done():
            job.future.set_result(result)


_pools_created = itertools.count()


def _private_uid_base(slots: int) -> int:
    """A uid range for one pool, distinct per process and per pool within it (well above system/user uids)."""
    index = (os.getpid() * 64 + next(_pools_created)) % 1_000_000
    return 1_000_000 + index * max(64, slots)
