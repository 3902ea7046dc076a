"""The learner's child process (``topology.runtime._child``), with one checkpoint's real write stopped short of being
put in place: torchsnapshot writes the whole snapshot into its temporary directory, then the writing thread writes
that directory's path to MARKER and sleeps, so the test can SIGKILL the process while the write is in flight.

usage: python -m tests.actors.learner._held_write_child STEP MARKER <topology.runtime._child's arguments>
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any


def hold_write(step: int, marker: Path) -> None:
    from torchsnapshot import Snapshot

    take = Snapshot.take.__func__  # type: ignore[attr-defined]

    def held(cls: type[Snapshot], path: str, app_state: Any, *args: Any, **kwargs: Any) -> Snapshot:
        snapshot = take(cls, path, app_state, *args, **kwargs)
        if Path(path).name.startswith(f".tmp-{step:09d}-"):
            marker.write_text(path)
            while True:  # until the test kills the process
                time.sleep(60)
        return snapshot

    Snapshot.take = classmethod(held)  # type: ignore[method-assign,assignment]


if __name__ == "__main__":
    from topology.runtime._child import main

    hold_write(int(sys.argv[1]), Path(sys.argv[2]))
    sys.exit(main(sys.argv[3:]))
