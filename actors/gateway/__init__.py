"""The `gateway` actor kind: an OpenAI-compatible HTTP API served by the topology's generators.

Importing this package stays light (the spec layer imports ``actors.gateway._config``); the actor, the app
and the serve client (Starlette, uvicorn, prometheus-client, the tokenizer) load on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.gateway._config import GatewayConfig
from topology import lazy_exports

if TYPE_CHECKING:
    from actors.gateway._actor import GatewayActor, generated_api_key, read_api_keys
    from actors.gateway._app import ApiKeys, Gateway
    from actors.gateway._client import (
        CallCancelled,
        GenerationError,
        GeneratorsBusy,
        NoGenerators,
        ServeCall,
        ServeClient,
    )
    from actors.gateway._errors import ApiError

_LAZY = {
    "GatewayActor": "_actor",
    "generated_api_key": "_actor",
    "read_api_keys": "_actor",
    "ApiError": "_errors",
    "ApiKeys": "_app",
    "Gateway": "_app",
    "CallCancelled": "_client",
    "GenerationError": "_client",
    "GeneratorsBusy": "_client",
    "NoGenerators": "_client",
    "ServeCall": "_client",
    "ServeClient": "_client",
}

__all__ = [
    "ApiError",
    "ApiKeys",
    "CallCancelled",
    "Gateway",
    "GatewayActor",
    "GatewayConfig",
    "GenerationError",
    "GeneratorsBusy",
    "NoGenerators",
    "ServeCall",
    "ServeClient",
    "generated_api_key",
    "read_api_keys",
]

__getattr__ = lazy_exports(__name__, _LAZY)
