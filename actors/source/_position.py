"""Where a source replica stands in its task sequence, kept across its restarts and the run's resumes.

A replica draws its tasks from one seeded random stream (``seed + replica``). Restarted — after a crash, or when the
run is resumed — it used to begin that stream again, so an always-on run that restarts now and then trained the head
of the same sequence over and over. :class:`SequencePosition` writes the stream's state to
``state/<actor>/<replica>/sequence.json`` every ``SAVE_EVERY_S`` while the replica publishes and at its stop, and
:meth:`SequencePosition.restore` puts it back at start: the replica goes on where it stood. After a crash (no stop to
save at) it goes on from the last save: at most ``SAVE_EVERY_S`` of draws come again. A ``seed`` changed since the
state was written starts the stream afresh from the new seed. A state file that cannot be read is set aside
(renamed ``.unreadable``), logged, and the stream starts from its seed; one that cannot be written (a full disk) is
counted and logged, and the replica publishes on: a run never stops over it.

Non-goals: exactly-once tasks (sampling is with replacement: the same task is drawn again anyway); the replicas'
streams are independent (each its own file), so a run resumed with fewer replicas leaves the others' positions unused.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

__all__ = ["SAVE_EVERY_S", "SequencePosition"]

SAVE_EVERY_S = 5.0


class SequencePosition:
    """The saved state of one replica's task stream (``rng``, drawn from ``seed``) in ``directory``."""

    def __init__(self, directory: Path, rng: random.Random, seed: int) -> None:
        self.path = directory / "sequence.json"
        self.rng = rng
        self.seed = seed
        self._saved_at = time.monotonic()

    def restore(self) -> str:
        """Put the stream back where it stood: ``"restored"``, ``"fresh"`` (nothing saved, or another seed) or
        ``"unreadable: <why>"`` (the file was set aside)."""
        try:
            saved = json.loads(self.path.read_text())
        except FileNotFoundError:
            return "fresh"
        except (OSError, ValueError) as exc:
            return self._set_aside(f"{type(exc).__name__}: {exc}")
        if not isinstance(saved, dict) or saved.get("seed") != self.seed:
            return "fresh" if isinstance(saved, dict) and "seed" in saved else self._set_aside("not a saved sequence")
        try:
            version, internal, gauss = saved["state"]
            self.rng.setstate((version, tuple(internal), gauss))
        except (KeyError, TypeError, ValueError) as exc:
            return self._set_aside(f"{type(exc).__name__}: {exc}")
        return "restored"

    def save_if_due(self) -> str | None:
        """Save when ``SAVE_EVERY_S`` passed since the last try; the error when the write failed (a full disk, say):
        the stream goes on unsaved, and the next try is ``SAVE_EVERY_S`` later."""
        if time.monotonic() - self._saved_at < SAVE_EVERY_S:
            return None
        try:
            self.save()
        except OSError as exc:
            self._saved_at = time.monotonic()
            return f"{type(exc).__name__}: {exc}"
        return None

    def save(self) -> None:
        """Write the stream's state (atomically: a crash mid-write leaves the previous one)."""
        state: Any = self.rng.getstate()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"seed": self.seed, "state": [state[0], list(state[1]), state[2]]}))
        os.replace(tmp, self.path)
        self._saved_at = time.monotonic()

    def _set_aside(self, why: str) -> str:
        try:
            os.replace(self.path, self.path.with_name(self.path.name + ".unreadable"))
        except OSError:
            pass
        return f"unreadable: {why}"
