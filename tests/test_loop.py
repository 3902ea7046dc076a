"""End to end: source → generator → verify → learner in one event loop, on a tiny GPT, briefly.

The property: the loop closes — the learner trains on scored samples and publishes new versions, and the
generators swap them in (their heartbeat `version` climbs past the first published version). This is the one
long test of the suite (about half a minute on 2 cores).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.learner import read_metrics
from topology import load_spec
from topology.runtime import RunResult, SingleProcessRuntime

SPEC = """\
name: loop-test
bus: {embedded: true, ack_wait_s: 10}
runtime: {kind: local, run_dir: runs, heartbeat_s: 0.3}
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
  source: {resources: {num_cpus: 0}, max_pending: 16}
  generator: {resources: {num_cpus: 0.5}, engine: torch, device: cpu, max_batch_size: 16, temperature: 1.0}
  verify: {resources: {num_cpus: 0.5}, sandbox: {workers: 1}}
  learner:
    resources: {num_cpus: 1}
    device: cpu
    lr: 1.0e-4
    batch_size: 8
    publish_every_steps: 1
    checkpoint_every_steps: 5
    eval_every_steps: 4
    eval_size: 8
    max_staleness: 4
    fill_wait_s: 0.5
    metrics_flush_s: 1.0
"""


@pytest.mark.timeout(120)
def test_loop_runs_and_generator_versions_advance(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC)
    runtime = SingleProcessRuntime(load_spec(tmp_path / "spec.yaml"), handle_signals=False)
    seen: dict[str, Any] = {}

    async def main() -> RunResult:
        result: RunResult | None = None

        async def run() -> None:
            nonlocal result
            result = await runtime.run(duration_s=100)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await runtime.started.wait()
            with anyio.fail_after(90):
                while True:
                    counters = {r.actor: r.counters for r in await runtime.statuses()}
                    gen, learner = counters.get("generator", {}), counters.get("learner", {})
                    if float(gen.get("version", 0)) >= 3 and float(learner.get("samples_applied", 0)) >= 16:
                        seen.update(generator=gen, learner=learner)
                        break
                    await anyio.sleep(0.3)
            runtime.request_stop("test done")
        assert result is not None
        return result

    result = anyio.run(main, backend="asyncio")
    assert result.ok, result.message
    assert seen["learner"]["phase"] == "rl" and seen["learner"]["step"] >= 2
    steps = read_metrics(result.run_dir, "step")
    assert steps.height >= 2 and steps["loss"].is_finite().all()
    assert (result.run_dir / "export" / "model.safetensors").exists()
    warm = read_metrics(result.run_dir, "lifecycle").filter(event="warmstart")
    assert warm["warmstart_steps"].to_list() == [20]
    evals = read_metrics(result.run_dir, "eval")  # at least the warm-start baseline round came back
    assert evals.height >= 1 and set(evals["n"].to_list()) == {8}
    assert (result.run_dir / "heldout_accuracy.png").stat().st_size > 0
