"""LocalRuntime: one OS process per actor replica on this machine, supervised.

Contract:
- Each replica runs ``python -m topology.runtime._child …`` with stdout+stderr appended to
  ``<run_dir>/logs/<actor>-<replica>.log``, ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` set from its
  ``resources.num_cpus``, the embedded bus's token in its environment (never on its command line), in its own
  session (a terminal ^C reaches the supervisor, which decides), and with ``PR_SET_PDEATHSIG(SIGKILL)``: it dies
  with the supervisor, even a SIGKILLed one — no orphans.
- A replica that exits non-zero (or is killed) while the topology runs is restarted after the policy's
  backoff; its status record says ``restarting`` meanwhile. One that crashes more than ``max_restarts``
  times within ``window_s`` stops the whole topology; the result names the actor and quotes the last lines
  of its log. Each crash is logged with the exception line its log ends with. A replica that exits 0 by
  itself is done and not restarted.
- A log past ``runtime.logs.max_mb`` is rotated (``_logs``: copied to ``<log>.1``, emptied in place) within
  ``_LOG_CHECK_S``; ``runtime.logs.keep`` copies are kept.
- The embedded nats-server is supervised too: restarted on its port with its store when it dies
  (:meth:`Session.keep_bus_up`); the replicas ride the outage out on their reconnecting connections.
- Stopping: SIGTERM to every child (they drain), wait up to ``drain_timeout_s``, SIGKILL the rest, then the
  session closes (nats-server stopped last).

Non-goals: no resource isolation beyond thread counts (no cgroups, no CPU pinning).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

import anyio
import anyio.to_thread
import structlog

from topology.runtime._logs import rotate
from topology.runtime._runtime import RunResult, RuntimeBase, RuntimeOptions, life_banner, replica_log
from topology.runtime._session import Session, open_session
from topology.runtime._threads import thread_env

if TYPE_CHECKING:
    from topology._spec import Spec

_log = structlog.get_logger("flywheel.runtime")
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.05
_LOG_CHECK_S = 5.0  # how often the replicas' log sizes are looked at

_prctl: Any
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork: the child only calls it
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class LocalRuntime(RuntimeBase):
    """Runs each replica as its own supervised OS process. See the module docstring."""

    def __init__(
        self,
        spec: Spec,
        *,
        python: Sequence[str] = (sys.executable,),
        **options: Unpack[RuntimeOptions],
    ) -> None:
        super().__init__(spec, **options)
        self.python = tuple(python)
        self.procs: dict[tuple[str, int], subprocess.Popen[bytes]] = {}

    async def run(self, *, duration_s: float | None = None) -> RunResult:
        async with open_session(self.spec, run_root=self.run_root, resume=self.resume) as session:
            self.session = session
            _log.info("topology up", topology=self.spec.name, run_dir=str(session.run_dir), bus=session.bus_url)
            try:
                async with anyio.create_task_group() as tg:
                    self.start_watchers(tg, session, duration_s)
                    for key in self.replica_keys():
                        tg.start_soon(self._supervise, session, key)
                    tg.start_soon(self._rotate_logs, session)
                    self.started.set()
                    await self.wait_stop()
                    await self._shutdown()
                    tg.cancel_scope.cancel()
            finally:
                self._kill_all()  # also on cancellation or an error above: never leave a child behind
            return self.result(session)

    def _spawn(self, session: Session, key: tuple[str, int], restarts: int) -> subprocess.Popen[bytes]:
        actor, replica = key
        log_path = replica_log(session.run_dir, actor, replica)
        cmd = [
            *self.python,
            "-m",
            "topology.runtime._child",
            "--spec",
            str(self.spec.source_path),
            "--actor",
            actor,
            "--replica",
            str(replica),
            "--run-dir",
            str(session.run_dir),
            "--bus-url",
            session.bus_url,
            "--restarts",
            str(restarts),
            "--supervisor-pid",
            str(os.getpid()),
        ]
        env = {**os.environ, **thread_env(self.spec.actors[actor].resources.num_cpus), **session.replica_env()}
        # A log that cannot be opened or written (a full disk) must not bring the supervisor down: the replica starts
        # all the same (its output lost if the log cannot be opened), and what failed is logged here.
        with contextlib.ExitStack() as opened:
            out: Any = None
            try:
                out = opened.enter_context(open(log_path, "ab", buffering=0))  # unbuffered: nothing left to flush
                out.write(life_banner(actor, replica, restarts).encode())
            except OSError as exc:
                _log.warning("replica log not written", actor=actor, replica=replica, log=str(log_path), error=str(exc))
            # Popen from the event-loop thread: PDEATHSIG fires when the *forking thread* exits.
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out if out is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_die_with_parent,
                start_new_session=True,
            )
        self.procs[key] = proc
        _log.info("replica started", actor=actor, replica=replica, pid=proc.pid, restarts=restarts)
        return proc

    async def _supervise(self, session: Session, key: tuple[str, int]) -> None:
        actor, replica = key
        restarts = 0
        while not self.stopping:
            proc = self._spawn(session, key, restarts)
            started = time.time()
            while proc.poll() is None:  # noqa: ASYNC110 — a Popen's exit is not awaitable; poll it
                await anyio.sleep(_POLL_S)
            if self.stopping:
                return
            code = proc.returncode
            if code == 0:
                _log.info("replica finished", actor=actor, replica=replica)
                self.replica_finished(key)
                return
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            log = replica_log(session.run_dir, actor, replica)
            if not await self.after_crash(
                session, key, pid=proc.pid, restarts=restarts, started_at=started, how=how, log=log
            ):
                return
            restarts += 1

    async def _rotate_logs(self, session: Session) -> None:
        limits = self.spec.runtime.logs
        if limits.max_mb is None:
            return
        max_bytes, keep = int(limits.max_mb * 1024 * 1024), limits.keep

        def rotate_one(log: Path) -> bool:
            return rotate(log, max_bytes=max_bytes, keep=keep)

        while True:
            await anyio.sleep(_LOG_CHECK_S)
            for actor, replica in self.replica_keys():
                log = replica_log(session.run_dir, actor, replica)
                try:
                    if await anyio.to_thread.run_sync(rotate_one, log):
                        _log.info("log rotated", actor=actor, replica=replica, log=str(log))
                except OSError as exc:  # a full disk, say: the log goes on growing, the run goes on
                    _log.warning("log rotation failed", actor=actor, replica=replica, error=str(exc))

    async def _shutdown(self) -> None:
        live = {key: p for key, p in self.procs.items() if p.poll() is None}
        for proc in live.values():
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = self.drain_deadline()
        with anyio.move_on_after(self.drain_timeout_s):
            while any(p.poll() is None for p in live.values()) and not self._hurry.is_set():  # noqa: ASYNC110
                await anyio.sleep(_POLL_S)
        late = [f"{a}[{r}]" for (a, r), p in live.items() if p.poll() is None]
        if late:
            self.killed_at_stop(late, left_s=round(deadline - time.monotonic(), 1))
        self._kill_all()

    def _kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _log.error("replica did not die after SIGKILL", pid=proc.pid)
