"""The topology's Prometheus endpoint: every replica's heartbeat, as metrics, on one port (prometheus-client).

Contract: :class:`StatusExporter` is fed the replicas' latest heartbeat records (:meth:`update`, every
``runtime.heartbeat_s`` by :func:`export_statuses` while ``flywheel up`` runs) and serves them on
``http://<metrics_host>:<metrics_port>/metrics`` in the Prometheus text format. The framework knows no
application, so it exports generically:

- ``flywheel_replica_up{topology, actor, replica, kind, state}`` 1 per replica (its state as a label),
  ``flywheel_replica_restarts``, ``flywheel_replica_heartbeat_age_seconds``;
- each numeric counter ``<name>`` or ``<name>.<key>`` of a replica as the gauge ``flywheel_<name>`` with the labels
  ``topology, actor, replica, kind`` and ``key`` (``""`` when the counter has no dot): a learner's
  ``reward.arithmetic`` is ``flywheel_reward{actor="learner", key="arithmetic"}``. A counter that also has keyed
  parts (a source's ``published`` beside ``published.<domain>``) is exported as ``flywheel_<name>_all`` (``key``
  ``""``), so that summing ``flywheel_<name>`` over its keys does not count the total twice. Names are reduced to
  ``[a-zA-Z0-9_]``; booleans are 0/1; text counters (a URL, a decision) are not exported.

Every value is a gauge: a counter of a replica restarts from 0 with the replica (``flywheel_replica_restarts``
tells when), and Prometheus' ``rate()`` handles such resets.

Non-goals: history (Prometheus keeps it), authentication (bind it to loopback, or put a proxy in front), push.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from topology.runtime._status import ReplicaStatus

__all__ = ["StatusExporter", "export_statuses", "metric_name"]

_LABELS = ["topology", "actor", "replica", "kind"]
_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(counter: str) -> tuple[str, str]:
    """``(flywheel_<name>, key)`` of a counter named ``<name>`` or ``<name>.<key>``."""
    name, _, key = counter.partition(".")
    return "flywheel_" + _UNSAFE.sub("_", name).strip("_"), key


class StatusExporter:
    """See the module docstring. A prometheus-client collector over the latest records it was given."""

    def __init__(self, topology: str, *, heartbeat_s: float = 1.0) -> None:
        self.topology = topology
        self.heartbeat_s = heartbeat_s
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._records: tuple[ReplicaStatus, ...] = ()
        self._lock = threading.Lock()
        self._server: Any = None
        self.url: str | None = None

    def update(self, records: Iterable[ReplicaStatus]) -> None:
        with self._lock:
            self._records = tuple(records)

    def start(self, host: str, port: int) -> str:
        """Serve ``/metrics`` in a daemon thread; returns the URL (``port`` 0: a free port)."""
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self.url = f"http://{shown}:{self._server.server_port}/metrics"
        return self.url

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            records: Sequence[ReplicaStatus] = self._records
        now = time.time()
        up = GaugeMetricFamily(
            "flywheel_replica_up", "1 per replica, labelled by its state", labels=[*_LABELS, "state"]
        )
        restarts = GaugeMetricFamily("flywheel_replica_restarts", "restarts of the replica", labels=_LABELS)
        age = GaugeMetricFamily(
            "flywheel_replica_heartbeat_age_seconds", "seconds since the replica's last heartbeat", labels=_LABELS
        )
        families: dict[str, GaugeMetricFamily] = {}
        keyed = {  # names with a breakdown: their plain total is exported apart (`flywheel_<name>_all`)
            metric_name(counter)[0]
            for record in records
            for counter, value in record.counters.items()
            if "." in counter and isinstance(value, int | float)
        }
        for record in records:
            labels = [self.topology, record.actor, str(record.replica), record.kind]
            up.add_metric([*labels, record.state], 1.0)
            restarts.add_metric(labels, float(record.restarts))
            age.add_metric(labels, round(record.age_s(now), 3))
            for counter, value in sorted(record.counters.items()):
                if not isinstance(value, int | float):  # bool is an int
                    continue
                name, key = metric_name(counter)
                if not key and name in keyed:
                    name += "_all"
                family = families.get(name)
                if family is None:
                    family = families[name] = GaugeMetricFamily(
                        name,
                        f"heartbeat counter {name[len('flywheel_') :]}[.key] of a replica",
                        labels=[*_LABELS, "key"],
                    )
                family.add_metric([*labels, key], float(value))
        yield up
        yield restarts
        yield age
        yield from families.values()


async def export_statuses(runtime: Any, exporter: StatusExporter) -> None:
    """Feed ``exporter`` the runtime's heartbeat records every heartbeat until cancelled; a bus hiccup is skipped."""
    while True:
        try:
            exporter.update(await runtime.statuses())
        except Exception:  # the run goes on; the endpoint shows the last records it had
            pass
        await anyio.sleep(exporter.heartbeat_s)
