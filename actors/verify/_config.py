"""Config of the `verify` actor kind (light module: no torch; registers the kind on import).

The verify actor scores rollouts with each domain's verifier; code runs in a pool of warm sandbox
workers whose limits are set here. The pool refuses to start below ``min_isolation`` (bubblewrap unless the spec
opts in to ``unshare`` or ``rlimits``), and the level in force is in the actor's counters (``isolation``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from actors.protocol import domains_of
from topology import ActorKind, ActorSpec, KeyPath, SectionCheck, Spec, SpecModel, register_actor_kind


class SandboxConfig(SpecModel):
    """Limits of one sandboxed execution, and the pool that runs them."""

    workers: int = Field(default=2, ge=1)  # warm worker processes in the pool
    isolation: Literal["auto", "bwrap", "unshare", "rlimits"] = "auto"  # auto: strongest available
    wall_s: float = Field(default=5.0, gt=0)  # wall-clock limit per job; the whole pid namespace is killed after it
    cpu_s: float = Field(default=2.0, gt=0)  # CPU-time limit per job (RLIMIT_CPU)
    memory_mb: int = Field(default=256, ge=16)  # address-space limit per job (RLIMIT_AS)
    max_processes: int = Field(default=16, ge=1)  # processes per job (RLIMIT_NPROC, as an unprivileged uid)
    max_file_mb: int = Field(default=16, ge=0)  # largest file a job may write (RLIMIT_FSIZE)
    max_open_files: int = Field(default=64, ge=8)  # RLIMIT_NOFILE
    max_output_kb: int = Field(default=64, ge=1)  # stdout/stderr captured per job; the rest is dropped
    # refuse to start below this level; anything weaker than bwrap is an explicit opt-in
    min_isolation: Literal["bwrap", "unshare", "rlimits"] = "bwrap"
    max_jobs_per_worker: int = Field(default=1000, ge=1)  # a worker is replaced after this many jobs

    @model_validator(mode="after")
    def _isolation_allowed(self) -> SandboxConfig:
        from actors.sandbox import Isolation  # its order: weakest first

        if self.isolation != "auto" and Isolation.parse(self.isolation) < Isolation.parse(self.min_isolation):
            raise ValueError(
                f"expected isolation {self.min_isolation} or stronger (min_isolation: {self.min_isolation}), got "
                f"{self.isolation}: set min_isolation: {self.isolation} too to opt in to it"
            )
        return self


class VerifyConfig(SpecModel):
    """Fields of a `verify` actor block (besides kind/replicas/resources/consumes/publishes)."""

    sandbox: SandboxConfig = SandboxConfig()  # the pool that runs code verifiers: workers and limits per job
    domains: tuple[str, ...] | None = None  # only score these domains; null: every domain
    max_in_flight: int = Field(default=64, ge=1)  # rollouts being verified at once per replica


def _unscored(spec: Spec) -> dict[str, str]:
    """Domains whose rollouts some actor asks for (a source draws its tasks, the learner evaluates its held-out
    prompts) but no verify actor scores, each with who asks for it."""
    every = list(domains_of(spec))
    scored: set[str] = set()
    wanted: dict[str, str] = {}
    for name, actor in spec.actors.items():
        listed = getattr(actor.config, "domains", None)
        names = every if listed is None else list(listed)
        if actor.kind == "verify":
            scored.update(names)
        elif actor.kind == "source":
            wanted.update({domain: f"source {name!r} draws its tasks" for domain in names if domain not in wanted})
        elif actor.kind == "learner" and getattr(actor.config, "eval_every_steps", 0) > 0:
            evaluated = f"learner {name!r} evaluates its held-out prompts"
            wanted.update({domain: evaluated for domain in names if domain not in wanted})
    return {domain: why for domain, why in wanted.items() if domain not in scored}


def _check(check: SectionCheck, path: KeyPath, actor: ActorSpec, spec: Spec) -> BaseModel:
    first = next(name for name, other in spec.actors.items() if other.kind == "verify")
    if path[-1] == first:  # said once, at the first verify actor's domains
        for domain, why in _unscored(spec).items():
            check.error(
                (*path, "domains"),
                f"domain {domain!r} is scored by no verify actor, yet {why}: its rollouts would be dead-lettered "
                f"and the learner would wait for them; expected {domain!r} in a verify actor's domains (or null: "
                "every domain)",
            )
    return actor.config


register_actor_kind(
    ActorKind(
        name="verify",
        config=VerifyConfig,
        factory="actors.verify._actor:VerifyActor",
        consumes=("rollouts",),
        publishes=("scored",),
        summary="scores rollouts with the domains' verifiers (code runs in a sandbox pool)",
        references={"domains": "domains"},
        check=_check,
    )
)

__all__ = ["SandboxConfig", "VerifyConfig"]
