"""Helper processes: run a verifier's function in a killable, memory-limited process, never on the event loop.

    helpers = shared_helpers("math", memory_mb=1024, preload=("sympy",))
    equal = await helpers.call("actors.domains._verifiers._math:answers_equal", ("2x+1", "1+2*x"), timeout_s=2)

Contract: ``call`` runs ``module:function(*args, **kwargs)`` in one of up to ``processes`` warm helper processes
(an address-space limit of ``memory_mb``, modules in ``preload`` imported before the first call) and returns its
result, which must be JSON data (an object with an ``as_dict()`` is sent as that dict; an awaitable is awaited
in the helper). It raises `HelperTimeout` when the call outlasts ``timeout_s`` — the helper is then killed, so
nothing keeps computing or growing after the verdict — `HelperMemoryError` when the call ran out of address
space, and `HelperError` for anything else (the function raised — its message ends with where, ``(at file:line
in function)`` —; the helper died). Time spent starting a helper, importing the function's module there (each up to
``start_timeout_s``) or waiting for a free one does not count against ``timeout_s``. A killed or dead helper is
replaced on the next call; a kill takes every process the helper started (it leads a session of its own). Each
reply must carry its request's id, and a process the function forked never replies (it exits where the helper would
answer). What a function prints goes to this process's stderr (a replica's log). Calls are made from a thread, so a
pool serves any event loop; helpers exit when their parent does.

A process-wide pool per name (``shared_helpers``): the math verifier's symbolic checks and each user's
``module:function`` verifier get one, made on first use.

Non-goals: isolation from the host (helpers run the project's and the user's own code with our rights; untrusted
*code* goes to the sandbox, untrusted *text* may come here); CPU fairness between callers.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import queue
import select
import signal
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
import asyncio, importlib, inspect, json, os, resource, struct, sys, traceback
settings = json.loads(sys.argv[1])
main_pid = os.getpid()
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

def where(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != "<string>"]
    return f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""

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
        if request.get("load"):  # the import alone, on the caller's start-up clock
            out = True
        else:
            out = functions[target](*request["args"], **request["kwargs"])
            if inspect.isawaitable(out):
                async def wait(awaitable=out):
                    return await awaitable
                out = asyncio.run(wait())
            if callable(getattr(out, "as_dict", None)):
                out = out.as_dict()
        reply = {"id": request["id"], "ok": out}
        json.dumps(reply)
    except MemoryError:
        reply = {"id": request["id"], "error": {"type": "MemoryError", "msg": "address-space limit reached"}}
    except BaseException as exc:
        reply = {"id": request["id"], "error": {"type": type(exc).__name__, "msg": str(exc)[:300] + where(exc)}}
    if os.getpid() != main_pid:  # a process the function forked came back here: only the helper itself replies
        os._exit(0)
    try:
        send(reply)
    except (TypeError, ValueError) as exc:
        send({"id": request["id"], "error": {"type": "TypeError", "msg": f"the result is not JSON data ({exc})"[:300]}})
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
                # stderr (and what the function prints, sent there) goes where this process's goes: a replica's
                # log; a session of its own, so that a kill takes the processes the function started with it
                done.set_result(
                    subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
                )
            except BaseException as exc:
                done.set_exception(exc)


_spawner = _Spawner()


class _Helper:
    def __init__(self, argv: list[str]) -> None:
        self.proc = _spawner.spawn(argv)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.writer, self.reader = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.loaded: set[str] = set()  # the targets whose modules this helper has imported

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
        with contextlib.suppress(OSError):  # the helper and whatever it started (its own session)
            os.killpg(self.proc.pid, signal.SIGKILL)
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
        self._ids = itertools.count(1)  # each request's id, which its reply must carry

    async def call(
        self, target: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, *, timeout_s: float
    ) -> Any:
        """``target(*args, **kwargs)`` in a helper process; see the module docstring for what it raises."""
        request = {"target": target, "args": list(args), "kwargs": dict(kwargs or {}), "sys_path": _sys_path()}
        return await anyio.to_thread.run_sync(self._call, request, timeout_s, abandon_on_cancel=True)

    def _call(self, request: dict[str, Any], timeout_s: float) -> Any:
        if not self._slots.acquire(timeout=2 * self.start_timeout_s + timeout_s + 60):
            raise HelperError("no helper process became free")
        try:
            helper = self._take()
            if request["target"] not in helper.loaded:  # its module's import is start-up: not on the call's clock
                reply = self._exchange(helper, {**request, "load": True}, self.start_timeout_s, "importing")
                if "ok" not in reply:
                    self._idle.put(helper)
                    return _raise(reply, request["target"], self.memory_mb)
                helper.loaded.add(request["target"])
            reply = self._exchange(helper, request, timeout_s, "")
            self._idle.put(helper)
            self.calls += 1
        finally:
            self._slots.release()
        return reply["ok"] if "ok" in reply else _raise(reply, request["target"], self.memory_mb)

    def _exchange(self, helper: _Helper, request: dict[str, Any], timeout_s: float, doing: str) -> dict[str, Any]:
        """Send one request and read its reply (killing the helper when it outlasts ``timeout_s``, dies, or answers
        another request: a process the function forked, say)."""
        request = {**request, "id": next(self._ids)}
        try:
            helper.send(request)
            reply = helper.read(time.monotonic() + timeout_s)
            if reply.get("id") != request["id"]:
                raise HelperError(f"the helper answered request {reply.get('id')} to request {request['id']}")
        except HelperTimeout:
            self._discard(helper)
            self.killed += 1
            what = f"{doing} {request['target'].partition(':')[0]}" if doing else request["target"]
            raise HelperTimeout(f"{what} took longer than {timeout_s:g} s") from None
        except (HelperError, ValueError, OSError) as exc:
            self._discard(helper)
            raise HelperError(str(exc) or type(exc).__name__) from None
        return reply

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


def _raise(reply: dict[str, Any], target: str, memory_mb: int) -> Any:
    error: dict[str, Any] = reply["error"] if isinstance(reply.get("error"), dict) else {}
    kind, message = str(error.get("type")), str(error.get("msg"))
    if kind == "MemoryError":
        raise HelperMemoryError(f"{target} ran out of memory ({memory_mb} MB)")
    raise HelperError(f"{kind}: {message}")


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
