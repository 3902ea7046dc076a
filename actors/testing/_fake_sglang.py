"""FakeSGLangServer: SGLang's HTTP routes (those `SGLangEngine` drives), served by a real :class:`TorchEngine`.

Contract: it really generates (token ids, logprobs and the weight version from the engine), really loads
safetensors from disk and really joins a gloo (or NCCL) group and receives broadcast tensors; payloads are
validated in full before the engine changes, a bad one is answered ``400 {success: false, message}`` and
the old version keeps serving. ``/pause_generation`` modes abort / retract / in_place and
``/continue_generation`` behave as in SGLang (abort ends in-flight requests with finish_reason abort).
Routes: /generate, /health, /health_generate, /get_model_info, /get_weight_version, /flush_cache,
/pause_generation, /continue_generation, /update_weights_from_disk, /init_weights_update_group,
/update_weights_from_distributed, /destroy_weights_update_group. ``api_key``: as ``--api-key``, every route but
/health* and /metrics answers 401 without ``Authorization: Bearer <key>``.

Non-goals: text prompts are tokenized with the engine's tokenizer but nothing else of SGLang's frontend
(chat templates, streaming, top_logprobs, multimodal) is served; one engine, no TP/DP.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from actors.engines import Completion, GenerationRequest, SamplingParams, TorchEngine, WeightUpdateError
from actors.testing._host import EngineHost, served_name
from actors.testing._server import AppServer

__all__ = ["FakeSGLangServer"]


def _guarded(path: str) -> bool:
    return not path.startswith(("/health", "/metrics"))


def _fail(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"success": False, "message": message}, status_code=status)


def _params(raw: dict[str, Any]) -> SamplingParams:
    top_k = int(raw.get("top_k", -1))
    return SamplingParams(
        max_new_tokens=int(raw.get("max_new_tokens", 128)),
        temperature=float(raw.get("temperature", 1.0)),
        top_p=float(raw.get("top_p", 1.0)),
        top_k=0 if top_k < 0 else top_k,
        stop=tuple([raw["stop"]] if isinstance(raw.get("stop"), str) else raw.get("stop") or ()),
        stop_token_ids=tuple(int(t) for t in raw.get("stop_token_ids") or ()),
        ignore_eos=bool(raw.get("ignore_eos", False)),
        seed=None if raw.get("sampling_seed") is None else int(raw["sampling_seed"]),
    )


def _response(completion: Completion, host: EngineHost, return_logprob: bool) -> dict[str, Any]:
    reason: dict[str, Any] = {"type": completion.finish_reason}
    if completion.finish_reason == "length":
        reason["length"] = len(completion.token_ids)
    elif completion.finish_reason == "abort":
        reason["message"] = "aborted"
    # the version that made the last token; "default" (as SGLang says) until a version was loaded
    version = completion.versions[-1] if completion.versions and host.loaded else host.weight_version
    meta: dict[str, Any] = {
        "id": completion.request_id,
        "finish_reason": reason,
        "prompt_tokens": len(completion.prompt_ids),
        "completion_tokens": len(completion.token_ids),
        "weight_version": str(version),
    }
    if return_logprob:
        meta["output_token_logprobs"] = [
            [lp, t, None] for lp, t in zip(completion.logprobs, completion.token_ids, strict=True)
        ]
        meta["input_token_logprobs"] = []
    return {"text": completion.text, "output_ids": list(completion.token_ids), "meta_info": meta}


class FakeSGLangServer(AppServer):
    """``async with FakeSGLangServer(engine) as server: SGLangEngine(server.url)``."""

    def __init__(
        self,
        engine: TorchEngine,
        *,
        model_path: str | None = None,
        port: int | None = None,
        api_key: str | None = None,
    ) -> None:
        self.host = EngineHost(engine)
        self.model_path = model_path or served_name(engine)  # as `--model-path` / `vllm serve` name it
        # started with --api-key: every route but /health* and /metrics wants the Bearer key
        super().__init__(self._build(), port=port, api_key=api_key, guarded=_guarded)

    def _build(self) -> FastAPI:
        app = FastAPI(title="fake sglang")
        host = self.host

        @app.exception_handler(WeightUpdateError)
        async def _rejected(_: Request, exc: WeightUpdateError) -> JSONResponse:
            return _fail(str(exc))

        @app.exception_handler(ValueError)
        async def _bad_request(_: Request, exc: ValueError) -> JSONResponse:
            return JSONResponse(
                {"error": {"message": str(exc)}, "success": False, "message": str(exc)}, status_code=400
            )

        @app.post("/generate")
        async def generate(body: dict[str, Any]) -> Any:
            ids = body.get("input_ids")
            if ids is None and body.get("text") is not None:
                texts = body["text"]
                ids = (
                    [host.engine.tokenizer.encode(t) for t in texts]
                    if isinstance(texts, list)
                    else host.engine.tokenizer.encode(texts)
                )
            if not ids:
                raise ValueError("input_ids (or text) is required")
            batch = isinstance(ids[0], list)
            prompts: list[list[int]] = ids if batch else [ids]
            raw_params = body.get("sampling_params") or {}
            params = (
                [_params(p) for p in raw_params]
                if isinstance(raw_params, list)
                else [_params(raw_params)] * len(prompts)
            )
            rids = body.get("rid") or [uuid.uuid4().hex for _ in prompts]
            rids = rids if isinstance(rids, list) else [rids]
            if not len(params) == len(rids) == len(prompts):
                raise ValueError("input_ids, sampling_params and rid must have the same batch size")
            requests = [
                GenerationRequest(str(rid), tuple(int(t) for t in prompt), param)
                for prompt, param, rid in zip(prompts, params, rids, strict=True)
            ]
            results = await asyncio.gather(*(host.generate(r) for r in requests))
            out = [_response(c, host, bool(body.get("return_logprob"))) for c in results]
            return out if batch else out[0]

        @app.get("/health")
        async def health() -> dict[str, Any]:
            return {}

        @app.get("/health_generate")
        async def health_generate() -> dict[str, Any]:
            if not host.paused:
                await host.generate(
                    GenerationRequest(f"health-{uuid.uuid4().hex}", (0,), SamplingParams(max_new_tokens=1))
                )
            return {}

        @app.get("/get_model_info")
        async def model_info() -> dict[str, Any]:
            return {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "weight_version": host.weight_version,
                "server": "flywheel fake sglang",
            }

        @app.get("/get_weight_version")
        async def weight_version() -> dict[str, Any]:
            return {"weight_version": host.weight_version}

        @app.post("/flush_cache")
        async def flush_cache() -> Any:
            if host.in_flight:
                return _fail(f"cannot flush the cache: {host.in_flight} requests are running")
            return {"success": True, "message": "cache flushed"}

        @app.post("/pause_generation")
        async def pause(request: Request) -> dict[str, Any]:
            body = await request.json() if await request.body() else {}
            await host.pause(str(body.get("mode", "abort")))
            return {"status": "ok"}

        @app.post("/continue_generation")
        async def resume() -> dict[str, Any]:
            await host.resume()
            return {"status": "ok"}

        @app.post("/update_weights_from_disk")
        async def from_disk(body: dict[str, Any]) -> Any:
            path = body.get("model_path")
            if not isinstance(path, str) or not await asyncio.to_thread(Path(path).exists):
                return _fail(f"model_path {path!r} does not exist")
            if body.get("load_format") not in (None, "auto", "safetensors"):
                return _fail(f"unsupported load_format {body.get('load_format')!r} (the fake reads safetensors)")
            if body.get("abort_all_requests"):
                host.abort_all()
            version = host.next_version(body.get("weight_version"))
            await host.load_from_disk(path, version)
            return {
                "success": True,
                "message": f"loaded {path} as version {version}",
                "num_paused_requests": 0,
            }

        @app.post("/init_weights_update_group")
        async def init_group(body: dict[str, Any]) -> Any:
            try:
                await host.join_group(
                    str(body["master_address"]),
                    int(body["master_port"]),
                    int(body["world_size"]),
                    int(body.get("rank_offset", 1)),
                    str(body.get("backend", "nccl")),
                    str(body.get("group_name", "weight_update_group")),
                )
            except (KeyError, RuntimeError) as exc:
                return _fail(f"cannot join the weight update group: {exc}")
            return {"success": True, "message": "joined the weight update group"}

        @app.post("/update_weights_from_distributed")
        async def from_group(body: dict[str, Any]) -> Any:
            version = host.next_version(body.get("weight_version"))
            await host.receive_from_group(list(body["names"]), list(body["dtypes"]), list(body["shapes"]), version)
            return {"success": True, "message": f"received {len(body['names'])} tensors as version {version}"}

        @app.post("/destroy_weights_update_group")
        async def destroy_group() -> dict[str, Any]:
            host.leave_group()
            return {"success": True, "message": "left the weight update group"}

        return app

    async def stop(self) -> None:
        await super().stop()
        await self.host.close()

    async def __aenter__(self) -> FakeSGLangServer:
        await self.start()
        return self
