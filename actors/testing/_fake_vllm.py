"""FakeVLLMServer: vLLM's OpenAI-compatible and dev-mode routes over a real
:class:`TorchEngine`.

Contract: ``/v1/completions`` really generates from token-id prompts (or text, tokenized with the engine's
tokenizer) and honours ``logprobs``, ``return_token_ids`` and ``return_tokens_as_token_ids``; ``/pause``
(modes abort / wait / keep) and ``/resume`` behave as in vLLM; weights really change through
``/collective_rpc {method: "reload_weights", kwargs: {weights_path}}`` (safetensors from disk) and through
the weight-transfer routes (``/init_weight_transfer_engine``, ``/start_weight_update``,
``/update_weights``, ``/finish_weight_update``) over a torch.distributed gloo group — where real vLLM uses
its own NCCL rendezvous. ``/weight_info`` reports the label set by ``/finish_weight_update`` or
``/update_weight_version``. Bad payloads answer 400 ``{"error": …}`` and change nothing. ``GET /version`` says
``release``. ``api_key``: as ``--api-key``, the ``/v1`` routes answer 401 without ``Authorization: Bearer <key>``.

It can answer as the older servers users meet: ``dev_mode=False`` (not started with ``VLLM_SERVER_DEV_MODE=1``)
leaves out every dev-mode route (``/pause``, ``/collective_rpc``, ``/weight_info``, …: 404 ``{"detail": "Not
Found"}``, as FastAPI answers); a ``release`` older than :attr:`~actors.engines.VLLMEngine.min_release` has a worker
``reload_weights`` that takes no ``weights_path``: ``/collective_rpc`` answers 500 with the worker's ``TypeError``.

Non-goals: chat completions, streaming, n > 1, top-logprob alternatives, LoRA, sleep/wake.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from actors.engines import Completion, GenerationRequest, SamplingParams, TorchEngine, VLLMEngine, WeightUpdateError
from actors.engines._vllm import release_tuple
from actors.testing._host import EngineHost, served_name
from actors.testing._server import AppServer

__all__ = ["FakeVLLMServer"]


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class FakeVLLMServer(AppServer):
    """``async with FakeVLLMServer(engine) as server: VLLMEngine(server.url)``."""

    def __init__(
        self,
        engine: TorchEngine,
        *,
        model: str | None = None,
        port: int | None = None,
        release: str = VLLMEngine.min_release,
        dev_mode: bool = True,
        api_key: str | None = None,
    ) -> None:
        self.host = EngineHost(engine)
        self.model = model or served_name(engine)  # as `--model-path` / `vllm serve` name it
        self.release = release  # the vLLM release it answers as (GET /version)
        self.dev_mode = dev_mode  # started with VLLM_SERVER_DEV_MODE=1: the routes that pause and load weights
        self.weight_version = "default"  # vLLM's label for the weights it started with
        self.weight_info_reads = 0  # GET /weight_info answered (how often a client looks)
        self._updating = False
        # started with --api-key: the /v1 routes want the Bearer key (vLLM leaves its other routes open)
        super().__init__(self._build(), port=port, api_key=api_key, guarded=lambda path: path.startswith("/v1"))

    def _choice(self, completion: Completion, body: dict[str, Any]) -> dict[str, Any]:
        tokenizer = self.host.engine.tokenizer
        choice: dict[str, Any] = {
            "index": 0,
            "text": completion.text,
            "finish_reason": completion.finish_reason,
            "stop_reason": None,
            "logprobs": None,
        }
        if body.get("logprobs") is not None:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            tokens = [f"token_id:{t}" if as_ids else tokenizer.decode([t]) for t in completion.token_ids]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": list(completion.logprobs),
                "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, completion.logprobs, strict=True)],
                "text_offset": [],
            }
        if body.get("return_token_ids"):
            choice["token_ids"] = list(completion.token_ids)
            choice["prompt_token_ids"] = list(completion.prompt_ids)
        return choice

    def _build(self) -> FastAPI:
        app = FastAPI(title="fake vllm")
        host = self.host

        @app.exception_handler(WeightUpdateError)
        async def _rejected(_: Request, exc: WeightUpdateError) -> JSONResponse:
            return _error(str(exc))

        @app.exception_handler(ValueError)
        async def _bad_request(_: Request, exc: ValueError) -> JSONResponse:
            return JSONResponse(
                {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}}, status_code=400
            )

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {}

        @app.get("/version")
        async def version() -> dict[str, Any]:
            return {"version": self.release}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "flywheel"}]}

        @app.post("/v1/completions")
        async def completions(body: dict[str, Any]) -> Any:
            if body.get("model") not in (None, self.model):
                return JSONResponse(
                    {"error": {"message": f"model {body.get('model')!r} does not exist"}}, status_code=404
                )
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                prompt = self.host.engine.tokenizer.encode(prompt)
            if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
                raise ValueError("prompt must be a string or a non-empty list of token ids (one prompt)")
            top_k = int(body.get("top_k") or -1)
            stop = body.get("stop") or ()
            params = SamplingParams(
                max_new_tokens=int(body.get("max_tokens") or 16),
                temperature=float(body.get("temperature", 1.0)),
                top_p=float(body.get("top_p", 1.0)),
                top_k=0 if top_k < 0 else top_k,
                stop=(stop,) if isinstance(stop, str) else tuple(stop),
                stop_token_ids=tuple(int(t) for t in body.get("stop_token_ids") or ()),
                ignore_eos=bool(body.get("ignore_eos", False)),
                seed=None if body.get("seed") is None else int(body["seed"]),
            )
            rid = f"cmpl-{uuid.uuid4().hex}"
            completion = await host.generate(GenerationRequest(rid, tuple(prompt), params))
            return {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [self._choice(completion, body)],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(completion.token_ids),
                    "total_tokens": len(prompt) + len(completion.token_ids),
                },
            }

        if self.dev_mode:
            self._dev_routes(app)
        return app

    def _dev_routes(self, app: FastAPI) -> None:
        """The routes vLLM serves only with ``VLLM_SERVER_DEV_MODE=1``."""
        host = self.host
        reload_takes_path = (release_tuple(self.release) or (0,)) >= (release_tuple(VLLMEngine.min_release) or ())

        @app.post("/pause")
        async def pause(mode: str = "abort") -> dict[str, Any]:
            await host.pause(mode)
            return {"status": "paused"}

        @app.post("/resume")
        async def resume() -> dict[str, Any]:
            await host.resume()
            return {"status": "resumed"}

        @app.get("/is_paused")
        async def is_paused() -> dict[str, Any]:
            return {"is_paused": host.paused}

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache() -> dict[str, Any]:
            return {}

        @app.get("/weight_info")
        async def weight_info() -> dict[str, Any]:
            self.weight_info_reads += 1
            return {"weight_version": self.weight_version}

        @app.post("/update_weight_version")
        async def update_weight_version(body: dict[str, Any]) -> dict[str, Any]:
            self.weight_version = str(body["new_version"])
            return {"success": True, "new_version": self.weight_version}

        @app.get("/get_world_size")
        async def world_size() -> dict[str, Any]:
            return {"world_size": 1}

        @app.post("/collective_rpc")
        async def collective_rpc(body: dict[str, Any]) -> Any:
            if body.get("method") != "reload_weights":
                return _error(
                    "the fake server only implements collective_rpc method 'reload_weights', "
                    f"got {body.get('method')!r}"
                )
            kwargs = body.get("kwargs") or {}
            if "weights_path" in kwargs and not reload_takes_path:  # the worker's own TypeError, from the engine core
                return _error(
                    "Call to collective_rpc method failed: reload_weights() got an unexpected keyword argument "
                    "'weights_path'",
                    status=500,
                )
            path = kwargs.get("weights_path") or (body.get("args") or [None])[0]
            if not isinstance(path, str):
                return _error("reload_weights needs kwargs.weights_path (a safetensors file or directory)")
            await host.load_from_disk(path, host.engine.version + 1)
            return {"results": [None]}

        @app.post("/init_weight_transfer_engine")
        async def init_transfer(body: dict[str, Any]) -> Any:
            info = body.get("init_info")
            if not isinstance(info, dict):
                return _error("Missing 'init_info' in request body")
            await host.join_group(
                str(info["master_address"]),
                int(info["master_port"]),
                int(info["world_size"]),
                int(info.get("rank_offset", 1)),
                "gloo",
                "weight_update_group",
            )
            return {"message": "Weight transfer initialized"}

        @app.post("/start_weight_update")
        async def start_update() -> dict[str, Any]:
            self._updating = True
            return {"message": "Weight update started"}

        @app.post("/update_weights")
        async def update_weights(body: dict[str, Any]) -> Any:
            info = body.get("update_info")
            if not isinstance(info, dict):
                return _error("Missing 'update_info' in request body")
            if not self._updating:
                return _error("update_weights before start_weight_update", status=409)
            if info.get("packed"):
                return _error("packed updates are not supported by the fake server")
            await host.receive_from_group(
                list(info["names"]), list(info["dtype_names"]), list(info["shapes"]), host.engine.version + 1
            )
            return {"message": "Weights updated"}

        @app.post("/finish_weight_update")
        async def finish_update(body: dict[str, Any] | None = None) -> dict[str, Any]:
            self._updating = False
            if body and body.get("weight_version") is not None:
                self.weight_version = str(body["weight_version"])
            return {"message": "Weight update finished"}

    async def stop(self) -> None:
        await super().stop()
        await self.host.close()

    async def __aenter__(self) -> FakeVLLMServer:
        await self.start()
        return self
