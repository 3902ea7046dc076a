"""``flywheel review``: label queued production samples in the terminal; labels flow back as feedback.

Contract:
- The joiner queues ``review_fraction`` of served requests on ``review``; :func:`review_samples` takes them one by one
  (consumer group ``review``: every reviewer shares one queue) and asks a ``label`` function for each — the
  terminal's keyboard here, a scripted reviewer in ``bench/users.py``. ``good`` / ``bad`` are published on
  ``feedback`` with id ``review.<request id>`` and source ``review`` (the joiner then trains on them as
  ``origin: review``); ``skip`` takes the sample off the queue without a label; ``quit`` leaves it queued and stops,
  and so does a Ctrl-C at the prompt (the command exits 130).
- A label is a first rating like a user's: it is claimed in the gateways' ledger of first ratings
  (:class:`~actors.protocol.FirstRatings`) before it is published, so the user's own rating of the request afterwards
  is answered ``duplicate`` by ``/v1/feedback``. A sample its user rated first is still labelled and published (the
  joiner trains on the first applied, counts this one as a repeat), and counted as ``rated`` (the command says so).
  The ledger is the gateways' to make and size; a review begun before any gateway made it looks for it again at
  each label until it is there (a queued sample was served by a gateway, which makes the ledger before it serves).
- What users sent and what the model answered is untrusted text: it is shown as plain text — never interpreted as
  rich markup — with control characters (terminal escapes, bidirectional overrides, zero-width characters)
  stripped (:func:`plain`).

Non-goals: several labels per sample, free-text corrections.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import click

from actors.commands._promote import connect_run, find_run_dir, run_roles

__all__ = ["plain", "review", "review_samples"]

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
# C0 and C1 controls but newline and tab, DEL, and the invisible format characters that reorder or hide text
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")

Label = Callable[[Any, Any], Awaitable[str]]  # (TrafficMsg, delivery) → good | bad | skip | quit


def plain(text: str) -> str:
    """``text`` safe to print to a terminal: control and invisible formatting characters removed, tabs as spaces."""
    return _UNSAFE.sub("", text).replace("\t", "    ")


async def review_samples(bus: Any, label: Label, *, limit: int | None = None, wait_s: float = 5.0) -> dict[str, int]:
    """Label queued samples with ``label`` until ``limit`` labels, a ``quit``, or an empty queue for ``wait_s``;
    returns the counts of good, bad and skip, ``rated`` (labels of samples their users had rated first), and ``empty``
    1 when it stopped on an empty queue."""
    from actors.protocol import REVIEW_SOURCE, FirstRatings, TrafficMsg, rating_digest

    ratings = await FirstRatings.existing(bus, bus.topology)
    counts = {"good": 0, "bad": 0, "skip": 0, "rated": 0, "empty": 0}
    async with bus.consume("review", "review", model=TrafficMsg, batch=1) as queue:
        while limit is None or counts["good"] + counts["bad"] < limit:
            delivery: Any = None
            with anyio.move_on_after(wait_s):
                delivery = await queue.__anext__()
            if delivery is None:
                counts["empty"] = 1
                break
            sample: TrafficMsg = delivery.payload
            try:
                answer = await label(sample, delivery)
            except BaseException:  # a Ctrl-C at the prompt: the sample goes back on the queue for a later review
                with anyio.move_on_after(2, shield=True), contextlib.suppress(Exception):
                    await delivery.nak()
                raise
            if answer == "quit":
                await delivery.nak()
                break
            if answer in _SCORES:
                rid, score = sample.request_id, _SCORES[answer]
                digest = rating_digest(rid, score, answer, source=REVIEW_SOURCE)
                if ratings is None:  # no gateway had made the ledger when the review began: it may have since
                    ratings = await FirstRatings.existing(bus, bus.topology)
                first = await ratings.claim(rid, digest) if ratings is not None else True
                feedback = {"request_id": rid, "score": score, "label": answer, "comment": "", "ts": time.time()}
                try:
                    await bus.publish("feedback", "feedback", feedback, id=f"review.{rid}", source=REVIEW_SOURCE)
                except BaseException:
                    if first and ratings is not None:
                        with contextlib.suppress(Exception):  # the bus is away: the claim's TTL ends it
                            await ratings.release(rid, digest)
                    raise
                counts["rated"] += 0 if first else 1
            counts[answer] += 1
            await delivery.ack()
    return counts


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
    For each one: the prompt and the served completion (as plain text), then
      g / good   the completion is good   → feedback score 1
      b / bad    the completion is bad    → feedback score 0
      s / skip   no label (taken off the queue)
      q / quit   stop; this sample stays queued
    Labels are published on `feedback` (source "review"); the joiner turns them into training samples.
    """
    where = find_run_dir(run_dir, "flywheel review /srv/runs")
    roles = run_roles(where)
    if roles is not None and not roles.reviewing:
        names = ", ".join(repr(name) for name in roles.joiners)
        why = (
            f"review_fraction is 0 on its joiner{'s' if len(roles.joiners) > 1 else ''} {names}, so none queues answers"
            if roles.joiners
            else "it has no joiner (a joiner with review_fraction > 0 queues served answers for review)"
        )
        raise click.ClickException(f"nothing to review in the run at {where}: {why}")
    try:
        counts = anyio.run(_review, where, limit, wait_s, backend="asyncio")
    except KeyboardInterrupt:
        click.echo("\nreview interrupted (Ctrl-C): the sample shown stays queued, unlabelled", err=True)
        # The prompt's thread still reads stdin: the interpreter's shutdown would wait for stdin's lock it holds (a
        # fatal error when stdin is a pipe). The bus is closed and the sample put back: nothing is left to clean up.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    rated = f"; {counts['rated']} rated by their users first (recorded, not trained on)" if counts["rated"] else ""
    click.echo(
        f"labelled {counts['good'] + counts['bad']} (good {counts['good']}, bad {counts['bad']}), "
        f"skipped {counts['skip']}{rated}"
    )


async def _review(run_dir: Path, limit: int | None, wait_s: float) -> dict[str, int]:
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    console = Console()

    async def ask(sample: Any, delivery: Any) -> str:
        where = f"prompt · {sample.request_id} · {sample.domain or '-'}"
        console.print(Panel(Text(plain(sample.prompt)), title=Text(plain(where))))
        version = max(sample.completion.versions, default=-1)
        console.print(Panel(Text(plain(sample.completion.text)), title=Text(f"completion · v{version}")))
        return await _ask(delivery)

    bus = await connect_run(run_dir, "flywheel-review")
    try:
        counts = await review_samples(bus, ask, limit=limit, wait_s=wait_s)
    finally:
        await bus.close()
    if counts["empty"]:
        console.print("review queue empty")
    return counts


async def _ask(delivery: Any) -> str:
    """Ask on a daemon thread, telling the server we are still on it, so the sample is not redelivered. The thread is
    awaited through an event, not joined: a Ctrl-C cancels the wait at once, and the thread, still reading the
    keyboard, does not keep the process alive at exit (an anyio worker thread did, after "Aborted!")."""
    answer: list[str] = []
    failed: list[Exception] = []
    answered = anyio.Event()
    token = anyio.lowlevel.current_token()

    def ask() -> None:
        try:
            raw = click.prompt("good/bad/skip/quit", type=click.Choice(sorted(_CHOICES)), show_choices=False)
            answer.append(_CHOICES[raw])
        except (click.Abort, EOFError):
            answer.append("quit")
        except Exception as exc:  # raised where the answer is awaited
            failed.append(exc)
        with contextlib.suppress(RuntimeError):  # the loop has ended: nobody waits for the answer
            anyio.from_thread.run_sync(answered.set, token=token)

    threading.Thread(target=ask, name="review-prompt", daemon=True).start()
    async with anyio.create_task_group() as tg:

        async def keep_alive() -> None:
            while True:
                await anyio.sleep(10)
                await delivery.in_progress()

        tg.start_soon(keep_alive)
        await answered.wait()
        tg.cancel_scope.cancel()
    if failed:
        raise failed[0]
    return answer[0]
