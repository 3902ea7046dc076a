"""Config of the `gateway` actor kind (light module; registers the kind on import).

The gateway serves an OpenAI-compatible API backed by the generators, records every served request to
`traffic` and accepts late feedback on `/v1/feedback`, published to `feedback`.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator

from topology import (
    ActorKind,
    ActorSpec,
    KeyPath,
    SectionCheck,
    Spec,
    SpecModel,
    bind_problem,
    register_actor_kind,
    show,
)


class GatewayConfig(SpecModel):
    """Fields of a `gateway` actor block (besides kind/replicas/resources/consumes/publishes)."""

    host: str = "127.0.0.1"  # interface to listen on; 0.0.0.0 exposes it to the network
    port: int = Field(default=8000, ge=0, le=65535)  # 0 picks a free port (printed at start)
    model_name: str = "flywheel"  # the model id reported by /v1/models and accepted in requests
    api_keys_env: str = "FLYWHEEL_API_KEYS"  # env var with comma-separated keys for feedback and admin routes
    api_keys_file: str | None = None  # file with one key per line (# comments); relative to the spec file; it must
    #   exist when the gateway starts (validate checks it: an error on the local runtime, a warning on a cluster)
    # with neither keys in the env var nor a file: make one key and write it to <run_dir>/<actor>/api_key (mode
    # 0600; kept across gateway restarts, shared by replicas), so feedback works out of the box; false: refuse
    # every feedback call until keys are configured
    generate_api_key: bool = True
    require_key_for_inference: bool = False  # also demand a key on /v1/chat/completions, /v1/completions
    require_key_for_metrics: bool = False  # also demand a key on /metrics (Prometheus scrapes without one)
    max_concurrency: int = Field(default=256, ge=1)  # requests in flight before new ones get HTTP 429
    max_streams: int = Field(default=256, ge=1)  # streaming responses open at once before HTTP 429
    max_body_bytes: int = Field(default=1 << 20, ge=1024)  # larger request bodies get HTTP 413
    max_tokens: int = Field(default=1024, ge=1)  # largest max_tokens a request may ask for (HTTP 400 above)
    default_max_tokens: int = Field(default=256, ge=1)  # max_tokens of a request that names none
    retry_after_s: int = Field(default=1, ge=1)  # Retry-After of a 429 when the generators are full
    # per request, end to end: a whole answer (streamed or not) within it, else 504 (an error event in a stream)
    request_timeout_s: float = Field(default=120.0, gt=0)
    body_timeout_s: float = Field(default=10.0, gt=0)  # to send the whole request body; HTTP 408 after it
    # Host header values served (port ignored; "*.example.com" matches subdomains, "*" any host). Default: the
    # loopback names when listening on a loopback address, else any host. Stops DNS-rebinding pages.
    trusted_hosts: list[str] | None = None
    default_domain: str | None = None  # domain recorded with requests that name none (per-domain baselines)

    @field_validator("host")
    @classmethod
    def _listen_host(cls, host: str) -> str:
        # an IPv6 address has two colons or more: one is a port (or a scheme), which the socket cannot bind to
        if "/" in host or "[" in host or any(c.isspace() for c in host) or host.count(":") == 1:
            raise ValueError(
                "expected a host name or IP address to listen on, without scheme, brackets or port (the port is "
                f"port:), like 127.0.0.1, 0.0.0.0 or ::, got {show(host)}"
            )
        return host

    @field_validator("api_keys_env")
    @classmethod
    def _env_name(cls, name: str) -> str:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise ValueError(f"expected the NAME of an environment variable (not the keys), got {show(name)}")
        return name

    @field_validator("trusted_hosts")
    @classmethod
    def _host_patterns(cls, hosts: list[str] | None) -> list[str] | None:
        if hosts is None:
            return None
        for host in hosts:
            bare = host[2:] if host.startswith("*.") else host
            if host != "*" and (not bare or "*" in bare or "/" in bare or " " in bare or bare.count(":") == 1):
                raise ValueError(
                    "expected host names without scheme or port, like api.example.com, *.example.com, 10.0.0.5"
                    f" or *, got {show(host)}"
                )
        return [host.lower().strip("[]") for host in hosts]

    @model_validator(mode="after")
    def _default_within_cap(self) -> GatewayConfig:
        if self.default_max_tokens > self.max_tokens:
            raise ValueError(
                f"expected default_max_tokens <= max_tokens ({self.max_tokens}), got {self.default_max_tokens}"
            )
        return self


def _check(check: SectionCheck, path: KeyPath, actor: ActorSpec, spec: Spec) -> BaseModel:
    """On the local runtime, no two listeners on one port (every gateway replica binds host:port itself: the
    second crash-loops), and at ``flywheel up`` none held by another process. ``api_keys_file`` made absolute against
    the spec file that set it; it must exist (the gateway reads it at start, and crash-loops when it cannot): an error
    on the local runtime, a warning on a cluster."""
    config = actor.config
    assert isinstance(config, GatewayConfig)
    if spec.runtime.kind == "local" and config.port != 0:
        _check_port(check, path, actor, config, spec)
        problem = bind_problem(config.host, config.port) if check.starting else None
        if problem is not None:  # each start would crash on it until the topology gave up (~30 s)
            at = (*path, "port")
            check.error(
                at,
                f"expected a port free on this machine, but {problem} (another flywheel run, or another server: "
                f"stop it, or set another port in {check.setting(at)}; 0 picks a free one)",
            )
    if config.api_keys_file is None:
        return config
    at = (*path, "api_keys_file")
    keys_file = Path(config.api_keys_file).expanduser()
    if not keys_file.is_absolute():
        keys_file = (check.base_dir(at) / keys_file).resolve()
    if check.thorough and not keys_file.is_file():
        elsewhere = "" if check.local else " here (fine if it is there on the node the gateway runs on)"
        check.error(
            at,
            f"expected a file of API keys, got {show(config.api_keys_file)} ({keys_file} is no file{elsewhere})",
            warning=not check.local,
        )
    return config.model_copy(update={"api_keys_file": str(keys_file)})


_ANY_ADDRESS = ("", "0.0.0.0", "::")


def _same_socket(host: str, port: int, other_host: str, other_port: int | None) -> bool:
    """Whether two listeners on this machine would want one socket (a wildcard address takes every interface)."""
    return port == other_port and (host == other_host or host in _ANY_ADDRESS or other_host in _ANY_ADDRESS)


def _check_port(check: SectionCheck, path: KeyPath, actor: ActorSpec, config: GatewayConfig, spec: Spec) -> None:
    at = (*path, "port")
    if actor.replicas > 1:
        check.error(
            at,
            f"expected port: 0 (a free port for each) with replicas: {actor.replicas} on the local runtime: each "
            f"replica listens on {config.host}:{config.port} of this machine and only the first can; got {config.port}",
        )
        return
    taken: list[str] = []
    runtime = spec.runtime
    if _same_socket(config.host, config.port, runtime.metrics_host, runtime.metrics_port):
        taken.append(f"runtime.metrics_port ({check.where(('runtime', 'metrics_port'))})")
    for name, other in spec.actors.items():
        if name == actor.name:
            break  # of two gateways on one port, the later one carries the error
        theirs = other.config
        if isinstance(theirs, GatewayConfig) and _same_socket(config.host, config.port, theirs.host, theirs.port):
            taken.append(f"gateway {name}'s ({check.where(('actors', name, 'port'))})")
    if taken:
        check.error(
            at,
            f"expected a port other than {' and '.join(taken)}, got {config.port} (set another port in "
            f"{check.setting(at)}; 0 picks a free one)",
        )


register_actor_kind(
    ActorKind(
        name="gateway",
        config=GatewayConfig,
        factory="actors.gateway._actor:GatewayActor",
        consumes=(),
        publishes=("traffic", "feedback"),
        summary="OpenAI-compatible HTTP API; records traffic and accepts feedback",
        references={"default_domain": "domains"},
        check=_check,
    )
)

__all__ = ["GatewayConfig"]
