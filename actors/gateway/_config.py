"""Config of the `gateway` actor kind (light module; registers the kind on import).

The gateway serves an OpenAI-compatible API backed by the generators, records every served request to
`traffic` and accepts late feedback on `/v1/feedback`, published to `feedback`.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from topology._registry import ActorKind, register_actor_kind
from topology._spec import SpecModel, show


class GatewayConfig(SpecModel):
    """Fields of a `gateway` actor block (besides kind/replicas/resources/consumes/publishes)."""

    host: str = "127.0.0.1"  # interface to listen on; 0.0.0.0 exposes it to the network
    port: int = Field(default=8000, ge=0, le=65535)  # 0 picks a free port (printed at start)
    model_name: str = "flywheel"  # the model id reported by /v1/models and accepted in requests
    api_keys_env: str = "FLYWHEEL_API_KEYS"  # env var with comma-separated keys for feedback and admin routes
    max_concurrency: int = Field(default=256, ge=1)  # requests in flight before new ones get HTTP 429
    request_timeout_s: float = Field(default=120.0, gt=0)  # per request, end to end
    default_domain: str | None = None  # domain recorded with requests that name none (per-domain baselines)

    @field_validator("api_keys_env")
    @classmethod
    def _env_name(cls, name: str) -> str:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise ValueError(f"expected the NAME of an environment variable (not the keys), got {show(name)}")
        return name


register_actor_kind(
    ActorKind(
        name="gateway",
        config=GatewayConfig,
        factory="actors.gateway._actor:GatewayActor",
        consumes=(),
        publishes=("traffic", "feedback"),
        summary="OpenAI-compatible HTTP API; records traffic and accepts feedback",
        domain_fields=("default_domain",),
    )
)

__all__ = ["GatewayConfig"]
