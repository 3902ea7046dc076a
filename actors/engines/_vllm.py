"""VLLMEngine: the :class:`Engine` protocol over a running vLLM OpenAI-compatible server.

Contract (vLLM's OpenAI-compatible routes and its dev-mode control routes, which need
``VLLM_SERVER_DEV_MODE=1``):

* ``generate`` posts one ``/v1/completions`` per request with the prompt as a list of token ids,
  ``logprobs=0`` (the sampled token's logprob only), ``return_token_ids`` and
  ``return_tokens_as_token_ids`` (so ids survive on servers that ignore ``return_token_ids``). This is the
  primary path because every vLLM release of the last year serves it; ``/inference/v1/generate`` is newer
  and optional. A request finishing with ``"abort"`` is resubmitted with its prompt plus the tokens it
  already has, up to ``max_resubmits`` times.
* Versions: completions carry no weight version, so each token gets the version the client tracked when
  its request (or resubmission) was sent. Updates pause with ``mode=keep`` (requests freeze and continue on
  the new weights after ``/resume``), so a request that straddles an update is labelled with the *older*
  version — the conservative side for staleness. Use ``pause_mode="abort"`` for exact per-token versions. After a
  call that could not connect, the next request first reads ``/weight_info``: a restarted server says ``"default"``
  (the weights it started with), the tracked version drops to 0, and the current one is loaded again.
* A server restarted between two calls (none failed) is found the same way: once the server holds a version label we
  gave it, a completion that comes back at least :attr:`VLLMEngine.restart_check_s` after the last look waits for a
  read of ``/weight_info`` (one read at a time; the completions that come back meanwhile do not wait). ``"default"``
  there means the server restarted: that completion's tokens are labelled 0 (so are those of completions sent before
  that was found and answered after), the tracked version drops to 0, and the current one is loaded again. Completions
  that came back from a restarted server before that read keep their label: at most ``restart_check_s`` of them, and
  their logprobs are the server's own, so the learner's importance weights still see what sampled them. Looking after
  every completion would cost each one a round trip for an event this rare. A server that keeps no labels
  (``/weight_info`` or ``/update_weight_version`` missing: no dev mode, or an older release) offers no way to tell:
  there a restart is found only at the next call that cannot connect.
* An update whose loading call got no answer (a timeout, a dropped connection) leaves the server holding the new
  weights or the old ones, no telling which: until an update succeeds, a generation raises (no response: the
  generator keeps its prompts and waits) rather than label tokens with a version that may not have made them.
* ``update_weights(version, source)``:
  - :class:`DistributedWeights` → ``/init_weight_transfer_engine`` once (concurrently with the trainer's
    ``connect``), then per update ``/start_weight_update``, ``/update_weights`` (concurrently with the
    broadcast) and ``/finish_weight_update {weight_version}``. Real vLLM's transfer engine rendezvouses with
    its own ``NCCLWeightTransferEngine.trainer_init``; pass a broadcaster wrapping that (see
    :class:`Broadcaster`) — our :class:`WeightBroadcaster` speaks to the fake server and to SGLang.
  - a safetensors directory → ``/collective_rpc {method: "reload_weights", kwargs: {weights_path}}``
    (vLLM's worker-side reload; no disk route exists), then ``/reset_prefix_cache`` and
    ``/update_weight_version`` (tolerated when missing on older servers).
  Both are bracketed by ``/pause?mode=…`` and ``/resume`` unless the caller already paused.
* Loading weights needs vLLM :attr:`VLLMEngine.min_release` or newer started with ``VLLM_SERVER_DEV_MODE=1``. A server
  without those routes (404, 405: no dev mode, or too old) or whose reload takes no ``weights_path`` (it says so, or
  ``GET /version`` names an older release) fails the update with :class:`EngineUnsupportedError` (an
  :class:`UnsupportedServerError`), whose one line says what to run; the weights it serves stay as they were.
* Every failure is an :class:`EngineHTTPError` naming the server URL and the call.

Non-goals: no streaming, no chat endpoint, no LoRA hot-swap, no multi-server routing.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Mapping
from typing import Any, Literal, Unpack

from actors.engines._group import Broadcaster, DistributedWeights, describe
from actors.engines._http import (
    Chunk,
    EngineHTTPError,
    EngineUnsupportedError,
    HTTPEngine,
    HTTPOptions,
    reported_version,
    sampling_fields,
)
from actors.engines._types import GenerationRequest, WeightSource

__all__ = ["VLLMEngine", "release_tuple"]

PauseMode = Literal["keep", "abort", "wait"]

# the dev-mode routes an update goes through (VLLM_SERVER_DEV_MODE=1): a 404 or 405 from one means the server lacks it
_DEV_ROUTES = frozenset(
    {
        "/pause",
        "/resume",
        "/collective_rpc",
        "/reset_prefix_cache",
        "/init_weight_transfer_engine",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
    }
)


def release_tuple(release: str) -> tuple[int, ...] | None:
    """``"0.11.2rc1.dev3+g…"`` → ``(0, 11, 2)``; None when ``release`` does not start with a version number."""
    found = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", release.strip())
    return tuple(int(part) for part in found.groups() if part is not None) if found else None


def _token_id(entry: Any) -> int:
    text = str(entry)
    if not text.startswith("token_id:"):
        raise ValueError(f"logprob token {text!r} is not 'token_id:N' (return_tokens_as_token_ids ignored?)")
    return int(text.removeprefix("token_id:"))


class VLLMEngine(HTTPEngine):
    """Drive one vLLM server. ``await engine.start()`` (or ``async with``) before use."""

    name = "vllm"
    # the oldest vLLM release this client loads weights into: the routes and arguments of reference/ENGINES.md
    # (/pause?mode=keep, /collective_rpc reload_weights with weights_path, /weight_info, /update_weight_version)
    min_release = "0.20"
    # how often a completion that came back looks whether the server restarted (see the module docstring)
    restart_check_s = 2.0

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        pause_mode: PauseMode = "keep",
        **options: Unpack[HTTPOptions],
    ) -> None:
        super().__init__(url, **options)
        self.model = model
        self.pause_mode: PauseMode = pause_mode
        self._labelled = False  # the server holds a version label we gave it (a restart turns it back to "default")
        self._restarts = 0  # restarts found: a completion sent before one was found is labelled 0 when it comes back
        self._weights_unknown = False  # an update got no answer: what the server holds is unknown (``_loading``)
        self._looked = -math.inf  # when a completion last started a read of /weight_info (monotonic)

    async def start(self, *, health_timeout_s: float = 60.0) -> None:
        """Wait for ``/health``, learn the served model name and, where the server reports one, its version."""
        await self.wait_healthy(timeout_s=health_timeout_s)
        if self.model is None:
            models = await self._http.call("GET", "/v1/models")
            try:
                self.model = str(models["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                raise EngineHTTPError(self.name, self.url, "GET", "/v1/models", 200, "no served model listed") from None
        await self.refresh_version()

    async def wait_healthy(self, *, timeout_s: float = 60.0) -> None:
        await self._http.wait_healthy(("/health",), timeout_s)

    async def refresh_version(self) -> int:
        try:
            body = await self._http.call("GET", "/weight_info", retries=0)
        except EngineHTTPError as exc:
            if exc.status == 404:  # older servers do not track versions; keep ours
                return self._version
            raise
        found = reported_version(body.get("weight_version")) if isinstance(body, dict) else None
        if found is not None:  # "default": the weights it started with (0); no label at all: keep ours
            self._version = found
            self._labelled = found != 0
        return self._version

    async def _restarted(self) -> bool:
        """Whether the server restarted since it took the version label we gave it (see the module docstring), asked
        by a completion that just came back: read at most once per ``restart_check_s``, else False at once."""
        now = time.monotonic()
        if not self._labelled or now - self._looked < self.restart_check_s:
            return False
        self._looked = now
        return await self._read_restart()

    async def _read_restart(self) -> bool:
        try:
            body = await self._http.call("GET", "/weight_info", retries=0)
        except Exception:  # not answering now: the next call that cannot connect has the next request look again
            return False
        if not self._labelled or not isinstance(body, Mapping) or reported_version(body.get("weight_version")) != 0:
            return False
        # "default" where our label was: it restarted and serves the weights it started with
        self._version = 0
        self._labelled = False
        self._restarts += 1
        return True

    # ---- generation ------------------------------------------------------------------------------

    def _payload(self, request: GenerationRequest, prefix: list[int]) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": list(request.prompt_ids) + prefix,
            "max_tokens": request.params.max_new_tokens - len(prefix),
            **sampling_fields(request.params, seed_key="seed"),
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
        }

    async def _generate_chunk(self, request: GenerationRequest, prefix: list[int], attempt: int) -> Chunk:
        if self._weights_unknown:  # its tokens would carry a version that may not be the one that made them
            raise EngineHTTPError(
                self.name,
                self.url,
                "POST",
                "/v1/completions",
                None,
                "the weights it serves are unknown since a weight update got no answer (loaded or not); "
                "waiting for the next update",
            )
        if self._http.lost_contact:  # completions carry no version: after an outage, ask whether it still holds ours
            self._http.lost_contact = False
            await self.refresh_version()
        version, restarts = self._version, self._restarts
        body = await self._http.call("POST", "/v1/completions", json=self._payload(request, prefix), idempotent=False)
        try:
            choice = body["choices"][0]
            lp = choice["logprobs"]
            chunk_logprobs = [float(x) if x is not None else -math.inf for x in lp["token_logprobs"]]
            ids = choice.get("token_ids")
            chunk_ids = [int(t) for t in ids] if ids is not None else [_token_id(t) for t in lp["tokens"]]
            if len(chunk_ids) != len(chunk_logprobs):
                raise ValueError(f"{len(chunk_ids)} token ids but {len(chunk_logprobs)} logprobs")
            reason = choice.get("finish_reason")
            if reason not in ("stop", "length", "abort"):
                raise ValueError(f"unexpected finish_reason {reason!r}")
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise EngineHTTPError(
                self.name, self.url, "POST", "/v1/completions", 200, f"malformed response: {exc}"
            ) from None
        if version != 0 and (await self._restarted() or restarts != self._restarts):
            version = 0  # made by a restarted server: the weights it started with
        return Chunk(chunk_ids, chunk_logprobs, version, str(choice.get("text") or ""), reason)

    # ---- control ---------------------------------------------------------------------------------

    async def pause(self) -> None:
        await self._http.call("POST", "/pause", params={"mode": self.pause_mode})
        self._paused = True

    async def resume(self) -> None:
        await self._http.call("POST", "/resume")
        self._paused = False

    async def update_weights(self, version: int, source: WeightSource | DistributedWeights) -> None:
        try:
            await super().update_weights(version, source)
        except EngineHTTPError as exc:
            unsupported = await self._unsupported(exc)
            if unsupported is None:
                raise
            raise unsupported from None

    async def _unsupported(self, exc: EngineHTTPError) -> EngineUnsupportedError | None:
        """``exc`` as what it is when the server lacks what loading weights needs (see the module docstring); None
        when it failed for another reason."""
        if exc.status is None or exc.path not in _DEV_ROUTES or isinstance(exc, EngineUnsupportedError):
            return None
        release = await self._release()
        running = release_tuple(release) if release else None
        too_old = running is not None and running < (release_tuple(self.min_release) or ())
        reload_refused = exc.path == "/collective_rpc" and (too_old or "weights_path" in exc.message)
        if exc.status not in (404, 405) and not reload_refused:
            return None
        runs = f"; this one runs vLLM {release}" if release else ""
        return EngineUnsupportedError(
            self.name,
            self.url,
            exc.method,
            exc.path,
            exc.status,
            f"{exc.message} — this server cannot load new weights: flywheel needs vLLM {self.min_release} or newer "
            "started with VLLM_SERVER_DEV_MODE=1 (its /pause, /resume and /collective_rpc routes, and a reload_weights "
            f"that takes weights_path){runs}. Upgrade or restart it so; until then it serves the weights it has",
        )

    async def _release(self) -> str | None:
        """The vLLM release the server says it runs (``GET /version``), or None."""
        try:
            body = await self._http.call("GET", "/version", retries=0)
        except EngineHTTPError:
            return None
        found = body.get("version") if isinstance(body, Mapping) else None
        return str(found) if found else None

    async def _load_from_disk(self, version: int, path: str) -> None:
        await self._loading(
            self._http.call(
                "POST",
                "/collective_rpc",
                json={"method": "reload_weights", "kwargs": {"weights_path": path}},
                idempotent=False,
                timeout_s=self.update_timeout_s,
            )
        )
        await self._http.call("POST", "/reset_prefix_cache", idempotent=False)
        await self._set_server_version(version)

    async def _loading(self, call: Awaitable[Any]) -> Any:
        """A call that changes the weights the server holds. Its completions carry no version: when the call got no
        answer (a timeout, a dropped connection), the server may have loaded the new weights or kept the old ones, so
        no completion is labelled until an update succeeds (``_generate_chunk`` raises meanwhile)."""
        try:
            result = await call
        except EngineHTTPError as exc:
            if exc.status is None:
                self._weights_unknown = True
            raise
        self._weights_unknown = False
        return result

    async def _set_server_version(self, version: int) -> None:
        try:
            await self._http.call("POST", "/update_weight_version", json={"new_version": str(version)}, retries=0)
        except EngineHTTPError as exc:
            if exc.status != 404:  # older servers: the client-side version is all there is
                raise
            self._labelled = False
            return
        self._labelled = True

    async def _join_group(self, broadcaster: Broadcaster) -> None:
        await self._http.call(
            "POST",
            "/init_weight_transfer_engine",
            json={
                "init_info": {
                    "master_address": broadcaster.master_address,
                    "master_port": broadcaster.master_port,
                    "rank_offset": self.rank_offset,
                    "world_size": broadcaster.world_size,
                }
            },
            idempotent=False,
            timeout_s=broadcaster.timeout_s,
        )

    async def _receive_broadcast(self, version: int, source: DistributedWeights) -> None:
        names, dtypes, shapes = describe(source.tensors)
        await self._http.call("POST", "/start_weight_update", json={"is_checkpoint_format": True}, idempotent=False)
        receive = self._http.call(
            "POST",
            "/update_weights",
            json={"update_info": {"names": names, "dtype_names": dtypes, "shapes": shapes, "packed": False}},
            idempotent=False,
            timeout_s=self.update_timeout_s,
        )
        await self._loading(asyncio.gather(receive, asyncio.to_thread(source.broadcaster.broadcast, source.tensors)))
        await self._http.call("POST", "/finish_weight_update", json={"weight_version": str(version)}, idempotent=False)
        self._labelled = True
