"""Config of the `verify` actor kind (light module: no torch; registers the kind on import).

The verify actor scores rollouts with each domain's verifier; code runs in a pool of warm sandbox
workers whose limits are set here. The pool refuses to start below ``min_isolation`` (bubblewrap unless the spec
opts in to ``unshare`` or ``rlimits``), and the level in force is in the actor's counters (``isolation``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from topology import ActorKind, SpecModel, register_actor_kind


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


register_actor_kind(
    ActorKind(
        name="verify",
        config=VerifyConfig,
        factory="actors.verify._actor:VerifyActor",
        consumes=("rollouts",),
        publishes=("scored",),
        summary="scores rollouts with the domains' verifiers (code runs in a sandbox pool)",
        references={"domains": "domains"},
    )
)

__all__ = ["SandboxConfig", "VerifyConfig"]
