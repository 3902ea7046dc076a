"""Sandbox throughput: isolated trivial executions/s of the warm pool vs cold processes, on 2 cores.

    python bench/sandbox.py --quick      # ≤ 60 s; writes bench/results/sandbox.json and prints a table

Measures, in one run, with the process pinned to 2 CPUs (children inherit the affinity):
- pool: N trivial jobs (`x = 1 + 1` plus an assert test, judged by the worker on the value the job returns)
  through SandboxPool(workers=2) at its default isolation (bubblewrap), 4×workers in flight; executions/s, and
  p50/p99 of one job's round trip when jobs run one at a time (the per-job overhead: the job itself takes
  microseconds); CPU time per job of every process involved (the pool, and its workers and jobs, all reaped by
  the time the pool has closed);
- cold `python -c pass` subprocesses, and cold `bwrap … python -c pass`, two at a time.
The JSON keeps the raw figures (jobs, wall seconds, CPU seconds, load average) beside the rates.
Targets: pool ≥ 500 executions/s and ≥ 5× cold subprocesses.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.sandbox import SandboxPool
from actors.sandbox._isolation import Isolation, default_python, worker_command
from bench._common import markdown_table, percentile, write_results


def _cpu_s() -> float:
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _pin_two_cores() -> list[int]:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, cpus)
    return cpus


async def _pool_bench(jobs: int, latency_jobs: int) -> dict[str, float | str]:
    async with SandboxPool(workers=2, max_jobs_per_worker=100_000, queue_size=64) as pool:
        await asyncio.gather(*(pool.run("x = 1") for _ in range(20)))  # warm up
        sem = asyncio.Semaphore(8)

        async def one() -> str:
            async with sem:
                return str((await pool.run("x = 1 + 1", tests="assert x == 2")).verdict)

        started = time.perf_counter()
        verdicts = await asyncio.gather(*(one() for _ in range(jobs)))
        wall = time.perf_counter() - started
        rate = jobs / wall
        latencies = []
        for _ in range(latency_jobs):
            t = time.perf_counter()
            await pool.run("x = 1 + 1", tests="assert x == 2")
            latencies.append(time.perf_counter() - t)
        bad = [v for v in verdicts if v != "pass"]
        return {
            "isolation": str(pool.isolation),
            "jobs": jobs,
            "wall_s": wall,
            "executions_per_s": rate,
            "p50_ms": percentile(latencies, 50) * 1e3,
            "p99_ms": percentile(latencies, 99) * 1e3,
            "non_pass": len(bad),
        }


def _cold(argv: list[str], jobs: int, parallel: int = 2) -> dict[str, float]:
    latencies: list[float] = []
    started = time.perf_counter()
    done = 0
    while done < jobs:
        batch = min(parallel, jobs - done)
        t = time.perf_counter()
        procs = [
            subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env={}) for _ in range(batch)
        ]
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError(f"{argv[0]} failed with status {p.returncode}")
        latencies.extend([time.perf_counter() - t] * batch)
        done += batch
    wall = time.perf_counter() - started
    return {
        "jobs": jobs,
        "wall_s": wall,
        "executions_per_s": jobs / wall,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs (≤ 60 s)")
    args = parser.parse_args()
    cpus = _pin_two_cores()
    jobs, latency_jobs, cold_jobs = (2000, 300, 60) if args.quick else (10000, 1000, 200)
    load_before = os.getloadavg()[0]
    cpu_before = _cpu_s()
    pool = asyncio.run(_pool_bench(jobs, latency_jobs))
    # CPU of the pool, its workers and every job child (all reaped by the time the pool has closed):
    # 2 / cpu_per_job is what 2 idle cores could sustain, whatever else this machine is running.
    cpu_per_job = (_cpu_s() - cpu_before) / (jobs + latency_jobs + 20)
    pool["cpu_s"] = cpu_per_job * (jobs + latency_jobs + 20)
    pool["cpu_ms_per_job"] = cpu_per_job * 1e3
    pool["capacity_2_idle_cores_per_s"] = 2 / cpu_per_job
    python = default_python()
    cold_py = _cold([python, "-c", "pass"], cold_jobs)
    rows = [
        ["warm pool (" + str(pool["isolation"]) + ")", pool["executions_per_s"], pool["p50_ms"], pool["p99_ms"]],
        ["cold python -c", cold_py["executions_per_s"], cold_py["p50_ms"], cold_py["p99_ms"]],
    ]
    results: dict[str, object] = {
        "cpus": cpus,
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": os.getloadavg()[0],
        "pool": pool,
        "cold_python": cold_py,
    }
    if pool["isolation"] == "bwrap":
        bwrap_argv = worker_command(Isolation.BWRAP, python=python, slot=0, job_uid_base=61000, tmp_mb=16).argv
        bwrap_argv = [*bwrap_argv[: bwrap_argv.index(python) + 1], "-c", "pass"]
        cold_bwrap = _cold(bwrap_argv, cold_jobs)
        rows.append(
            [
                "cold bwrap python -c",
                cold_bwrap["executions_per_s"],
                cold_bwrap["p50_ms"],
                cold_bwrap["p99_ms"],
            ]
        )
        results["cold_bwrap"] = cold_bwrap
    rate = float(pool["executions_per_s"])
    ratio = rate / cold_py["executions_per_s"]
    targets = {"executions_per_s>=500": rate >= 500, "vs_cold_subprocess>=5x": ratio >= 5}
    results.update({"ratio_vs_cold_python": ratio, "targets": targets})
    path = write_results("sandbox", results)
    print(markdown_table(["runner (2 cores)", "executions/s", "p50 ms/job", "p99 ms/job"], rows))
    print()
    print(
        markdown_table(
            ["target", "value", "met"],
            [
                [
                    "≥ 500 isolated executions/s",
                    f"{rate:,.0f}/s",
                    "yes" if targets["executions_per_s>=500"] else "NO",
                ],
                ["≥ 5× cold subprocess", f"{ratio:.1f}×", "yes" if targets["vs_cold_subprocess>=5x"] else "NO"],
            ],
        )
    )
    print(
        f"\npool CPU per job {pool['cpu_ms_per_job']:.2f} ms (all processes) → capacity on 2 idle cores "
        f"≈ {pool['capacity_2_idle_cores_per_s']:,.0f}/s; load average during the run: {os.getloadavg()[0]:.1f}"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
