"""The actor base class, its context and its counters.

Contract: an actor is constructed with an :class:`ActorContext` and its kind's validated config, then driven
through ``start → run → drain → stop`` exactly once by a runtime (one OS process per replica, or one event
loop for all of them with ``--single-process``). ``run()`` must return soon after ``ctx.stopping`` is set;
``drain()`` then finishes in-flight work and acks it; ``stop()`` releases resources. The actor never learns
where its peers run: everything it needs arrives through the context.

Non-goals: no thread safety (an actor lives on one event loop), no persistence of counters across restarts
(an actor that must resume writes its own checkpoint under ``ctx.state_dir``).
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
import structlog

from topology._names import replica_id, torch_threads
from topology.runtime._status import BeatRequests

if TYPE_CHECKING:
    from topology._spec import ActorSpec, Spec
    from topology.bus import Bus

ConfigT = TypeVar("ConfigT")


class ActorState(enum.StrEnum):
    """Where a replica is in its lifecycle, as reported in heartbeats and ``flywheel status``."""

    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"
    CRASHED = "crashed"
    RESTARTING = "restarting"  # written by the supervisor while it waits out the backoff
    FAILED = "failed"  # written by the supervisor when the replica exhausted its restarts


class Counters:
    """Cheap in-process counters and gauges an actor reports in its heartbeats.

    ``inc`` adds to a counter, ``set`` overwrites a gauge; both live in one flat namespace so that
    ``flywheel status`` can print them side by side.
    """

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[str, float] = {}

    def inc(self, name: str, n: float = 1) -> None:
        self._values[name] = self._values.get(name, 0) + n

    def set(self, name: str, value: float) -> None:
        self._values[name] = value

    def get(self, name: str) -> float:
        return self._values.get(name, 0)

    def snapshot(self) -> dict[str, float]:
        return dict(self._values)

    def __repr__(self) -> str:
        return f"Counters({self._values!r})"


@dataclass
class ActorContext:
    """Everything a replica may use: who it is, the validated spec, a connected bus, a bound logger."""

    topology: str
    actor: str
    replica: int
    kind: str
    spec: Spec
    bus: Bus
    run_dir: Path
    restarts: int = 0
    log: structlog.typing.FilteringBoundLogger = field(default=None)  # type: ignore[assignment]
    counters: Counters = field(default_factory=Counters)
    stopping: anyio.Event = field(default_factory=anyio.Event)
    beats: BeatRequests = field(default_factory=BeatRequests)

    def __post_init__(self) -> None:
        if self.log is None:
            self.log = structlog.get_logger("flywheel").bind(
                topology=self.topology, actor=self.actor, replica=self.replica
            )

    def report_soon(self) -> None:
        """Put this replica's status record (state and counters) now instead of at the next heartbeat — at most
        every ``MIN_BEAT_S``. For counters other actors steer by: the learner's ``buffered_groups``, which a source
        with ``max_in_flight`` reads, changes by a whole batch per step, many steps per heartbeat."""
        self.beats.request()

    @property
    def actor_spec(self) -> ActorSpec:
        """This actor's block of the spec (kind, replicas, resources, channels, the kind's config)."""
        return self.spec.actors[self.actor]

    @property
    def replica_id(self) -> str:
        """``<actor>/<replica>``: how this replica is named on the bus, in payloads and in logs."""
        return replica_id(self.actor, self.replica)

    @property
    def consumes(self) -> tuple[str, ...]:
        """The channels this actor consumes (the kind's defaults, or the spec's override)."""
        return self.actor_spec.consumes

    @property
    def publishes(self) -> tuple[str, ...]:
        """The channels this actor publishes to (the kind's defaults, or the spec's override)."""
        return self.actor_spec.publishes

    @property
    def input_channel(self) -> str:
        """The one channel an actor of a single-input kind consumes; ValueError when it consumes none or several."""
        if len(self.consumes) != 1:
            raise ValueError(f"actor {self.actor!r} consumes {list(self.consumes)}; expected exactly one channel")
        return self.consumes[0]

    def output_channel(self, default: str) -> str:
        """The channel this actor publishes its main output to: ``default`` when the actor publishes it (or the spec
        names no channels for it), else the first channel the spec has it publish."""
        return default if default in self.publishes or not self.publishes else self.publishes[0]

    @property
    def threads(self) -> int:
        """The torch thread pool this replica may use: ``ceil(resources.num_cpus)``, at least one (the runtime
        sizes torch to it before the actor starts)."""
        return torch_threads(self.actor_spec.resources.num_cpus)

    @property
    def state_dir(self) -> Path:
        """``run_dir/state/<actor>/<replica>``: where this replica keeps checkpoints (created on access)."""
        path = self.run_dir / "state" / self.actor / str(self.replica)
        path.mkdir(parents=True, exist_ok=True)
        return path


class Actor(abc.ABC, Generic[ConfigT]):
    """Base class of every actor kind. Subclasses implement :meth:`run`; the other hooks are optional."""

    def __init__(self, ctx: ActorContext, config: ConfigT) -> None:
        self.ctx = ctx
        self.config = config

    async def start(self) -> None:
        """Open connections, load weights, subscribe. Runs before :meth:`run`."""

    @abc.abstractmethod
    async def run(self) -> None:
        """The actor's loop. Must return soon after ``self.ctx.stopping`` is set."""

    async def drain(self) -> None:
        """Finish in-flight work and ack it. Runs after :meth:`run` returned."""

    async def stop(self) -> None:
        """Release resources. Runs last, also after a crash in :meth:`start` or :meth:`run`."""

    def report(self) -> dict[str, Any]:
        """What heartbeats carry as ``counters``; defaults to the counters' snapshot."""
        return dict(self.ctx.counters.snapshot())
