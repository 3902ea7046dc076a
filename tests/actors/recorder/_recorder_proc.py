"""Run one recorder actor in this process until SIGTERM (the crash tests SIGKILL it instead).

usage: python _recorder_proc.py SPEC NATS_URL RUN_DIR
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio

from actors.recorder._actor import RecorderActor
from actors.recorder._config import RecorderConfig
from actors.testing import actor_context
from topology import BusSpec, load_spec
from topology.bus import Bus


async def main(spec_path: str, url: str, run_dir: str) -> None:
    spec = load_spec(spec_path)
    settings = BusSpec(ack_wait_s=1.0, max_deliver=1000)
    async with await Bus.connect(url, topology=spec.name, name="recorder", settings=settings) as bus:
        ctx = actor_context(spec, "recorder", bus, Path(run_dir))
        config = spec.actors["recorder"].config
        assert isinstance(config, RecorderConfig)
        actor = RecorderActor(ctx, config)
        await actor.start()
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        ctx.stopping.set()
                        return

                tg.start_soon(stop_on_signal)
                await actor.run()
                tg.cancel_scope.cancel()
        await actor.drain()
        await actor.stop()
        print("recorder stopped", ctx.counters.snapshot(), flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], backend="asyncio")
