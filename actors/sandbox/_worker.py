"""The warm sandbox worker: runs *inside* the isolation boundary, one job at a time, and judges it from outside the job.

One file on purpose, and longer than our modules usually are: the pool executes it as a single script
(``python -I -S -B -c <this source> <json settings>``), so it imports nothing but the standard library and never
imports flywheel. The pool talks to it over stdin/stdout with frames: a 4-byte big-endian length, then a UTF-8 JSON
object (the job, then the report).

Three kinds of process, so that the one running candidate code can neither report a result nor see another job:

- the **worker** reads job frames, runs the task's tests (the *judge*) and sends the report. It is non-dumpable
  (``PR_SET_DUMPABLE 0``), so a job running under the same uid can neither open ``/proc/<worker>/fd/N`` (the pool's
  pipe) nor read its memory.
- the **template** is forked by the worker at start-up, before any job is read, and never reads job data: for each
  job it forks one **job** process from that pristine, warmed-up image, then reports the job's pid and, once it is
  reaped, its wait status. Nothing of an earlier job (code, tests, output) is in the memory a job inherits, and a
  fork costs little because the template dirties almost no pages between jobs.
- the **job** process drops to the job uid, applies rlimits, runs the candidate code (``exec``, or ``eval`` for an
  expression) and then only *answers questions* on its one socket: the value of a name, the result of a call, an
  attribute, ``len``/``iter``/``next``/``[]``/``in``. Values cross as plain data only (None, bool, int, float,
  complex, str, bytes, bytearray, list, tuple, set, frozenset, dict), read through the builtin types' own methods so
  that a subclass cannot lie about its value; any other object stays in the job and crosses as an opaque reference.

The judge runs the tests in the worker. A name the tests use resolves to the tests' own definitions, then to the
builtins, then to the job's name of that name (a plain value, or a reference); calling a reference calls into the
job. A reference compares equal only to itself and has no truth value, so an object whose ``__eq__`` always says
True, or whose ``__bool__`` does, earns nothing. PASS means "every test ran to its end in the worker, on values the
job returned": there is no pass signal for a job to forge — printing, exit codes, writing to its descriptors,
patching the harness in its own process or walking its frames earn nothing. The job never holds the tests, so it
cannot read the expected answers either. In expression mode the report carries the value's ``repr`` (plain data
only) for the caller to compare.

Limits: the job's wall clock (the worker's deadline covers start-up, the candidate and the tests; on expiry, and
after every job, the worker kills every other process of the pid namespace but pid 1, itself and the template —
setsid grandchildren included); rlimits on the job (address space, CPU, processes, file size, open files, no core
dumps); stdout/stderr go to memfds capped by RLIMIT_FSIZE and read by the worker; one answer is capped at
``max_message_bytes`` and all of a job's answers at eight times that, and the worker (tests included) has an
address-space limit of its own. After each job the worker removes
the files the job left in its scratch directories (/tmp, and /dev/shm under bubblewrap); a directory it cannot
remove, or too many entries, makes it ask to be replaced, so every job starts on empty scratch space.

Non-goals: the tests are trusted code (the task author's) and run in the worker with its rights; they may use the
job's values only as data — a test that asks for the truth value of a job's object, or orders it with ``<``, fails,
and a test cannot see what the job prints. Arguments passed to the job's functions must be plain data or the job's
own references (mutations of list/dict/set/bytearray arguments are copied back). A name of the job that shadows a
builtin is not seen by the tests. Kernel exploits, side channels, and exhaustion below the rlimits (the tmpfs's
inode count, the job's own memfds) are out of scope; see ``_isolation`` for what each isolation level contains.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import fcntl
import gc
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

_SETTINGS: dict[str, Any] = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
_JOB_UID = int(_SETTINGS.get("job_uid", -1))  # -1: jobs keep the worker's uid (the worker is not privileged)
_TMP_DIR = str(_SETTINGS.get("tmp_dir", "/tmp"))  # the job's working directory and HOME
_PID_NAMESPACE = bool(_SETTINGS.get("pid_namespace", False))  # killing "everything else" is safe only in our own
_SCRATCH = [_TMP_DIR, *(["/dev/shm"] if _SETTINGS.get("private_shm") else [])]  # emptied after every job
_MAX_MESSAGE = int(_SETTINGS.get("max_message_bytes", 8 << 20))  # one question or answer on a job's socket
_MAX_ANSWERS = 8 * _MAX_MESSAGE  # all of one job's answers together
_WORKER_MEMORY = 2 << 30  # the worker's own address space (soft limit: a job sets its own), tests included
_MAX_LEFTOVERS = 256  # scratch entries the worker removes itself; more (or a directory) and it asks to be replaced
_MAX_DEPTH = 100  # nesting of a value crossing the job's socket
_JOB_FD = 3  # the job's socket, in the job process
_PLAIN_BUDGET = 4096  # encoded size of one name's value sent with the job's first answer (larger: asked for later)

_FRAMES_IN, _FRAMES_OUT = 0, 1  # moved to high fds by main()
_TEMPLATE_PID = [0]
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 4


def _prctl(option: int, value: int) -> None:
    if _LIBC.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


# -- bytes on descriptors ------------------------------------------------------------------------------------------


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pack(obj: Any) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(data)) + data


# -- plain data across the job's socket ----------------------------------------------------------------------------


class _TooLarge(Exception):
    pass


_BIG_INT_BITS = 13_000  # below this an int's decimal form is under the 4300-digit conversion limit


def _encode(value: Any, other: Callable[[Any], Any], budget: list[int], depth: int = 0) -> Any:
    """``value`` as JSON-able plain data; ``other(obj)`` encodes what is not plain data (a reference, or raises).

    Every builtin value is read through its base type's own methods (``int.__int__``, ``list.__iter__``,
    ``dict.items``, ...), so a subclass's overrides never run and cannot misreport the value.
    """
    budget[0] -= 8  # about what a number costs in JSON; strings and bytes pay for their length below
    if budget[0] < 0 or depth > _MAX_DEPTH:
        raise _TooLarge
    if value is None or value is True or value is False:
        return value
    kind = type(value)
    if issubclass(kind, int):
        number = int.__int__(value)
        if number.bit_length() < _BIG_INT_BITS:
            return number
        budget[0] -= number.bit_length() // 4  # its hex digits, charged before they are made
        if budget[0] < 0:
            raise _TooLarge
        return {"t": "int", "v": hex(number)}
    if issubclass(kind, float):
        real = float.__float__(value)
        return real if real - real == 0.0 else {"t": "float", "v": repr(real)}  # nan and ±inf are not JSON
    if issubclass(kind, str):
        budget[0] -= str.__len__(value)  # charged before any copy: a large text the tests never asked for costs nothing
        if budget[0] < 0:
            raise _TooLarge
        return str.__str__(value)
    if issubclass(kind, complex):
        pair = complex.__complex__(value)
        return {"t": "complex", "v": [_encode(pair.real, other, budget), _encode(pair.imag, other, budget)]}
    if issubclass(kind, bytes | bytearray):
        base = bytes if issubclass(kind, bytes) else bytearray
        budget[0] -= 2 * base.__len__(value)  # charged before the copy and its hex: a large buffer the job keeps (a
        if budget[0] < 0:  # sieve) must not run the harness out of the job's memory when no test asks for it
            raise _TooLarge
        raw = base.__getitem__(value, slice(None))
        return {"t": base.__name__, "v": raw.hex()}
    if issubclass(kind, list):
        return [_encode(item, other, budget, depth + 1) for item in list.__iter__(value)]
    if issubclass(kind, tuple):
        return {"t": "tuple", "v": [_encode(item, other, budget, depth + 1) for item in tuple.__iter__(value)]}
    if issubclass(kind, dict):
        pairs = [
            [_encode(k, other, budget, depth + 1), _encode(v, other, budget, depth + 1)] for k, v in dict.items(value)
        ]
        return {"t": "dict", "v": pairs}
    if issubclass(kind, set | frozenset):
        items = set.__iter__(value) if issubclass(kind, set) else frozenset.__iter__(value)
        tag = "set" if issubclass(kind, set) else "frozenset"
        return {"t": tag, "v": [_encode(item, other, budget, depth + 1) for item in items]}
    return other(value)


def _decode(value: Any, reference: Callable[[dict[str, Any]], Any], depth: int = 0) -> Any:
    """Plain data from its JSON form; ``reference(tag)`` turns a reference into an object. Raises ValueError."""
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is float or kind is str:
        return value
    if depth > _MAX_DEPTH:
        raise ValueError("a value nested too deeply")
    if kind is list:
        return [_decode(item, reference, depth + 1) for item in value]
    if kind is not dict:
        raise ValueError(f"a value of unknown shape ({kind.__name__})")
    tag, body = value.get("t"), value.get("v")
    try:
        if tag == "ref":
            return reference(value)
        if tag in ("tuple", "set", "frozenset"):
            if type(body) is not list:
                raise ValueError("not a list")
            items = [_decode(item, reference, depth + 1) for item in body]
            return tuple(items) if tag == "tuple" else set(items) if tag == "set" else frozenset(items)
        if tag == "dict":
            if type(body) is not list or any(type(pair) is not list or len(pair) != 2 for pair in body):
                raise ValueError("not a list of pairs")
            return {_decode(k, reference, depth + 1): _decode(v, reference, depth + 1) for k, v in body}
        if tag == "int" and type(body) is str:
            return int(body, 16)
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "complex" and type(body) is list and len(body) == 2:
            real, imag = (_decode(part, reference, depth + 1) for part in body)
            if type(real) is not float or type(imag) is not float:
                raise ValueError("complex parts must be floats")
            return complex(real, imag)
        if tag in ("bytes", "bytearray") and type(body) is str:
            return bytes.fromhex(body) if tag == "bytes" else bytearray.fromhex(body)
    except TypeError as exc:  # an unhashable set member or dict key
        raise ValueError(str(exc)) from None
    raise ValueError(f"a value with an unknown tag {str(tag)[:20]!r}")


def _type_name(kind: type) -> str:
    name = type.__dict__["__name__"].__get__(kind, type)  # the real name: a metaclass may shadow __name__
    return str.__str__(name)[:80]


# -- the job: the process that runs candidate code -----------------------------------------------------------------


class _Refs:
    """The job's objects that crossed as references, by id (an object keeps one id)."""

    def __init__(self) -> None:
        self.objects: list[Any] = []
        self.ids: dict[int, int] = {}

    def encode(self, obj: Any) -> dict[str, Any]:
        ref = self.ids.get(id(obj))
        if ref is None:
            ref = self.ids[id(obj)] = len(self.objects)
            self.objects.append(obj)
        return {"t": "ref", "id": ref, "type": _type_name(type(obj)), "callable": callable(obj)}

    def resolve(self, tag: dict[str, Any]) -> Any:
        ref = tag.get("id")
        if type(ref) is not int or not 0 <= ref < len(self.objects):
            raise ValueError("an unknown reference")
        return self.objects[ref]


def _job_send(obj: Any) -> None:
    _write_all(_JOB_FD, _pack(obj))


def _job_recv() -> Any:
    (size,) = struct.unpack(">I", _read_exact(_JOB_FD, 4))
    return json.loads(_read_exact(_JOB_FD, size))


def _plain(value: Any, refs: _Refs, budget: int) -> Any:
    data = _encode(value, refs.encode, [budget])
    if len(json.dumps(data)) > budget:
        raise _TooLarge
    return data


def _error(exc: BaseException) -> dict[str, str]:
    try:
        text = str(exc)[:300]
    except BaseException:
        text = "(its message could not be read)"
    return {"type": _type_name(type(exc)), "msg": text}


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def _answer(request: dict[str, Any], namespace: dict[str, Any], refs: _Refs) -> dict[str, Any]:
    """One question from the judge, answered in the job (where candidate code may run)."""
    op = request.get("op")
    if op == "get":
        name = request.get("name")
        if type(name) is not str or name not in namespace:
            return {"missing": True}
        return {"v": _plain(namespace[name], refs, _MAX_MESSAGE // 2)}
    target = refs.resolve({"id": request.get("ref")})
    args = [_decode(arg, refs.resolve) for arg in request.get("args", ())]
    kwargs = {str(k): _decode(v, refs.resolve) for k, v in dict(request.get("kwargs", {})).items()}
    try:
        if op == "call":
            result = target(*args, **kwargs)
        elif op == "attr":
            result = getattr(target, str(request.get("name")))
        elif op == "len":
            result = len(target)
        elif op == "iter":
            result = iter(target)
        elif op == "next":
            result = next(target)
        elif op == "getitem":
            result = target[args[0]]
        elif op == "contains":
            result = args[0] in target
        else:
            return {"broken": f"unknown op {str(op)[:20]!r}"}
    except BaseException as exc:
        return {"raise": _error(exc)}
    reply: dict[str, Any] = {"v": _plain(result, refs, _MAX_MESSAGE // 2)}
    mutable = (list, dict, set, bytearray)
    changed = [[i, _plain(arg, refs, _MAX_MESSAGE // 4)] for i, arg in enumerate(args) if type(arg) in mutable]
    changed += [[k, _plain(arg, refs, _MAX_MESSAGE // 4)] for k, arg in kwargs.items() if type(arg) in mutable]
    if changed:
        reply["mut"] = changed
    return reply


def _serve(namespace: dict[str, Any], refs: _Refs) -> NoReturn:
    while True:
        try:
            request = _job_recv()
        except BaseException:  # EOF: the judge is done (or gone)
            _flush()
            os._exit(0)
        try:
            reply = _answer(request, namespace, refs)
        except _TooLarge:
            reply = {"too_large": True}
        except BaseException as exc:
            reply = {"broken": f"{_type_name(type(exc))}: {str(exc)[:200]}"}
        _flush()
        _job_send(reply)


def _run_candidate(job: dict[str, Any], refs: _Refs) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the candidate; returns its namespace and the first answer (ready, or why not)."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    code, mode = str(job["code"]), job.get("mode", "exec")
    try:
        if mode == "expr":
            value = eval(compile(code, "<candidate>", "eval"), namespace)
            _flush()
            try:
                return namespace, {"ready": True, "value": _plain(value, refs, _MAX_MESSAGE // 2)}
            except _TooLarge:
                return namespace, {"ready": False, "too_large": True}
        exec(compile(code, "<candidate>", "exec"), namespace)
    except SystemExit as exc:
        if job.get("tests") or exc.code not in (None, 0):
            return namespace, {"ready": False, "exit": repr(exc.code)[:100]}
        # a plain program that exits cleanly has run to completion
    except BaseException as exc:
        return namespace, {"ready": False, "error": _error(exc)}
    _flush()
    names: dict[str, Any] = {}
    room = _MAX_MESSAGE // 4
    for name, value in list(dict.items(namespace)):
        if type(name) is not str or name.startswith("__"):
            continue
        try:
            names[name] = _plain(value, refs, min(_PLAIN_BUDGET, room))
            room -= len(json.dumps(names[name]))
        except _TooLarge:
            names[name] = {"t": "ask"}  # too large to send unasked
    return namespace, {"ready": True, "names": names}


def _job_main(fds: list[int]) -> NoReturn:
    """The job process: isolate, receive the job, run the candidate, answer questions. Never returns."""
    try:
        os.setsid()
        rpc, out, err = (fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds)  # out of the way of 0-3
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)  # the stdio objects made in main() write to fds 0-2: no per-job wrappers
        os.dup2(err, 2)
        os.dup2(rpc, _JOB_FD)
        os.closerange(_JOB_FD + 1, 1 << 20)  # the template's socket, the received fds, anything else
        if _JOB_UID >= 0:
            os.setgroups([])
            os.setgid(_JOB_UID)
            os.setuid(_JOB_UID)
        if not _PID_NAMESPACE:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # set after setuid, which clears it
            if os.getppid() == 1:
                os._exit(0)
        os.chdir(_TMP_DIR)
        job = _job_recv()
        limits = job["limits"]
        for name, value in (
            ("RLIMIT_AS", limits["memory_bytes"]),
            ("RLIMIT_CPU", limits["cpu_s"]),
            ("RLIMIT_NPROC", limits["nproc"]),
            ("RLIMIT_FSIZE", limits["file_bytes"]),
            ("RLIMIT_NOFILE", limits["nofile"]),
            ("RLIMIT_CORE", 0),
        ):
            hard = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU first, SIGKILL a second later
            resource.setrlimit(getattr(resource, name), (value, hard))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; exceeding RLIMIT_FSIZE should kill
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        gc.enable()
        refs = _Refs()
        namespace, first = _run_candidate(job, refs)
        _job_send(first)
        if first.get("ready"):
            _serve(namespace, refs)
    except BaseException:
        try:
            _job_send({"ready": False, "broken": "harness error: " + traceback.format_exc()[-300:]})
        except BaseException:
            pass
    _flush()
    os._exit(0)


# -- the template: pristine, forks one job process per request -----------------------------------------------------


def _template_main(control: socket.socket) -> NoReturn:
    try:
        if not _PID_NAMESPACE:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() == 1:
                os._exit(0)
        while True:
            message, fds, _, _ = socket.recv_fds(control, 16, 3)
            if not message or len(fds) != 3:
                os._exit(0)
            pid = os.fork()
            if pid == 0:
                _job_main(fds)
            for fd in fds:
                os.close(fd)
            control.send(b"p" + struct.pack(">i", pid))
            _, status = os.waitpid(pid, 0)
            control.send(b"s" + struct.pack(">i", status))
    except BaseException:
        pass
    os._exit(0)


# -- the judge: runs the tests in the worker against the job's answers ---------------------------------------------


class JobGone(BaseException):
    """The job ended, or broke the protocol, while the judge was asking it something (tests cannot catch it)."""


class Deadline(BaseException):
    """The job's wall-clock limit ran out while judging (tests cannot catch it)."""


class CandidateError(Exception):
    """The job raised an exception whose type is not a builtin one."""


class Remote:
    """An object that stays in the job. Calls, attributes and the container protocol are asked of the job; it
    equals only itself, and has no truth value and no order (a job's object cannot vouch for itself)."""

    __slots__ = ("_conn", "_id", "_type")

    def __init__(self, conn: _Conn, ref: int, type_name: str) -> None:
        self._conn, self._id, self._type = conn, ref, type_name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.op("call", self._id, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._conn.op("attr", self._id, name=name)

    def __len__(self) -> int:
        n = self._conn.op("len", self._id)
        if type(n) is not int:
            raise TypeError("the job's __len__ did not return an int")
        return n

    def __iter__(self) -> Any:
        return self._conn.op("iter", self._id)

    def __next__(self) -> Any:
        return self._conn.op("next", self._id)

    def __getitem__(self, key: Any) -> Any:
        return self._conn.op("getitem", self._id, (key,))

    def __contains__(self, item: Any) -> bool:
        found = self._conn.op("contains", self._id, (item,))
        if type(found) is not bool:
            raise TypeError("the job's __contains__ did not return a bool")
        return found

    def __eq__(self, other: object) -> bool:
        return type(other) is Remote and other._conn is self._conn and other._id == self._id

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(("job", self._id))

    def __bool__(self) -> bool:
        raise TypeError(f"the truth value of the job's {self._type} object is not trusted; compare plain values")

    def __repr__(self) -> str:
        return f"<job's {self._type} object>"


class _Conn:
    """The worker's end of one job's socket: a question, an answer, within the job's deadline."""

    def __init__(self, fd: int, deadline: float) -> None:
        self.fd, self.deadline = fd, deadline
        os.set_blocking(fd, False)
        self.poller = select.poll()
        self.names: dict[str, Any] | None = None  # the job's names as of its first answer, until a call runs its code
        self.seen: dict[str, Any] = {}  # names already resolved since the job last ran code
        self.memory_error = False
        self.received = 0

    def _wait(self, event: int) -> None:
        remaining = self.deadline - time.monotonic()
        self.poller.register(self.fd, event)
        try:
            if remaining <= 0 or not self.poller.poll(remaining * 1000):
                raise Deadline
        finally:
            self.poller.unregister(self.fd)

    def _read(self, n: int) -> bytes:
        self.received += n
        if self.received > _MAX_ANSWERS:
            raise JobGone(f"the job's answers are over {_MAX_ANSWERS} bytes")
        chunks = []
        while n:
            try:
                chunk = os.read(self.fd, min(n, 1 << 20))
            except BlockingIOError:
                self._wait(select.POLLIN)
                continue
            except OSError as exc:
                raise JobGone(f"the job's socket failed ({exc.strerror})") from None
            if not chunk:
                raise JobGone("the job ended")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def send(self, obj: Any) -> None:
        view = memoryview(_pack(obj))
        while view:
            try:
                view = view[os.write(self.fd, view) :]
            except BlockingIOError:
                self._wait(select.POLLOUT)
            except OSError as exc:
                raise JobGone(f"the job's socket failed ({exc.strerror})") from None

    def recv(self) -> dict[str, Any]:
        (size,) = struct.unpack(">I", self._read(4))
        if size > _MAX_MESSAGE:
            raise JobGone(f"the job sent a message of {size} bytes")
        try:
            message = json.loads(self._read(size))
        except (ValueError, RecursionError, MemoryError):
            raise JobGone("the job sent a malformed message") from None
        if type(message) is not dict:
            raise JobGone("the job sent a malformed message")
        if "broken" in message:
            raise JobGone("the job broke the protocol: " + str(message["broken"])[:200])
        if message.get("too_large"):
            raise JobGone(f"the job's value is over {_MAX_MESSAGE // 2} bytes")
        return message

    def decode(self, value: Any) -> Any:
        try:
            return _decode(value, self._reference)
        except (ValueError, RecursionError, MemoryError) as exc:
            raise JobGone(f"the job sent a malformed value ({exc})") from None

    def _reference(self, tag: dict[str, Any]) -> Remote:
        ref = tag.get("id")
        if type(ref) is not int:
            raise ValueError("a reference without an id")
        return Remote(self, ref, str(tag.get("type"))[:80])

    def encode(self, value: Any) -> Any:
        def other(obj: Any) -> Any:
            if type(obj) is Remote and obj._conn is self:
                return {"t": "ref", "id": obj._id}
            raise TypeError(f"cannot pass a {type(obj).__name__} to the job: only plain data and the job's objects")

        try:
            return _encode(value, other, [_MAX_MESSAGE // 2])
        except _TooLarge:
            raise ValueError("an argument too large to pass to the job") from None

    def lookup(self, name: str) -> Any:
        if name in self.seen:
            return self.seen[name]
        if self.names is not None and name not in self.names:
            raise KeyError(name)
        known = self.names.get(name) if self.names is not None else None
        if known is not None and known != {"t": "ask"}:
            value = self.decode(known)
        else:
            self.send({"op": "get", "name": name})
            reply = self.recv()
            if reply.get("missing"):
                raise KeyError(name)
            value = self.decode(reply.get("v"))
        self.seen[name] = value
        return value

    def op(
        self, op: str, ref: int, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None, **extra: Any
    ) -> Any:
        """Ask the job to run ``op`` on its object ``ref``; the answer as plain data or a reference."""
        request: dict[str, Any] = {"op": op, "ref": ref, **extra}
        if args:
            request["args"] = [self.encode(arg) for arg in args]
        if kwargs:
            request["kwargs"] = {str(k): self.encode(v) for k, v in kwargs.items()}
        self.names, self.seen = None, {}  # the job runs code now: its names may change
        self.send(request)
        reply = self.recv()
        if "raise" in reply:
            self._raise(reply["raise"])
        if "v" not in reply:
            raise JobGone("the job sent an answer without a value")
        for key, value in reply.get("mut", ()):
            original = kwargs.get(key) if type(key) is str and kwargs else args[key] if type(key) is int else None
            _copy_back(original, self.decode(value))
        return self.decode(reply["v"])

    def _raise(self, info: Any) -> NoReturn:
        info = info if type(info) is dict else {}
        kind, message = str(info.get("type"))[:80], str(info.get("msg"))[:300]
        if kind == "MemoryError":
            self.memory_error = True
        cls = getattr(builtins, kind, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                error = cls(message)
            except Exception:
                error = None
            if error is not None:
                raise error
        raise CandidateError(f"{kind}: {message}")


def _copy_back(original: Any, new: Any) -> None:
    """A list/dict/set/bytearray argument the job's function mutated: make the tests' object say the same."""
    if type(original) is not type(new):
        return
    if type(original) in (list, bytearray):
        original[:] = new
    elif type(original) in (dict, set):
        original.clear()
        original.update(new)


class _TestNamespace(dict[str, Any]):
    """The tests' globals: their own names, then the builtins, then the job's names."""

    def __init__(self, conn: _Conn) -> None:
        super().__init__(__name__="__main__", __builtins__=builtins)
        self._conn = conn

    def __missing__(self, name: str) -> Any:
        if name.startswith("__") or name in _BUILTIN_NAMES:
            raise KeyError(name)
        return self._conn.lookup(name)


_BUILTIN_NAMES = frozenset(vars(builtins))


def _failed_test(exc: BaseException, tests: str) -> str:
    """Name the failing test: the line of the tests source that raised, or the exception."""
    line_no = 0
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == "<tests>":
            line_no = lineno
    kind = type(exc).__name__
    if line_no:
        lines = tests.splitlines()
        text = lines[line_no - 1].strip() if 0 < line_no <= len(lines) else ""
        return f"test failed at tests line {line_no}: {text[:200]} ({kind}: {str(exc)[:200]})"
    return f"test raised {kind}: {str(exc)[:200]}"


def _no_references(tag: dict[str, Any]) -> NoReturn:
    raise ValueError("not plain data")


def _on_alarm(signum: int, frame: Any) -> None:
    raise Deadline


def _judge(conn: _Conn, mode: str, tests: str) -> dict[str, Any]:
    """Decide the job from its answers: passed, detail, value (expression mode), and what went wrong."""
    verdict: dict[str, Any] = {"passed": False, "detail": "", "value": None, "memory_error": False}
    try:
        first = conn.recv()
        if not first.get("ready"):
            error: dict[str, Any] = first["error"] if type(first.get("error")) is dict else {}
            kind = str(error.get("type"))[:80]
            if "exit" in first:
                code = str(first["exit"])[:60]
                verdict["detail"] = f"exit({code}) called in the candidate, before the checks finished"
            else:
                verdict["detail"] = f"candidate raised {kind}: {str(error.get('msg'))[:300]}"
                verdict["memory_error"] = kind == "MemoryError"
            return verdict
        if mode == "expr":
            value = first.get("value")
            if type(value) is dict and value.get("t") == "ref":
                verdict["detail"] = f"the expression's value is not a plain literal (got {str(value.get('type'))[:60]})"
                return verdict
            try:
                text = repr(_decode(value, _no_references))
            except ValueError:  # a reference inside a container, or an int over the conversion limit
                text = ""
            if not text or len(text) > 100_000:
                verdict["detail"] = "the expression's value is not plain data, or too large to report"
                return verdict
            verdict.update(passed=True, value=text)
            return verdict
        if not tests:
            verdict["passed"] = True  # a program without tests: it ran to completion
            return verdict
        names = first.get("names")
        conn.names = names if type(names) is dict else {}
        namespace = _TestNamespace(conn)
        signal.setitimer(signal.ITIMER_REAL, max(0.001, conn.deadline - time.monotonic()))
        try:
            exec(compile(tests, "<tests>", "exec"), namespace)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        verdict["passed"] = True
    except Deadline:
        verdict["timed_out"] = True
    except JobGone as exc:
        verdict["job_gone"] = True
        verdict["detail"] = str(exc)
    except BaseException as exc:
        verdict["detail"] = _failed_test(exc, tests)
    verdict["memory_error"] = verdict["memory_error"] or conn.memory_error
    return verdict


# -- the worker: one job after another -----------------------------------------------------------------------------


class _TemplateGone(Exception):
    pass


def _ask_template(control: socket.socket, deadline: float) -> tuple[str, int] | None:
    """The template's next message (``("p", pid)`` or ``("s", status)``), or None at the deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not select.select([control], [], [], remaining)[0]:
        return None
    message = control.recv(16)
    if len(message) != 5:
        raise _TemplateGone("the template process is gone")
    return chr(message[0]), struct.unpack(">i", message[1:])[0]


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True  # gone


def _reap_orphans() -> None:
    """As pid 1 (unshare), orphans are ours to reap; the template is reaped here only if it died."""
    if os.getpid() != 1:
        return
    try:
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if not pid:
                return
            if pid == _TEMPLATE_PID[0]:
                _TEMPLATE_PID[0] = -1
    except ChildProcessError:
        return


def _kill_uid() -> int:
    """Without a pid namespace, as root: kill every process whose real uid is the job uid; returns how many.

    Each is opened as a pidfd before its uid is read, so a pid reused in between is never signalled.
    """
    found: set[int] = set()
    needle = f"\nUid:\t{_JOB_UID}\t".encode()
    for _ in range(50):
        hits = 0
        for pid in _pids():
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                with open(f"/proc/{pid}/status", "rb") as f:
                    if needle in f.read():
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                        found.add(pid)
                        hits += 1
            except OSError:
                pass
            finally:
                os.close(pidfd)
        if not hits:
            break
        time.sleep(0.002)
    return len(found)


def _sweep(job_pid: int) -> int:
    """Kill whatever the job left running, and wake the template (a job with our uid may have stopped it: that
    must not cost the next job); returns how many processes were killed.

    In our own pid namespace: every process but pid 1, this worker and the template (setsid grandchildren
    included). Without one, as root: every process of the job uid. Otherwise only the job's process group.
    """
    try:
        return _kill_leftovers(job_pid)
    finally:
        with contextlib.suppress(OSError):
            os.kill(_TEMPLATE_PID[0], signal.SIGCONT)


def _kill_leftovers(job_pid: int) -> int:
    if not _PID_NAMESPACE:
        if _JOB_UID >= 0:
            return _kill_uid()
        try:
            os.killpg(job_pid, signal.SIGKILL)
        except OSError:
            pass
        return 0
    keep = {1, os.getpid(), _TEMPLATE_PID[0]}
    found: set[int] = set()
    for _ in range(200):
        _reap_orphans()
        live = [pid for pid in _pids() if pid not in keep and not _is_zombie(pid)]
        if not live:
            break
        found.update(live)
        for pid in live:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.001)
    return len(found - {job_pid})


def _clear_scratch() -> str:
    """Remove what the job left in the scratch directories; '' when they are empty again, else why they are not."""
    for top in _SCRATCH:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        if len(names) > _MAX_LEFTOVERS:
            return f"the job left {len(names)} entries in {top}"
        for name in names:
            path = os.path.join(top, name)
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    _remove_tree(path)
                else:
                    os.unlink(path)
            except OSError as exc:
                return f"cannot remove {path} ({exc.strerror})"
    return ""


def _remove_tree(path: str) -> None:
    entries = 0
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + dirs:
            entries += 1
            if entries > _MAX_LEFTOVERS:
                raise OSError(0, "too many entries")
            full = os.path.join(root, name)
            if name in dirs and not os.path.islink(full):
                os.rmdir(full)
            else:
                os.unlink(full)
    os.rmdir(path)


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        try:
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        except ValueError:
            return f"killed by signal {os.WTERMSIG(status)}"
    return f"exited (status {os.WEXITSTATUS(status) if os.WIFEXITED(status) else status})"


def _text(value: Any) -> str:
    """A string the pool can log and print: lone surrogates (from a job's messages) become U+FFFD."""
    return str(value).encode("utf-8", "replace").decode("utf-8")


def _read_memfd(fd: int, cap: int) -> tuple[int, str]:
    size = os.fstat(fd).st_size
    return size, os.pread(fd, min(cap, size), 0).decode("utf-8", "replace") if size else ""


def _run_job(job: dict[str, Any], control: socket.socket) -> dict[str, Any]:
    started = time.monotonic()
    timeout = float(job["timeout_s"])
    deadline = started + max(0.0, timeout)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out = os.memfd_create("stdout", os.MFD_CLOEXEC)
    err = os.memfd_create("stderr", os.MFD_CLOEXEC)
    try:
        socket.send_fds(control, [b"j"], [theirs.fileno(), out, err])
        theirs.close()
        forked = _ask_template(control, time.monotonic() + 10)
        if forked is None or forked[0] != "p":
            raise _TemplateGone("the template process did not fork the job")
        job_pid = forked[1]
        conn = _Conn(mine.fileno(), deadline)
        tests = str(job.get("tests") or "")
        mode = str(job.get("mode", "exec"))
        try:
            conn.send({"code": job["code"], "mode": mode, "tests": bool(tests), "limits": job["limits"]})
            verdict = _judge(conn, mode, tests)
        except (Deadline, JobGone) as exc:
            verdict = {"passed": False, "detail": "", "timed_out": isinstance(exc, Deadline)}
        mine.close()  # the job reads EOF and exits
        timed_out = bool(verdict.get("timed_out"))
        # a job that answered in time gets a moment to exit, even when the tests ended right at the deadline
        reaped = None if timed_out else _ask_template(control, max(deadline, time.monotonic() + 0.25))
        if reaped is None:  # past the deadline: kill it, then collect its status
            timed_out = True
            _sweep(job_pid)
            reaped = _ask_template(control, time.monotonic() + 10)
            if reaped is None:
                raise _TemplateGone("the job could not be killed")
        status = reaped[1]
        elapsed = time.monotonic() - started
        if verdict.get("job_gone") and verdict.get("detail") == "the job ended":
            verdict["detail"] = _ended(status) + " before the checks finished"
        stray = _sweep(job_pid)
        leftovers = _clear_scratch()
        cap = int(job["output_cap"])
        out_size, out_text = _read_memfd(out, cap)
        err_size, err_text = _read_memfd(err, cap)
    finally:
        os.close(out)
        os.close(err)
        mine.close()
    return {
        "id": job["id"],
        "timed_out": timed_out,
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "passed": bool(verdict.get("passed")),
        "value": _text(verdict.get("value")) if verdict.get("value") is not None else None,
        "detail": _text(verdict.get("detail") or ""),
        "memory_error": bool(verdict.get("memory_error")),
        "stdout": out_text,
        "stderr": err_text,
        "stdout_bytes": out_size,
        "stderr_bytes": err_size,
        "elapsed_s": elapsed,
        "stray_processes": stray,
        "replace_worker": leftovers,
    }


def _warm_up() -> None:
    """Run the job's code paths once before the template is forked, so that a job dirties fewer inherited pages."""
    refs = _Refs()
    sample = "import sys\nx = [1, 2.5, 'a', (3,), {4: None}]\ndef f(a, b=1):\n    return a + b\n"
    namespace, first = _run_candidate({"code": sample, "mode": "exec"}, refs)
    json.loads(json.dumps(first))
    request = {"op": "call", "ref": first["names"]["f"]["id"], "args": [1], "kwargs": {"b": 2}}
    json.loads(json.dumps(_answer(json.loads(json.dumps(request)), namespace, refs)))
    _run_candidate({"code": "1 + 1", "mode": "expr"}, refs)


def _exit_builtin(code: object = None) -> NoReturn:
    raise SystemExit(code)


def main() -> None:
    global _FRAMES_IN, _FRAMES_OUT
    _prctl(_PR_SET_DUMPABLE, 0)  # a job with our uid must not reach our descriptors or memory through /proc
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard == resource.RLIM_INFINITY or hard > _WORKER_MEMORY:
        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_MEMORY, hard))
    # Frames move to high fds; 0-2 become /dev/null so that the stdio objects built here, once, serve
    # every job after it dup2()s its output files over fds 1 and 2.
    _FRAMES_IN, _FRAMES_OUT = os.dup(0), os.dup(1)
    null_fd = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null_fd, fd)
    os.close(null_fd)
    # These live for the worker's lifetime and are inherited by every job: no context manager.
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(  # noqa: SIM115
        1, "w", closefd=False, buffering=1 << 16, encoding="utf-8", errors="backslashreplace"
    )
    sys.stderr = open(2, "w", closefd=False, buffering=1, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
    builtins.exit = builtins.quit = _exit_builtin  # type: ignore[assignment]  # -S skips site, which installs them
    os.environ.clear()  # the jobs' environment, set once here rather than in every job
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": _TMP_DIR, "LANG": "C.UTF-8"})
    signal.signal(signal.SIGALRM, _on_alarm)
    # Each page a job writes costs a copy-on-write fault: warm the paths a job takes, and keep the collector from
    # walking (and so writing to) the inherited heap.
    gc.disable()
    _warm_up()
    gc.collect()
    gc.freeze()
    control, template_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        os.close(_FRAMES_IN)
        os.close(_FRAMES_OUT)
        control.close()
        _template_main(template_end)
    _TEMPLATE_PID[0] = pid
    template_end.close()
    gc.enable()  # the judge runs tests here
    _write_all(_FRAMES_OUT, _pack({"ready": True, "pid": os.getpid(), "uid": os.getuid()}))
    while True:
        try:
            (size,) = struct.unpack(">I", _read_exact(_FRAMES_IN, 4))
            job = json.loads(_read_exact(_FRAMES_IN, size))
        except EOFError:  # the pool let go: the template exits on its socket's EOF, and is reaped (so that its
            control.close()  # jobs' CPU time reaches the pool's rusage)
            if _TEMPLATE_PID[0] > 0:
                os.waitpid(_TEMPLATE_PID[0], 0)
            return
        fatal = False
        try:
            report = _run_job(job, control)
        except _TemplateGone as exc:  # killed by the job (as a normal user it has our uid), or from outside
            report, fatal = {"id": job.get("id"), "worker_died": str(exc)}, True
        except Exception:
            report = {"id": job.get("id"), "internal_error": traceback.format_exc()[-2000:]}
        _write_all(_FRAMES_OUT, _pack(report))
        if fatal:
            return


if __name__ == "__main__":
    main()
