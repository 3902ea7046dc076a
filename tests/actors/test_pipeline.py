"""source → generator → verify over a real nats-server, in one process: rollouts get scored.

The smallest real topology: a tiny untrained GPT generates for builtin arithmetic and pyexpr tasks, the
verify actor scores them (pyexpr in the real sandbox) and publishes ``scored``; the test reads that channel.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from actors.protocol import ScoredMsg
from topology import load_spec
from topology.runtime import SingleProcessRuntime, connect_run

SPEC = """
name: pipeline-test
bus: {embedded: true}
runtime: {kind: local, run_dir: runs}
policy:
  model: builtin:tiny-gpt
  config: {preset: tiny, n_layer: 1, n_embd: 32, n_head: 2}
domains:
  arithmetic: {source: builtin:arithmetic, verifier: math, group_size: 2, heldout: 10, max_new_tokens: 6}
  pyexpr: {source: builtin:pyexpr, verifier: python-expr, group_size: 2, heldout: 10, max_new_tokens: 6}
actors:
  source: {max_pending: 8}
  generator: {max_batch_size: 8, device: cpu}
  verify: {sandbox: {workers: 1}}
"""


@pytest.mark.timeout(120)
def test_rollouts_are_generated_and_scored(tmp_path: Path) -> None:
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    spec = load_spec(spec_path)
    runtime = SingleProcessRuntime(spec, handle_signals=False)
    scored: list[ScoredMsg] = []

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.run)
            await runtime.started.wait()
            assert runtime.run_dir is not None
            async with await connect_run(runtime.run_dir, name="test") as bus:  # with the run's token
                await bus.ensure_channel("scored")
                with anyio.fail_after(90):
                    async with bus.consume("scored", "test-reader", model=ScoredMsg) as reader:
                        async for delivery in reader:
                            scored.append(delivery.payload)
                            await delivery.ack()
                            if {m.domain for m in scored} == {"arithmetic", "pyexpr"} and len(scored) >= 4:
                                break
            runtime.request_stop("test done")

    anyio.run(main, backend="asyncio")
    for message in scored:
        assert len(message.completions) == 2
        for completion in message.completions:
            assert 0.0 <= completion.reward <= 1.0 and completion.verdict
            assert len(completion.token_ids) == len(completion.logprobs) == len(completion.versions) > 0
            assert set(completion.versions) == {0}  # no learner: the policy as specified, version 0
    # an untrained model writes garbage: the sandbox scored pyexpr completions rather than erroring
    assert any(c.verdict != "internal_error" for m in scored if m.domain == "pyexpr" for c in m.completions)
