"""Helper process for the orphan test: start an EmbeddedNats, report its pid, then wait to be SIGKILLed."""

from __future__ import annotations

import sys
import time

from topology.bus import EmbeddedNats

if __name__ == "__main__":
    server = EmbeddedNats(sys.argv[1]).start()
    print(server.pid, flush=True)
    time.sleep(3600)
