"""Kill -9 soak: a real `flywheel up` under SIGKILLs of each actor, of nats-server and of the whole process tree
(followed by `flywheel up --resume`), then its ledgers compared.

    python bench/soak.py                          # the embedded default, shortened (--quick: a smaller model)
    python bench/soak.py --service --quick        # plus gateway, serving generator, joiner, recorder, gate
    python bench/soak.py --spec specs/embedded.yaml --rounds 3

Each round SIGKILLs every replica once (waiting for the supervisor to bring it back), then nats-server (waiting
for the supervisor to restart it on its port), then the process group of `flywheel up` — every process of the
run must be gone — and resumes the run with `flywheel up --resume`. With a gateway in the spec a client sends
chat requests and feedback throughout, and keeps its own ledger of what the service acknowledged; when it stops,
the run is stopped once the recorder has written every answered request (at most 60 s). After a clean stop the soak
checks, from what the run left on disk:

- learner: the messages whose effect is in the final weights (each incarnation's applications up to the step the
  next one resumed from, all of the last one's) hold no id twice; their steps leave no gap; weight versions
  never went back across restarts and resumes;
- with a gateway: every request the client got an answer to (200) is recorded on `traffic` exactly once, every
  feedback the gateway accepted is recorded once, and no joined feedback sample was applied twice.

Prints a table, writes bench/results/soak.json (figures and every check), exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.learner import effective_applied, read_metrics  # noqa: E402
from actors.protocol import read_recordings  # noqa: E402

API_KEY = "soak-key-0123456789"

QUICK = """\
name: soak
bus: {embedded: true, ack_wait_s: 10}
runtime: {kind: local, run_dir: runs, heartbeat_s: 0.5, restart: {max_restarts: 20, window_s: 60}}
policy:
  model: builtin:tiny-gpt
  config: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2, seed: 0}
  warm_start: {steps: 20, lr: 3.0e-3, batch_size: 16}
domains:
  arithmetic:
    source: builtin:arithmetic
    source_options: {digits: 1, ops: 1, operators: "+"}
    verifier: math
    group_size: 4
    heldout: 8
    max_new_tokens: 4
actors:
  source: {resources: {num_cpus: 0}, max_pending: 16, max_in_flight: 8}
  generator: {resources: {num_cpus: 0.5}, engine: torch, device: cpu, max_batch_size: 16}
  verify: {resources: {num_cpus: 0.5}, sandbox: {workers: 1}}
  learner:
    resources: {num_cpus: 1}
    device: cpu
    batch_size: 8
    publish_every_steps: 1
    checkpoint_every_steps: 5
    eval_every_steps: 20
    eval_size: 8
    max_staleness: 4
    metrics_flush_s: 1.0
"""

SERVICE = """\
  serving: {kind: generator, resources: {num_cpus: 0}, engine: torch, device: cpu, serve: true, follow: serving,
            max_batch_size: 8}
  gateway: {resources: {num_cpus: 0}, port: 0, default_domain: arithmetic, default_max_tokens: 4,
            max_tokens: 8, request_timeout_s: 30}
  joiner: {resources: {num_cpus: 0}}
  recorder: {resources: {num_cpus: 0}, flush_every_s: 1}
  gate: {resources: {num_cpus: 0}, min_samples: 4, max_samples: 16}
"""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Run:
    """One `flywheel up` process group and the run dir it works in."""

    def __init__(self, spec: Path, root: Path) -> None:
        self.spec = spec
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.out = root / "up.log"

    def start(self, *args: str) -> None:
        env = {**os.environ, "FLYWHEEL_API_KEYS": API_KEY, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "topology.cli", "up", "--every", "5", *args]
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=self.root, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    @property
    def run_dir(self) -> Path:
        return (self.root / "runs" / "latest").resolve()

    def info(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.run_dir / "run.json").read_text())
        return data

    def status(self) -> list[dict[str, Any]]:
        result = subprocess.run(
            [sys.executable, "-m", "topology.cli", "status", str(self.run_dir), "--json"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=60,
        )
        try:
            doc = json.loads(result.stdout)
        except ValueError:
            return []
        return list(doc.get("replicas", [])) if doc.get("live") else []

    def healthy(self) -> list[dict[str, Any]] | None:
        rows = self.status()
        if rows and all(r["state"] == "running" and not r["stale"] for r in rows):
            learner = [r for r in rows if r.get("kind") == "learner"]
            if all(r["counters"].get("phase") == "rl" for r in learner):
                return rows
        return None

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()


def wait(what: str, probe: Any, timeout_s: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(1.0)
    raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


class Client(threading.Thread):
    """Chat requests and feedback against the gateway; keeps the ledger of what the service acknowledged."""

    def __init__(self, run: Run) -> None:
        super().__init__(daemon=True)
        self.run_ = run
        self.stopping = threading.Event()
        self.answered: list[str] = []  # request ids of 200 answers
        self.feedback: list[str] = []  # request ids whose feedback got a 200
        self.errors = 0

    def url(self) -> str | None:
        for row in self.run_.status():
            if isinstance(row["counters"].get("url"), str):
                return str(row["counters"]["url"])
        return None

    def run(self) -> None:
        url: str | None = None
        with httpx.Client(timeout=40) as http:
            while not self.stopping.is_set():
                try:
                    url = url or self.url()
                    if url is None:
                        time.sleep(1)
                        continue
                    a, b = uuid.uuid4().int % 9, uuid.uuid4().int % 9
                    r = http.post(
                        f"{url}/v1/chat/completions",
                        json={"model": "flywheel", "messages": [{"role": "user", "content": f"{a}+{b}="}]},
                    )
                    if r.status_code != 200:
                        self.errors += 1
                        continue
                    rid = r.json()["id"]
                    self.answered.append(rid)
                    f = http.post(
                        f"{url}/v1/feedback",
                        headers={"Authorization": f"Bearer {API_KEY}"},
                        json={"request_id": rid, "score": 1.0 if r.json()["choices"][0]["message"]["content"] else 0.0},
                    )
                    if f.status_code == 200:
                        self.feedback.append(rid)
                    else:
                        self.errors += 1
                except (httpx.HTTPError, ValueError, KeyError):
                    self.errors += 1
                    url = None  # the gateway may have moved (a resume picks a free port again)
                    time.sleep(0.5)
                time.sleep(0.05)


def learner_checks(run_dir: Path) -> dict[str, Any]:
    lifecycle = read_metrics(run_dir, "lifecycle")
    steps = read_metrics(run_dir, "step")
    kept = effective_applied(run_dir)
    order = lifecycle.group_by("incarnation").agg(pl.col("ts").min().alias("first")).sort("first")
    incarnations = order["incarnation"].to_list()
    resumes = {r["incarnation"]: r["step"] for r in lifecycle.filter(event="resume").iter_rows(named=True)}
    effective: list[str] = kept["message_id"].to_list() if kept.height else []
    lineage: list[int] = []
    for incarnation in incarnations:
        rows = kept.filter(incarnation=incarnation) if kept.height else kept
        lineage += sorted(set(rows["step"].to_list())) if rows.height else []
    doubled = sorted(mid for mid, n in Counter(effective).items() if n > 1)
    versions = steps.sort("ts")["version"].to_list() if steps.height else []
    went_back = sum(1 for a, b in itertools.pairwise(versions) if b < a)
    return {
        "incarnations": len(incarnations),
        "resumed_from_steps": [resumes[i] for i in incarnations if i in resumes],
        "applied_effective": len(effective),
        "applied_twice": doubled[:20],
        # every step from the first to the last, none missing (a step's zero-signal groups are accounted at the step
        # the learner is at, so a resumed life may also list the step it resumed from)
        "steps_form_one_line": sorted(set(lineage)) == list(range(min(lineage), max(lineage) + 1)) if lineage else True,
        "final_step": lineage[-1] if lineage else 0,
        "last_version": versions[-1] if versions else 0,
        "version_went_back": went_back,
    }


def unrecorded(run_dir: Path, request_ids: list[str]) -> list[str]:
    """The ids among ``request_ids`` that the recorder has not written to ``traffic`` (yet)."""
    try:
        traffic = read_recordings(run_dir / "recordings", "traffic")
    except (OSError, pl.exceptions.PolarsError):  # nothing written yet, or a part being replaced
        return request_ids
    recorded = set(traffic["request_id"].to_list()) if traffic.height else set()
    return [r for r in request_ids if r not in recorded]


def service_checks(run_dir: Path, client: Client) -> dict[str, Any]:
    traffic = read_recordings(run_dir / "recordings", "traffic")
    feedback = read_recordings(run_dir / "recordings", "feedback")
    recorded = Counter(traffic["request_id"].to_list()) if traffic.height else Counter()
    fed = Counter(feedback["request_id"].to_list()) if feedback.height else Counter()
    kept = effective_applied(run_dir)  # what is in the final weights: a life's rows after its successor's checkpoint
    joined = Counter(m for m in (kept["message_id"].to_list() if kept.height else []) if m.startswith("joined."))
    return {
        "answered": len(client.answered),
        "feedback_accepted": len(client.feedback),
        "client_errors": client.errors,
        "answered_not_recorded": [r for r in client.answered if recorded[r] == 0][:20],
        "recorded_twice": [r for r, n in recorded.items() if n > 1][:20],
        "feedback_not_recorded": [r for r in client.feedback if fed[r] == 0][:20],
        "feedback_recorded_twice": [r for r, n in fed.items() if n > 1][:20],
        "joined_applied": len(joined),
        "joined_applied_twice": [m for m, n in joined.items() if n > 1][:20],
        # accepted, joined, not yet trained on when the run stopped: still unacknowledged on the bus, so the next
        #   `flywheel up --resume` applies them (a learner trains in whole batches)
        "feedback_pending_at_stop": [r for r in client.feedback if joined[f"joined.{r}"] == 0][:20],
    }


def soak(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.root or tempfile.mkdtemp(prefix="flywheel-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.spec:
        spec = Path(args.spec).resolve()
    else:
        spec = root / "spec.yaml"
        spec.write_text(QUICK + (SERVICE if args.service else ""))
    run = Run(spec, root)
    log(f"soak in {root}: flywheel up {spec}")
    run.start(str(spec), "--run-dir", str(root / "runs"))
    wait("the run to be healthy", run.healthy, timeout_s=args.start_timeout)
    client = Client(run)
    if any(r.get("kind") == "gateway" for r in run.status()):
        client.start()
    kills: Counter[str] = Counter()
    began = time.monotonic()
    for round_ in range(1, args.rounds + 1):
        for row in run.healthy() or wait("a healthy run", run.healthy):
            key = f"{row['actor']}[{row['replica']}]"
            log(f"round {round_}: SIGKILL {key} (pid {row['pid']})")
            os.kill(row["pid"], signal.SIGKILL)
            kills[row["actor"]] += 1
            wait(f"{key} back", lambda r=row: (h := run.healthy()) and all(x["pid"] != r["pid"] for x in h))
            time.sleep(args.settle_s)
        info = run.info()
        log(f"round {round_}: SIGKILL nats-server (pid {info['nats_pid']})")
        os.kill(info["nats_pid"], signal.SIGKILL)
        kills["nats-server"] += 1
        wait("nats-server back", lambda n=info["bus_restarts"]: run.info()["bus_restarts"] > n)
        wait("a healthy run", run.healthy)
        time.sleep(args.settle_s)
        pids = [run.info()["pid"], run.info()["nats_pid"], *(r["pid"] for r in run.status())]
        log(f"round {round_}: SIGKILL the process group of flywheel up (pid {run.proc.pid if run.proc else '?'})")
        assert run.proc is not None
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.proc.wait()
        kills["whole tree"] += 1
        wait("every process of the run gone", lambda p=pids: not [x for x in p if alive(x)], timeout_s=30)
        run.start("--resume", str(run.run_dir))
        wait("the resumed run to be healthy", run.healthy, timeout_s=args.start_timeout)
        time.sleep(args.settle_s)
    client.stopping.set()
    if client.is_alive():
        client.join(60)
    if client.answered:
        # A request answered just before a stop has its traffic record stored on the bus (the gateway answers only
        # after the store's ack) but maybe not yet consumed by the recorder, whose drain writes what it holds, not
        # what is still on the stream (a resume would record it). Stop once the recorder has caught up, so that
        # "answered, not recorded" means lost; if it never catches up, the check below says so.
        log("waiting for the recorder to write every answered request")
        try:
            wait("the recorder to catch up", lambda: not unrecorded(run.run_dir, client.answered), timeout_s=60)
        except RuntimeError as exc:
            log(str(exc))
    log("stopping")
    code = run.stop()
    run_dir = run.run_dir
    result: dict[str, Any] = {
        "spec": str(spec),
        "run_dir": str(run_dir),
        "rounds": args.rounds,
        "seconds": round(time.monotonic() - began, 1),
        "kills": dict(kills),
        "stop_exit": code,
        "resumes": run.info()["resumes"],
        "bus_restarts": run.info()["bus_restarts"],
        "learner": learner_checks(run_dir),
    }
    if client.ident is not None:  # the spec has a gateway: the client ran
        result["service"] = service_checks(run_dir, client)
    learner = result["learner"]
    failures = []
    if code != 0:
        failures.append(f"flywheel up exited {code}")
    if learner["applied_twice"]:
        failures.append(f"applied twice: {learner['applied_twice']}")
    if not learner["steps_form_one_line"]:
        failures.append("the learner's steps do not form one line")
    if learner["version_went_back"]:
        failures.append(f"versions went back {learner['version_went_back']} times")
    for name in (
        "answered_not_recorded",
        "recorded_twice",
        "feedback_not_recorded",
        "feedback_recorded_twice",
        "joined_applied_twice",
    ):
        if result.get("service", {}).get(name):
            failures.append(f"{name}: {result['service'][name]}")
    result["failures"] = failures
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", help="a spec to soak (default: a small embedded topology written by the soak)")
    parser.add_argument("--service", action="store_true", help="add gateway, serving generator, joiner, recorder, gate")
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settle-s", type=float, default=5.0, help="seconds of normal running between kills")
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--root", help="where the run goes (default: a new temporary folder, kept)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    result = soak(args)
    out = ROOT / "bench" / "results" / f"soak{'-service' if 'service' in result else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    learner = result["learner"]
    print("\n| figure | value |\n|---|---|")
    rows = [
        ("rounds", result["rounds"]),
        ("SIGKILLs", ", ".join(f"{k} {v}" for k, v in sorted(result["kills"].items()))),
        ("resumes / bus restarts", f"{result['resumes']} / {result['bus_restarts']}"),
        ("learner incarnations", learner["incarnations"]),
        ("applied (effective) / twice", f"{learner['applied_effective']} / {len(learner['applied_twice'])}"),
        ("steps 1..N in one line", f"{learner['steps_form_one_line']} (N = {learner['final_step']})"),
        ("last version / went back", f"{learner['last_version']} / {learner['version_went_back']}"),
    ]
    if "service" in result:
        service = result["service"]
        rows += [
            (
                "answered / not recorded / twice",
                f"{service['answered']} / {len(service['answered_not_recorded'])} / {len(service['recorded_twice'])}",
            ),
            (
                "feedback accepted / not recorded",
                f"{service['feedback_accepted']} / {len(service['feedback_not_recorded'])}",
            ),
            (
                "joined samples applied / twice / pending at stop",
                f"{service['joined_applied']} / {len(service['joined_applied_twice'])} / "
                f"{len(service['feedback_pending_at_stop'])}",
            ),
        ]
    rows.append(("result", "PASS" if not result["failures"] else "FAIL: " + "; ".join(result["failures"])))
    for name, value in rows:
        print(f"| {name} | {value} |")
    print(f"\nwrote {out}")
    return 0 if not result["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
