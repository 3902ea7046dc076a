"""SGLangEngine: the :class:`Engine` protocol over a running SGLang server's HTTP API.

Contract (the routes and JSON shapes of SGLang's native HTTP API):

* ``generate`` posts one ``/generate`` per request with ``input_ids``, ``return_logprob`` and
  ``logprob_start_len=-1``; token ids and behavior logprobs come from ``meta_info.output_token_logprobs``
  and each token's version from ``meta_info.weight_version`` (the tracked version when the server does not
  report one; ``"default"``, the weights the server started with, is 0 — after we had it load a version, that
  means it restarted, and the tracked version drops to 0 so that the current one is loaded again). A request
  the server aborts (``finish_reason.type == "abort"``, e.g. by a pause for a weight update) is resubmitted
  with its prompt plus the tokens it already has, up to ``max_resubmits`` times, so every chunk carries the
  version that really produced it; past that it is returned with ``finish_reason="abort"``.
* ``update_weights(version, source)``: a directory of safetensors → ``/update_weights_from_disk``; a
  :class:`DistributedWeights` → ``/init_weights_update_group`` once, then ``/update_weights_from_distributed``
  posted while the trainer broadcasts from a worker thread. Unless the caller already paused, the update is
  bracketed by ``/pause_generation {mode: abort}`` and ``/continue_generation``, so no request mixes versions.
  On failure the server keeps its old weights and the tracked version does not move.
* Every failure is an :class:`EngineHTTPError` naming the server URL and the call.

Non-goals: no streaming, no ``text`` prompts (callers tokenize), no CUDA-IPC ``update_weights_from_tensor``
(it needs a colocated trainer), no routing across several servers (run one engine per server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Literal, Unpack

from actors.engines._group import Broadcaster, DistributedWeights, describe
from actors.engines._http import Chunk, EngineHTTPError, HTTPEngine, HTTPOptions, reported_version, sampling_fields
from actors.engines._types import FinishReason, GenerationRequest

__all__ = ["SGLangEngine"]

PauseMode = Literal["abort", "retract", "in_place"]


def _sampling_params(request: GenerationRequest, remaining: int) -> dict[str, Any]:
    return {"max_new_tokens": remaining, **sampling_fields(request.params, seed_key="sampling_seed")}


def _finish_reason(meta: Mapping[str, Any]) -> FinishReason:
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, Mapping) else reason
    if kind in ("stop", "length", "abort"):
        return kind  # type: ignore[no-any-return]
    raise ValueError(f"unexpected finish_reason {reason!r}")


class SGLangEngine(HTTPEngine):
    """Drive one SGLang server. ``await engine.start()`` (or ``async with``) before use."""

    name = "sglang"

    def __init__(
        self,
        url: str,
        *,
        pause_mode: PauseMode = "abort",
        group_name: str = "weight_update_group",
        **options: Unpack[HTTPOptions],
    ) -> None:
        super().__init__(url, **options)
        self.pause_mode: PauseMode = pause_mode
        self.group_name = group_name
        self.server_info: dict[str, Any] = {}

    async def start(self, *, health_timeout_s: float = 60.0) -> None:
        """Wait until the server can generate, then read its model info and weight version."""
        await self.wait_healthy(timeout_s=health_timeout_s)
        info = await self._http.call("GET", "/get_model_info")
        self.server_info = dict(info) if isinstance(info, Mapping) else {}
        await self.refresh_version()

    async def wait_healthy(self, *, timeout_s: float = 60.0) -> None:
        await self._http.wait_healthy(("/health_generate", "/health"), timeout_s)

    async def refresh_version(self) -> int:
        """Adopt the server's ``weight_version`` when it is an integer, or 0 when it is "default" (what it started
        with)."""
        body = await self._http.call("GET", "/get_weight_version")
        found = reported_version(body.get("weight_version")) if isinstance(body, Mapping) else None
        if found is not None:
            self._version = found
        return self._version

    # ---- generation ------------------------------------------------------------------------------

    async def _generate_chunk(self, request: GenerationRequest, prefix: list[int], attempt: int) -> Chunk:
        payload = {
            "input_ids": list(request.prompt_ids) + prefix,
            "sampling_params": _sampling_params(request, request.params.max_new_tokens - len(prefix)),
            "return_logprob": True,
            "logprob_start_len": -1,
            "rid": request.request_id if attempt == 0 else f"{request.request_id}#{attempt}",
        }
        body = await self._http.call("POST", "/generate", json=payload, idempotent=False)
        try:
            meta = body["meta_info"]
            pairs = meta.get("output_token_logprobs") or []
            if not pairs and body.get("output_ids"):
                raise ValueError("output_token_logprobs missing although return_logprob was set")
            # the tokens are read from the logprob pairs: they must be every token the text is made of
            ids, counted = body.get("output_ids"), meta.get("completion_tokens")
            if ids is not None and len(ids) != len(pairs):
                raise ValueError(f"{len(ids)} output_ids but {len(pairs)} output_token_logprobs")
            if isinstance(counted, int) and counted != len(pairs):
                raise ValueError(f"completion_tokens {counted} but {len(pairs)} output_token_logprobs")
            if not pairs and body.get("text"):
                raise ValueError("a text without tokens")
            version = reported_version(meta.get("weight_version"))
            if version == 0 and self._version != 0:
                # "default" after we had it load a version: the server restarted and serves what it started with; so
                # are these tokens labelled, and the tracked version says the one we gave it must be loaded again
                self._version = 0
            return Chunk(
                token_ids=[int(entry[1]) for entry in pairs],
                logprobs=[float(entry[0]) for entry in pairs],
                version=self._version if version is None else version,
                text=str(body.get("text") or ""),
                finish_reason=_finish_reason(meta),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise EngineHTTPError(self.name, self.url, "POST", "/generate", 200, f"malformed response: {exc}") from None

    # ---- control ---------------------------------------------------------------------------------

    async def pause(self) -> None:
        """Stop generating; in-flight requests are aborted (and resubmitted by their callers)."""
        await self._http.call("POST", "/pause_generation", json={"mode": self.pause_mode})
        self._paused = True

    async def resume(self) -> None:
        await self._http.call("POST", "/continue_generation", json={})
        self._paused = False

    async def flush_cache(self) -> None:
        await self._http.call("POST", "/flush_cache", idempotent=False)

    async def _load_from_disk(self, version: int, path: str) -> None:
        await self._http.call(
            "POST",
            "/update_weights_from_disk",
            json={
                "model_path": path,
                "load_format": "safetensors",
                "abort_all_requests": False,
                "flush_cache": True,
                "weight_version": str(version),
            },
            idempotent=False,
            timeout_s=self.update_timeout_s,
        )

    async def _join_group(self, broadcaster: Broadcaster) -> None:
        await self._http.call(
            "POST",
            "/init_weights_update_group",
            json={
                "master_address": broadcaster.master_address,
                "master_port": broadcaster.master_port,
                "rank_offset": self.rank_offset,
                "world_size": broadcaster.world_size,
                "group_name": broadcaster.group_name,
                "backend": broadcaster.backend,
            },
            idempotent=False,
            timeout_s=broadcaster.timeout_s,
        )

    async def _receive_broadcast(self, version: int, source: DistributedWeights) -> None:
        names, dtypes, shapes = describe(source.tensors)
        receive = self._http.call(
            "POST",
            "/update_weights_from_distributed",
            json={
                "names": names,
                "dtypes": dtypes,
                "shapes": shapes,
                "group_name": source.broadcaster.group_name,
                "flush_cache": True,
                "abort_all_requests": False,
                "weight_version": str(version),
            },
            idempotent=False,
            timeout_s=self.update_timeout_s,
        )
        await asyncio.gather(receive, asyncio.to_thread(source.broadcaster.broadcast, source.tensors))
