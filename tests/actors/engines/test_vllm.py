"""VLLMEngine against FakeVLLMServer (a real TorchEngine behind vLLM's HTTP shapes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save_file

from actors.engines import (
    DistributedWeights,
    EngineHTTPError,
    TorchEngine,
    UnsupportedServerError,
    VLLMEngine,
    WeightBroadcaster,
)
from actors.testing import FakeVLLMServer, free_port
from tests.actors.engines._rig import make_engine, perturbed, request, run_against


def run(scenario: Callable[[TorchEngine, FakeVLLMServer, VLLMEngine], Awaitable[None]]) -> None:
    run_against(FakeVLLMServer, VLLMEngine, scenario)


def test_generate_matches_the_engine_token_for_token() -> None:
    async def scenario(engine: TorchEngine, server: FakeVLLMServer, client: VLLMEngine) -> None:
        assert client.model == server.model
        [remote] = await client.generate([request()])
        [local] = await engine.generate([request("local")])
        assert remote.token_ids == local.token_ids and len(remote.token_ids) == 12
        assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-6)
        assert remote.versions == (0,) * 12 and remote.finish_reason == "length"

    run(scenario)


def test_update_from_disk_via_collective_rpc(tmp_path: Path) -> None:
    async def scenario(engine: TorchEngine, server: FakeVLLMServer, client: VLLMEngine) -> None:
        [before] = await client.generate([request()])
        save_file(perturbed(engine), str(tmp_path / "model.safetensors"))
        await client.update_weights(2, str(tmp_path))
        assert client.version == 2 and await client.refresh_version() == 2
        [after] = await client.generate([request()])
        assert after.versions == (2,) * 12 and after.logprobs != before.logprobs
        assert not server.host.paused

    run(scenario)


def test_bad_disk_payload_is_rejected_and_old_version_keeps_serving(tmp_path: Path) -> None:
    async def scenario(engine: TorchEngine, server: FakeVLLMServer, client: VLLMEngine) -> None:
        [before] = await client.generate([request()])
        bad = perturbed(engine)
        bad["not.a.parameter"] = torch.zeros(2)
        save_file(bad, str(tmp_path / "model.safetensors"))
        with pytest.raises(EngineHTTPError) as info:
            await client.update_weights(1, str(tmp_path))
        assert info.value.status == 400 and info.value.path == "/collective_rpc" and server.url in str(info.value)
        assert "not.a.parameter" in str(info.value)
        assert client.version == 0 and engine.version == 0 and not server.host.paused
        [after] = await client.generate([request()])
        assert after.token_ids == before.token_ids

    run(scenario)


def test_update_through_a_gloo_group() -> None:
    async def scenario(engine: TorchEngine, server: FakeVLLMServer, client: VLLMEngine) -> None:
        [before] = await client.generate([request()])
        broadcaster = WeightBroadcaster("127.0.0.1", free_port(), world_size=2, timeout_s=30)
        try:
            for version, seed in ((1, 1), (2, 2)):  # the second update reuses the group
                new = perturbed(engine, seed=seed)
                await client.update_weights(version, DistributedWeights(broadcaster, new))
                assert client.version == version and server.weight_version == str(version)
                for name, tensor in engine.policy.state_dict().items():
                    assert torch.equal(tensor, new[name])
            [after] = await client.generate([request()])
            assert after.versions == (2,) * 12 and after.logprobs != before.logprobs
        finally:
            broadcaster.close()

    run(scenario)


def test_pause_keep_freezes_until_resume() -> None:
    async def scenario(engine: TorchEngine, server: FakeVLLMServer, client: VLLMEngine) -> None:
        await client.pause()
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as raw:
            assert (await raw.get("/is_paused")).json() == {"is_paused": True}
        pending = asyncio.ensure_future(client.generate([request(tokens=4)]))
        await asyncio.sleep(0.3)
        assert not pending.done()
        await client.resume()
        [done] = await asyncio.wait_for(pending, 10)
        assert done.finish_reason == "length" and len(done.token_ids) == 4

    run(scenario)


def test_server_down_fails_fast_naming_url_and_call() -> None:
    async def main() -> None:
        url = f"http://127.0.0.1:{free_port()}"
        client = VLLMEngine(url, model="m", retries=1, backoff_s=0.05, connect_timeout_s=1)
        started = time.monotonic()
        with pytest.raises(EngineHTTPError) as info:
            await client.generate([request()])
        assert time.monotonic() - started < 10
        assert url in str(info.value) and "POST /v1/completions" in str(info.value)
        with pytest.raises(EngineHTTPError, match="POST /pause"):
            await client.pause()
        await client.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("server_kwargs", "status", "says"),
    [
        ({"dev_mode": False}, 404, "POST /pause failed (HTTP 404)"),
        ({"release": "0.11.0"}, 500, "this one runs vLLM 0.11.0"),
    ],
    ids=["no-dev-mode", "older-release"],
)
def test_a_server_that_cannot_load_weights_says_what_to_run(
    tmp_path: Path, server_kwargs: dict[str, Any], status: int, says: str
) -> None:
    """A vLLM server started without VLLM_SERVER_DEV_MODE=1, or of a release whose reload takes no weights_path,
    failed each update with a bare "HTTP 404: Not Found" (or the worker's TypeError), and the generator tried again
    and again. The update now fails with an UnsupportedServerError whose one line names the release and the mode
    needed; the server keeps serving what it had."""

    async def main() -> None:
        engine = make_engine()
        try:
            async with FakeVLLMServer(engine, **server_kwargs) as server:
                client = VLLMEngine(server.url, timeout_s=30)
                await client.start(health_timeout_s=10)
                [before] = await client.generate([request()])
                save_file(perturbed(engine), str(tmp_path / "model.safetensors"))
                with pytest.raises(UnsupportedServerError) as info:
                    await client.update_weights(1, str(tmp_path))
                error = info.value
                assert isinstance(error, EngineHTTPError) and error.status == status and server.url in str(error)
                assert says in str(error) and "\n" not in str(error)
                assert f"vLLM {VLLMEngine.min_release} or newer" in str(error)
                assert "VLLM_SERVER_DEV_MODE=1" in str(error) and "weights_path" in str(error)
                assert client.version == 0 and engine.version == 0 and not server.host.paused
                [after] = await client.generate([request()])
                assert after.token_ids == before.token_ids
                await client.close()
        finally:
            await engine.close()

    asyncio.run(main())
