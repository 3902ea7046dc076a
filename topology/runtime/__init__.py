"""Actor runtime: the Actor base class, its context and counters, heartbeats, and the local runtimes.

``LocalRuntime`` runs one supervised OS process per replica; ``SingleProcessRuntime`` runs every replica in
one event loop (``flywheel up --single-process``); ``RayRuntime`` places each replica as a Ray actor (Ray is
imported only when it runs). All implement ``Runtime``.
"""

from topology.runtime._actor import Actor, ActorContext, ActorState, Counters
from topology.runtime._ray import RayRuntime, RayUnavailable
from topology.runtime._restart import RestartPolicy
from topology.runtime._rundir import RunInfo, RunLocked, RunNotFound, bus_token, find_run, read_run_info
from topology.runtime._runtime import RunResult, Runtime
from topology.runtime._session import BUS_TOKEN_ENV, connect_run
from topology.runtime._single import SingleProcessRuntime
from topology.runtime._status import ReplicaStatus, RunStatus, read_run_status, read_status, status_bucket
from topology.runtime._supervisor import LocalRuntime
from topology.runtime._until import iterate_until

__all__ = [
    "BUS_TOKEN_ENV",
    "Actor",
    "ActorContext",
    "ActorState",
    "Counters",
    "LocalRuntime",
    "RayRuntime",
    "RayUnavailable",
    "ReplicaStatus",
    "RestartPolicy",
    "RunInfo",
    "RunLocked",
    "RunNotFound",
    "RunResult",
    "RunStatus",
    "Runtime",
    "SingleProcessRuntime",
    "bus_token",
    "connect_run",
    "find_run",
    "iterate_until",
    "read_run_info",
    "read_run_status",
    "read_status",
    "status_bucket",
]
