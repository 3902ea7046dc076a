"""``flywheel review``: label queued production samples in the terminal; labels flow back as feedback."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import click

from actors.commands._promote import connect_run, find_run_dir

_CHOICES = {
    "g": "good",
    "good": "good",
    "b": "bad",
    "bad": "bad",
    "s": "skip",
    "skip": "skip",
    "q": "quit",
    "quit": "quit",
}
_SCORES = {"good": 1.0, "bad": 0.0}


@click.command()
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Stop after labelling N samples.")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds to wait for a sample when the queue is empty before exiting.",
)
def review(run_dir: Path | None, limit: int | None, wait_s: float) -> None:
    """Label the samples the joiner queued for human review (joiner: review_fraction > 0).

    \b
    For each one: the prompt and the served completion, then
      g / good   the completion is good   → feedback score 1
      b / bad    the completion is bad    → feedback score 0
      s / skip   no label (taken off the queue)
      q / quit   stop; this sample stays queued
    Labels are published on `feedback` (source "review"); the joiner turns them into training samples.
    """
    where = find_run_dir(run_dir)
    counts = anyio.run(_review, where, limit, wait_s, backend="asyncio")
    click.echo(
        f"labelled {counts['good'] + counts['bad']} (good {counts['good']}, bad {counts['bad']}), "
        f"skipped {counts['skip']}"
    )


async def _review(run_dir: Path, limit: int | None, wait_s: float) -> dict[str, int]:
    from rich.console import Console
    from rich.panel import Panel

    from actors.protocol import REVIEW_SOURCE, TrafficMsg

    console = Console()
    counts = {"good": 0, "bad": 0, "skip": 0}
    bus = await connect_run(run_dir, "flywheel-review")
    try:
        async with bus.consume("review", "review", model=TrafficMsg, batch=1) as queue:
            while limit is None or counts["good"] + counts["bad"] < limit:
                delivery: Any = None
                with anyio.move_on_after(wait_s):
                    delivery = await queue.__anext__()
                if delivery is None:
                    console.print("review queue empty")
                    break
                sample: TrafficMsg = delivery.payload
                console.print(Panel(sample.prompt, title=f"prompt · {sample.request_id} · {sample.domain or '-'}"))
                version = max(sample.completion.versions, default=-1)
                console.print(Panel(sample.completion.text, title=f"completion · v{version}"))
                answer = await _ask(delivery)
                if answer == "quit":
                    await delivery.nak()
                    break
                if answer in _SCORES:
                    feedback = {
                        "request_id": sample.request_id,
                        "score": _SCORES[answer],
                        "label": answer,
                        "comment": "",
                        "ts": time.time(),
                    }
                    await bus.publish(
                        "feedback", "feedback", feedback, id=f"review.{sample.request_id}", source=REVIEW_SOURCE
                    )
                counts[answer] += 1
                await delivery.ack()
    finally:
        await bus.close()
    return counts


async def _ask(delivery: Any) -> str:
    """Ask in a worker thread, telling the server we are still on it, so the sample is not redelivered."""
    answer: list[str] = []

    def ask() -> None:
        raw = click.prompt("good/bad/skip/quit", type=click.Choice(sorted(_CHOICES)), show_choices=False)
        answer.append(_CHOICES[raw])

    async with anyio.create_task_group() as tg:

        async def keep_alive() -> None:
            while True:
                await anyio.sleep(10)
                await delivery.in_progress()

        tg.start_soon(keep_alive)
        try:
            await anyio.to_thread.run_sync(ask)
        except (click.Abort, EOFError):
            answer.append("quit")
        tg.cancel_scope.cancel()
    return answer[0]


__all__ = ["review"]
