"""Helper processes: run a verifier's function in a killable, memory-limited process, never on the event loop.

    helpers = shared_helpers("math", memory_mb=1024, preload=("sympy",))
    equal = await helpers.call("actors.domains._verifiers._math:answers_equal", ("2x+1", "1+2*x"), timeout_s=2)

Contract: ``call`` runs ``module:function(*args, **kwargs)`` in one of up to ``processes`` warm helper processes
(an address-space limit of ``memory_mb``, modules in ``preload`` imported before the first call) and returns its
result, which must be JSON data (an object with an ``as_dict()`` is sent as that dict; an awaitable is awaited
in the helper). It raises `HelperTimeout` when the call outlasts ``timeout_s`` — the helper is then killed, so
nothing keeps computing or growing after the verdict — `HelperMemoryError` when the call ran out of address
space, and `HelperError` for anything else (the function raised; the helper died). Time spent starting a helper
or waiting for a free one does not count against ``timeout_s``. A killed or dead helper is replaced on the next
call. Calls are made from a thread, so a pool serves any event loop; helpers exit when their parent does.

A process-wide pool per name (``shared_helpers``): the math verifier's symbolic checks and the users'
``module:function`` verifiers each get one, made on first use.

Non-goals: isolation from the host (helpers run the project's and the user's own code with our rights; untrusted
*code* goes to the sandbox, untrusted *text* may come here); CPU fairness between callers.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import anyio

_HELPER_SOURCE = r"""
import asyncio, importlib, inspect, json, os, resource, struct, sys
settings = json.loads(sys.argv[1])
sys.path[:] = settings["sys_path"]
frames_in, frames_out = os.dup(0), os.dup(1)
os.dup2(2, 1)  # a function that prints must not write into the frames
memory = settings["memory_bytes"]
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
try:
    import ctypes
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL: die with the parent
except Exception:
    pass

def send(obj):
    data = json.dumps(obj).encode()
    os.write(frames_out, struct.pack(">I", len(data)) + data)

def read_exact(n):
    out = b""
    while len(out) < n:
        chunk = os.read(frames_in, n - len(out))
        if not chunk:
            raise SystemExit(0)
        out += chunk
    return out

functions = {}
for name in settings["preload"]:
    importlib.import_module(name)
send({"ready": True})
while True:
    (size,) = struct.unpack(">I", read_exact(4))
    request = json.loads(read_exact(size))
    try:
        if request["sys_path"] != sys.path:  # the caller's path changed since we started (a test, a plugin)
            sys.path[:] = request["sys_path"]
            importlib.invalidate_caches()
        target = request["target"]
        if target not in functions:
            module, _, attr = target.partition(":")
            functions[target] = getattr(importlib.import_module(module), attr)
        out = functions[target](*request["args"], **request["kwargs"])
        if inspect.isawaitable(out):
            async def wait(awaitable=out):
                return await awaitable
            out = asyncio.run(wait())
        if callable(getattr(out, "as_dict", None)):
            out = out.as_dict()
        reply = {"ok": out}
        json.dumps(reply)
    except MemoryError:
        reply = {"error": {"type": "MemoryError", "msg": "address-space limit reached"}}
    except BaseException as exc:
        reply = {"error": {"type": type(exc).__name__, "msg": str(exc)[:300]}}
    try:
        send(reply)
    except (TypeError, ValueError) as exc:
        send({"error": {"type": "TypeError", "msg": f"the result is not JSON data ({exc})"[:300]}})
"""

_MAX_REPLY = 16 << 20


class HelperError(RuntimeError):
    """The function raised, returned something that is not JSON data, or its helper died."""


class HelperTimeout(HelperError):
    """The call outlasted its time limit; its helper was killed."""


class HelperMemoryError(HelperError):
    """The call ran out of the helper's address space."""


class _Spawner:
    """Starts helpers from one thread that lives as long as the process: a helper dies with the thread that
    started it (``PR_SET_PDEATHSIG`` follows the thread), and the threads that make calls come and go."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[list[str], Future[subprocess.Popen[bytes]]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="flywheel-helper-spawner", daemon=True)
                self._thread.start()
        done: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((argv, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            argv, done = self._requests.get()
            try:
                done.set_result(
                    subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                )
            except BaseException as exc:
                done.set_exception(exc)


_spawner = _Spawner()


class _Helper:
    def __init__(self, argv: list[str]) -> None:
        self.proc = _spawner.spawn(argv)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.writer, self.reader = self.proc.stdin.fileno(), self.proc.stdout.fileno()

    def read(self, deadline: float | None) -> dict[str, Any]:
        (size,) = struct.unpack(">I", self._read(4, deadline))
        if size > _MAX_REPLY:
            raise HelperError(f"the helper sent a reply of {size} bytes")
        reply = json.loads(self._read(size, deadline))
        if not isinstance(reply, dict):
            raise HelperError("the helper sent a reply that is not an object")
        return reply

    def _read(self, n: int, deadline: float | None) -> bytes:
        chunks = []
        while n:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and (remaining <= 0 or not select.select([self.reader], [], [], remaining)[0]):
                raise HelperTimeout
            chunk = os.read(self.reader, n)
            if not chunk:
                raise HelperError(f"the helper died ({self._status()})")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def send(self, obj: Any) -> None:
        data = json.dumps(obj).encode()
        try:
            os.write(self.writer, struct.pack(">I", len(data)) + data)
        except OSError as exc:
            raise HelperError(f"the helper is gone ({exc.strerror})") from None

    def _status(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(1)
        code = self.proc.returncode
        return "still running" if code is None else f"killed by signal {-code}" if code < 0 else f"exit {code}"

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()


class HelperPool:
    """See the module docstring."""

    def __init__(
        self, *, processes: int = 2, memory_mb: int = 1024, preload: Sequence[str] = (), start_timeout_s: float = 60.0
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.processes, self.memory_mb, self.preload = processes, memory_mb, tuple(preload)
        self.start_timeout_s = start_timeout_s
        self._idle: queue.LifoQueue[_Helper] = queue.LifoQueue()
        self._slots = threading.Semaphore(processes)
        self._live: set[_Helper] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.calls = 0
        self.killed = 0  # helpers killed at a call's time limit

    async def call(
        self, target: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, *, timeout_s: float
    ) -> Any:
        """``target(*args, **kwargs)`` in a helper process; see the module docstring for what it raises."""
        request = {"target": target, "args": list(args), "kwargs": dict(kwargs or {}), "sys_path": _sys_path()}
        return await anyio.to_thread.run_sync(self._call, request, timeout_s, abandon_on_cancel=True)

    def _call(self, request: dict[str, Any], timeout_s: float) -> Any:
        if not self._slots.acquire(timeout=self.start_timeout_s + timeout_s + 60):
            raise HelperError("no helper process became free")
        try:
            helper = self._take()
            try:
                helper.send(request)
                reply = helper.read(time.monotonic() + timeout_s)
            except HelperTimeout:
                self._discard(helper)
                self.killed += 1
                raise HelperTimeout(f"{request['target']} took longer than {timeout_s:g} s") from None
            except (HelperError, ValueError, OSError) as exc:
                self._discard(helper)
                raise HelperError(str(exc) or type(exc).__name__) from None
            self._idle.put(helper)
            self.calls += 1
        finally:
            self._slots.release()
        if "ok" in reply:
            return reply["ok"]
        error: dict[str, Any] = reply["error"] if isinstance(reply.get("error"), dict) else {}
        kind, message = str(error.get("type")), str(error.get("msg"))
        if kind == "MemoryError":
            raise HelperMemoryError(f"{request['target']} ran out of memory ({self.memory_mb} MB)")
        raise HelperError(f"{kind}: {message}")

    def _take(self) -> _Helper:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        if self._closed:
            raise HelperError("the helper pool is closed")
        settings = {
            "sys_path": _sys_path(),
            "memory_bytes": self.memory_mb << 20,
            "preload": list(self.preload),
        }
        helper = _Helper([sys.executable, "-c", _HELPER_SOURCE, json.dumps(settings)])
        with self._lock:
            self._live.add(helper)
        try:
            hello = helper.read(time.monotonic() + self.start_timeout_s)
        except (HelperError, ValueError, OSError) as exc:
            self._discard(helper)
            raise HelperError(f"a helper process failed to start ({exc or 'timed out'})") from None
        if not hello.get("ready"):
            self._discard(helper)
            raise HelperError("a helper process failed to start")
        return helper

    def _discard(self, helper: _Helper) -> None:
        helper.kill()
        with self._lock:
            self._live.discard(helper)

    def pids(self) -> list[int]:
        """The helper processes alive now."""
        with self._lock:
            return [h.proc.pid for h in self._live if h.proc.poll() is None]

    def close(self) -> None:
        self._closed = True
        with self._lock:
            live = list(self._live)
            self._live.clear()
        for helper in live:
            helper.kill()


def _sys_path() -> list[str]:
    return [os.path.abspath(p) if p else os.getcwd() for p in sys.path]


_shared: dict[str, HelperPool] = {}
_shared_lock = threading.Lock()


def shared_helpers(name: str, *, processes: int = 2, memory_mb: int = 1024, preload: Sequence[str] = ()) -> HelperPool:
    """The process-wide helper pool called ``name``, made with these settings on first use."""
    with _shared_lock:
        pool = _shared.get(name)
        if pool is None:
            pool = _shared[name] = HelperPool(processes=processes, memory_mb=memory_mb, preload=preload)
        return pool


@atexit.register
def _close_shared() -> None:
    for pool in list(_shared.values()):
        pool.close()
