"""`flywheel review`: queued samples are shown, labelled from the keyboard, and come back as feedback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

from actors.commands._review import review_samples
from actors.protocol import FeedbackMsg, FirstRatings, rating_digest
from tests.actors.recorder._support import traffic
from tests.topology.runtime._helpers import wait_for
from topology.bus import Bus, EmbeddedNats
from topology.cli import main
from topology.runtime._rundir import RunInfo, write_run_info


def test_review_labels_flow_back_as_feedback(
    embedded_nats: EmbeddedNats, tmp_path: Path, live_run: Callable[[Path], Path]
) -> None:
    topology = f"rv-{uuid.uuid4().hex[:8]}"
    write_run_info(
        tmp_path,
        RunInfo(
            topology=topology,
            bus_url=embedded_nats.url,
            pid=os.getpid(),
            spec_path="spec.yaml",
            started_at=time.time(),
            heartbeat_s=1.0,
        ),
    )
    live_run(tmp_path)

    async def queue() -> None:
        async with await Bus.connect(embedded_nats.url, topology=topology, name="joiner") as bus:
            for rid, text in (("a", "41"), ("b", "42"), ("c", "43"), ("d", "44")):
                await bus.publish("review", "review", traffic(rid, text=text), id=f"review.{rid}")

    anyio.run(queue, backend="asyncio")
    result = CliRunner().invoke(main, ["review", str(tmp_path), "--wait", "2"], input="g\nb\ns\nq\n")
    assert result.exit_code == 0, result.output
    assert "What is 40+2?" in result.output and "42" in result.output
    assert "labelled 2 (good 1, bad 1), skipped 1" in result.output

    async def labels() -> list[tuple[str, str, float, str | None]]:
        out = []
        async with await Bus.connect(embedded_nats.url, topology=topology, name="check") as bus:
            with anyio.move_on_after(3):
                async with bus.consume("feedback", "check", model=FeedbackMsg) as deliveries:
                    async for delivery in deliveries:
                        fb = delivery.payload
                        out.append((delivery.envelope.source, fb.request_id, fb.score, fb.label))
                        await delivery.ack()
                        if len(out) == 2:
                            break
            # "d" was not answered (quit): it is still queued
            async with bus.consume("review", "review") as rest:
                with anyio.fail_after(10):
                    left = await rest.__anext__()
                    await left.nak()
            out.append(("queue", str(left.payload["request_id"]), -1.0, None))
        return out

    got = anyio.run(labels, backend="asyncio")
    assert got == [("review", "a", 1.0, "good"), ("review", "b", 0.0, "bad"), ("queue", "d", -1.0, None)]


pytestmark = pytest.mark.timeout(60)


def test_ctrl_c_at_the_prompt_ends_the_review_and_leaves_the_sample_queued(
    embedded_nats: EmbeddedNats, tmp_path: Path, live_run: Callable[[Path], Path]
) -> None:
    """Ctrl-C at the prompt printed "Aborted!" and the process ran on: the prompt's worker thread, still reading the
    keyboard, kept it alive. It ends now with 130, and the sample on screen is put back on the queue unlabelled."""
    topology = f"rv-{uuid.uuid4().hex[:8]}"
    write_run_info(tmp_path, RunInfo(topology, embedded_nats.url, os.getpid(), "spec.yaml", time.time(), 1.0))
    live_run(tmp_path)

    async def queue() -> None:
        async with await Bus.connect(embedded_nats.url, topology=topology, name="joiner") as bus:
            await bus.publish("review", "review", traffic("a"), id="review.a")

    anyio.run(queue, backend="asyncio")
    cmd = [sys.executable, "-c", "from topology.cli import main; main()", "review", str(tmp_path)]
    review = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    shown: list[str] = []
    assert review.stdout is not None
    reader = threading.Thread(target=lambda: shown.extend(iter(lambda: review.stdout.read(1), "")), daemon=True)
    reader.start()
    try:
        wait_for("the prompt", lambda: "good/bad/skip/quit" in "".join(shown))
        review.send_signal(signal.SIGINT)
        returncode = review.wait(timeout=10)
    finally:
        if review.poll() is None:
            review.kill()
        review.wait()
    assert returncode == 130, "".join(shown) + review.stderr.read()

    async def requeued() -> str:
        async with (
            await Bus.connect(embedded_nats.url, topology=topology, name="check") as bus,
            bus.consume("review", "review") as rest,
        ):
            with anyio.fail_after(5):  # put back at once, not after the ack window
                left = await rest.__anext__()
                await left.nak()
                return str(left.payload["request_id"])

    assert anyio.run(requeued, backend="asyncio") == "a"


def test_untrusted_text_is_shown_as_plain_text(
    embedded_nats: EmbeddedNats, tmp_path: Path, live_run: Callable[[Path], Path]
) -> None:
    topology = f"rv-{uuid.uuid4().hex[:8]}"
    write_run_info(
        tmp_path,
        RunInfo(
            topology=topology,
            bus_url=embedded_nats.url,
            pid=os.getpid(),
            spec_path="spec.yaml",
            started_at=time.time(),
            heartbeat_s=1.0,
        ),
    )
    live_run(tmp_path)
    hostile = traffic(
        "x",
        prompt="[bold red]PROMPT[/] \x1b[2J\x1b]0;title\x07 ok\u202eevil",
        text="[link=http://evil]click[/link]\x1b[31m red \x00\x9b done",
    )

    async def queue() -> None:
        async with await Bus.connect(embedded_nats.url, topology=topology, name="joiner") as bus:
            await bus.publish("review", "review", hostile, id="review.x")

    anyio.run(queue, backend="asyncio")
    result = CliRunner().invoke(main, ["review", str(tmp_path), "--wait", "2"], input="s\n")
    assert result.exit_code == 0, result.output
    assert "[bold red]PROMPT[/]" in result.output  # markup shown as typed, not applied
    assert "[link=http://evil]click[/link]" in result.output
    assert "[2J" in result.output and " ok" in result.output and "evil" in result.output and "done" in result.output
    for control in ("\x1b", "\x07", "\x00", "\x9b", "\u202e"):
        assert control not in result.output


def test_a_review_begun_before_any_gateway_records_its_labels_as_first_ratings(embedded_nats: EmbeddedNats) -> None:
    """``flywheel review`` looked for the gateways' ledger of first ratings once, when it began: started before any
    gateway had made it, none of its labels was recorded for the whole session, so a user's rating of a reviewed
    request afterwards was answered ``accepted`` as if it would train. It looks again at each label now."""
    topology = f"rv-{uuid.uuid4().hex[:8]}"

    async def scenario() -> tuple[dict[str, int], bool]:
        async with await Bus.connect(embedded_nats.url, topology=topology, name="review") as bus:

            async def good_once_a_gateway_is_up(sample: Any, delivery: Any) -> str:
                # the review began with no ledger; a gateway starts now and makes it, as its start() does
                await FirstRatings(bus, topology, window_s=3600.0, max_entries=1000).open()
                return "good"

            await bus.publish("review", "review", traffic("served"), id="review.served")
            counts = await review_samples(bus, good_once_a_gateway_is_up, limit=1, wait_s=5)
            ledger = await FirstRatings.existing(bus, topology)
            assert ledger is not None
            user_is_first = await ledger.claim("served", rating_digest("served", 1.0, "good"))
        return counts, user_is_first

    counts, user_is_first = anyio.run(scenario, backend="asyncio")
    assert counts["good"] == 1 and not user_is_first
