"""Roles an actor's config can play for other kinds, as typed structural contracts.

A kind sometimes needs to know what other actors of the same topology do — the gateway, how many replicas answer
users and how long feedback can join its request; the weight group, which replicas receive weights over
torch.distributed and whether one of them runs on the CPU. It must not import their kinds to find out. Each role
here is a ``Protocol`` a config satisfies by having the field (the generator's config has all of them); the
functions read a spec through them.

Non-goals: roles nobody reads across kinds; validation (each kind's config model validates its own fields).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from topology import visible_gpus

__all__ = [
    "HasDevice",
    "HasEngine",
    "JoinsFeedback",
    "ServesUsers",
    "SyncsWeights",
    "cuda_missing_here",
    "feedback_join",
    "only_torch_engines",
    "runs_on_cpu",
    "serving_replicas",
    "weight_receivers",
]


@runtime_checkable
class ServesUsers(Protocol):
    """Replicas that answer users' requests on the serve subjects when ``serve`` is true."""

    serve: bool


@runtime_checkable
class SyncsWeights(Protocol):
    """Replicas that receive new weights; ``weight_sync: distributed`` joins the torch.distributed group."""

    weight_sync: str


@runtime_checkable
class HasEngine(Protocol):
    """Replicas that generate with an engine (``torch``, ``sglang``, ``vllm``)."""

    engine: str


@runtime_checkable
class HasDevice(Protocol):
    """Replicas placed on a device (``cpu``, ``cuda``, ``auto``)."""

    device: str


@runtime_checkable
class JoinsFeedback(Protocol):
    """Replicas that join feedback to the request it rates within ``window_s``, holding at most ``max_pending``."""

    window_s: float
    max_pending: int


def feedback_join(spec: Any) -> tuple[float, int] | None:
    """``(window_s, max_pending)`` of the actors of ``spec`` that join feedback (the largest of each), or None: no
    actor does, and feedback is only recorded."""
    joins = [a.config for a in spec.actors.values() if isinstance(a.config, JoinsFeedback)]
    if not joins:
        return None
    return max(j.window_s for j in joins), max(j.max_pending for j in joins)


def serving_replicas(spec: Any) -> int:
    """How many replicas of ``spec`` answer users."""
    return sum(a.replicas for a in spec.actors.values() if isinstance(a.config, ServesUsers) and a.config.serve)


def weight_receivers(spec: Any) -> list[tuple[str, int]]:
    """Every replica that receives weights over the torch.distributed group, in rank order (rank = index + 1): the
    replicas whose config says ``weight_sync: distributed`` and whose engine, if they have one, is ``torch``."""
    members: list[tuple[str, int]] = []
    for name, actor in spec.actors.items():
        config = actor.config
        if not isinstance(config, SyncsWeights) or config.weight_sync != "distributed":
            continue
        if isinstance(config, HasEngine) and config.engine != "torch":
            continue
        members.extend((name, i) for i in range(actor.replicas))
    return members


def only_torch_engines(spec: Any) -> bool:
    """Whether every actor of ``spec`` that generates with an engine runs the builtin torch engine (which can serve
    from views of shared memory; SGLang and vLLM load weights from a directory)."""
    return all(a.config.engine == "torch" for a in spec.actors.values() if isinstance(a.config, HasEngine))


def cuda_missing_here(config: object, spec: Any) -> str | None:
    """Why an actor whose config says ``device: cuda`` (with the torch engine, if it has an engine) cannot start on
    the local runtime of this machine, which shows no GPU; None when it can or runs elsewhere."""
    if not isinstance(config, HasDevice) or config.device != "cuda" or spec.runtime.kind != "local":
        return None
    if (isinstance(config, HasEngine) and config.engine != "torch") or visible_gpus() > 0:
        return None
    return (
        "device: cuda, but this machine shows no GPU (CUDA_VISIBLE_DEVICES, nvidia-smi): on it the actor stops at "
        "every start; fine if the spec is for another machine"
    )


def runs_on_cpu(config: object) -> bool:
    """Whether an actor's config places it on the CPU explicitly."""
    return isinstance(config, HasDevice) and config.device == "cpu"
