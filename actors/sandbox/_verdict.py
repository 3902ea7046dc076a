"""Sandbox verdicts and results: what a job's end means, decided from facts the worker reports.

Contract: exactly one verdict per job. ``PASS`` only when the worker's judge — outside the job process —
ran every test to its end on the values the job returned (see ``_worker``); never from exit codes, stdout
or anything the job writes. Limits take precedence over the judge: a job that passed its tests but went on past
its deadline or output cap is a failure, and so is one whose ``MemoryError`` reached the judge (raised out of the
job's code, or while it answered a test). A ``MemoryError`` the job catches itself and recovers from is not seen
outside it — anything inside the job process is the candidate's to forge — and the limit held (the allocation was
refused): the verdict is then the judge's, from the values the job returns. Every result names the isolation level
it ran under. Pure functions, no I/O.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    CRASHED = "crashed"
    ISOLATION_REFUSED = "isolation_refused"
    INTERNAL_ERROR = "internal_error"


# Verdicts after which the worker is recycled: the job hit a limit, so its namespace may hold leftovers.
RECYCLE_AFTER: frozenset[Verdict] = frozenset(
    {Verdict.TIMEOUT, Verdict.MEMORY_LIMIT, Verdict.OUTPUT_LIMIT, Verdict.CRASHED, Verdict.INTERNAL_ERROR}
)


@dataclass(frozen=True)
class SandboxResult:
    verdict: Verdict
    detail: str = ""  # which test failed, which limit was hit, which signal
    isolation: str = ""  # the isolation level in force for this job
    elapsed_s: float = 0.0  # the job's own wall time inside the worker (pool overhead excluded)
    stdout: str = ""  # capped
    stderr: str = ""  # capped
    value: str | None = None  # python-expr mode: repr of the expression's value (exact literal types only)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASS

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": str(self.verdict),
            "reward": 1.0 if self.passed else 0.0,
            "detail": self.detail,
            "isolation": self.isolation,
            "elapsed_s": round(self.elapsed_s, 6),
            "stdout": self.stdout,
            "stderr": self.stderr,
        }


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify(report: dict[str, Any], *, file_limit_bytes: int, timeout_s: float) -> tuple[Verdict, str]:
    """Map the worker's raw report of one job to a verdict and a one-line detail."""
    if "internal_error" in report:
        return Verdict.INTERNAL_ERROR, "worker error: " + str(report["internal_error"]).strip().splitlines()[-1]
    sig = report.get("signal")
    if report.get("timed_out"):
        return Verdict.TIMEOUT, f"wall-clock limit of {timeout_s:g} s exceeded"
    if sig in (signal.SIGXCPU, signal.SIGKILL) and not report.get("passed"):
        # SIGKILL without our timeout is the hard RLIMIT_CPU (soft + 1 s) or the kernel's OOM killer.
        return Verdict.TIMEOUT, f"CPU-time limit exceeded ({_signal_name(sig)})"
    if sig == signal.SIGXFSZ or max(report.get("stdout_bytes", 0), report.get("stderr_bytes", 0)) >= file_limit_bytes:
        return Verdict.OUTPUT_LIMIT, f"output or file-size limit of {file_limit_bytes} bytes reached"
    if report.get("memory_error"):
        return Verdict.MEMORY_LIMIT, str(report.get("detail") or "address-space limit reached")
    if sig is not None and sig != signal.SIGPIPE:  # SIGPIPE: it wrote to a pipe (or the judge's socket) already closed
        return Verdict.CRASHED, f"killed by {_signal_name(sig)}"
    if report.get("passed"):
        return Verdict.PASS, ""
    detail = str(report.get("detail") or "")
    if not detail:
        code = report.get("exit_code")
        detail = f"exited (status {code}) before the checks finished"
    return Verdict.FAIL, detail
