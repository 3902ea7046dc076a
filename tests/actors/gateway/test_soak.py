"""The gateway at its concurrency limit under good, bad, slow and aborted clients at once (real processes:
``flywheel up`` of a generator and a gateway): every good request answered and recorded exactly once, every bad
or slow one refused as it should be, aborted generations cancelled, nothing held at the end, memory flat.

The suite's run is short (``FLYWHEEL_SOAK_S``, default 5 s of load, about 10 s in all): it shows that every
kind of client is handled as it should be at once and that nothing is held at the end; 5 s says little about
memory growth (the bound below only catches a gross leak). ``bench/gateway_soak.py --duration 600`` is the long
run, with its figures in bench/RESULTS.md.
"""

from __future__ import annotations

import os

import pytest

from bench.gateway_soak import run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_soak_at_the_concurrency_limit() -> None:
    figures = run(duration_s=float(os.environ.get("FLYWHEEL_SOAK_S", "5")))
    good = figures["good"]
    assert good["ok"] > 0 and good["failures"] == 0, good["failure_samples"]
    assert good["recorded_once"] == good["ok"] and good["not_recorded_once"] == 0
    assert figures["unexpected"] == 0, figures["unexpected_samples"]
    assert sum(figures["bad"].values()) > 0 and set(figures["slow"]) == {"408"}
    assert figures["aborted"] > 0
    gateway, generator = figures["end_counters"]["gateway"], figures["end_counters"]["generator"]
    assert gateway["client_disconnects"] > 0 and generator["serve_cancelled"] > 0  # aborted work was stopped
    assert not any(gateway.get(k) for k in ("in_flight", "streams_open", "serve_pending"))
    assert not generator.get("serve_in_flight")
    assert gateway["traffic_errors"] == 0 and gateway["internal_errors"] == 0
    memory = figures["memory_mib"]
    assert memory["gateway_end"] - memory["gateway_after_warmup"] < 20, memory
