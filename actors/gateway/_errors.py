"""OpenAI-shaped errors of the gateway: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status
(``param``: the request field at fault, where one is).

Contract: every error a client sees is an :class:`ApiError`. Messages about the client's own request say what
was wrong and what is expected; server-side failures (5xx) say what happened in general terms and carry the
request id, never an exception's text, a path, an address or a traceback (those go to the gateway's log).

Non-goals: localisation, error catalogues.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from starlette.responses import Response

__all__ = [
    "JSON",
    "ApiError",
    "busy",
    "internal_error",
    "unavailable",
    "unknown_model",
]

JSON = "application/json"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = dict(headers or {})

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return orjson.dumps({"error": error})

    def response(self) -> Response:
        return Response(self.body(), status_code=self.status, media_type=JSON, headers=self.headers)


def busy(message: str, retry_after_s: int) -> ApiError:
    return ApiError(
        429,
        f"{message}; retry after {retry_after_s}s",
        type="rate_limit_error",
        code="busy",
        headers={"Retry-After": str(retry_after_s)},
    )


def unavailable(message: str, code: str, retry_after_s: int) -> ApiError:
    """A 503: nothing can answer the request now, and a retry later may succeed."""
    return ApiError(503, message, type="server_error", code=code, headers={"Retry-After": str(retry_after_s)})


def internal_error(request_id: str) -> ApiError:
    return ApiError(
        500,
        f"the gateway failed to handle this request (request id {request_id}); it is logged",
        type="server_error",
        code="internal_error",
    )


def unknown_model(model: str, served: str) -> ApiError:
    return ApiError(
        404,
        f"the model {model!r} does not exist; this gateway serves {served!r}",
        code="model_not_found",
        param="model",
    )
