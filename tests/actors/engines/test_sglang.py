"""SGLangEngine against FakeSGLangServer (a real TorchEngine behind SGLang's HTTP shapes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import torch

from actors.engines import EngineHTTPError, SGLangEngine, TorchEngine
from actors.testing import FakeSGLangServer, free_port
from tests.actors.engines._rig import PROMPT, perturbed, request, run_against, write_dir


def run(
    scenario: Callable[[TorchEngine, FakeSGLangServer, SGLangEngine], Awaitable[None]], **engine_kwargs: object
) -> None:
    run_against(FakeSGLangServer, SGLangEngine, scenario, **engine_kwargs)


def test_generate_matches_the_engine_token_for_token() -> None:
    async def scenario(engine: TorchEngine, server: FakeSGLangServer, client: SGLangEngine) -> None:
        [remote] = await client.generate([request()])
        [local] = await engine.generate([request("local")])
        assert remote.token_ids == local.token_ids and len(remote.token_ids) == 12
        assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-6)
        assert remote.versions == (0,) * 12
        assert remote.finish_reason == "length" and remote.text == local.text

    run(scenario)


def test_update_from_disk_changes_version_and_outputs(tmp_path: Path) -> None:
    async def scenario(engine: TorchEngine, server: FakeSGLangServer, client: SGLangEngine) -> None:
        [before] = await client.generate([request()])
        await client.update_weights(3, write_dir(tmp_path / "v3", perturbed(engine)))
        assert client.version == 3 and engine.version == 3
        assert await client.refresh_version() == 3
        [after] = await client.generate([request()])
        assert after.versions == (3,) * len(after.token_ids)
        assert after.logprobs != before.logprobs
        assert not server.host.paused  # the update's pause was undone

    run(scenario)


def test_bad_disk_payload_is_rejected_and_old_version_keeps_serving(tmp_path: Path) -> None:
    async def scenario(engine: TorchEngine, server: FakeSGLangServer, client: SGLangEngine) -> None:
        [before] = await client.generate([request()])
        bad = perturbed(engine)
        name = next(iter(bad))
        bad[name] = torch.zeros(3, 3)
        with pytest.raises(EngineHTTPError) as info:
            await client.update_weights(1, write_dir(tmp_path / "bad", bad))
        assert info.value.status == 400 and info.value.path == "/update_weights_from_disk"
        assert server.url in str(info.value) and name in str(info.value)
        assert client.version == 0 and engine.version == 0
        [after] = await client.generate([request()])
        assert after.token_ids == before.token_ids and after.versions == before.versions

    run(scenario)


def test_missing_dir_is_a_clear_error(tmp_path: Path) -> None:
    async def scenario(engine: TorchEngine, server: FakeSGLangServer, client: SGLangEngine) -> None:
        with pytest.raises(EngineHTTPError, match="does not exist"):
            await client.update_weights(1, str(tmp_path / "nowhere"))
        assert client.version == 0

    run(scenario)


def test_pause_holds_new_requests_until_continue() -> None:
    async def scenario(engine: TorchEngine, server: FakeSGLangServer, client: SGLangEngine) -> None:
        await client.pause()
        pending = asyncio.ensure_future(client.generate([request(tokens=4)]))
        await asyncio.sleep(0.3)
        assert not pending.done()
        await client.resume()
        [done] = await asyncio.wait_for(pending, 10)
        assert done.finish_reason == "length" and len(done.token_ids) == 4

    run(scenario)


def test_aborted_request_is_resubmitted_and_versions_split_exactly(tmp_path: Path) -> None:
    reached = asyncio.Event()

    async def hook(steps: int) -> None:
        if steps >= 6:
            reached.set()
        await asyncio.sleep(0.01)  # keep the request in flight long enough to be aborted

    async def scenario(engine: TorchEngine, server: FakeSGLangServer, client: SGLangEngine) -> None:
        weights = write_dir(tmp_path / "v1", perturbed(engine))
        pending = asyncio.ensure_future(client.generate([request(tokens=40)]))
        await asyncio.wait_for(reached.wait(), 10)
        await client.update_weights(1, weights)  # pause(abort) → update → continue
        [done] = await asyncio.wait_for(pending, 20)
        assert client.resubmitted >= 1 and server.host.counts["aborted"] >= 1
        assert done.finish_reason == "length" and len(done.token_ids) == 40
        assert len(done.logprobs) == len(done.versions) == 40
        first_new = done.versions.index(1)
        assert 0 < first_new < 40
        assert set(done.versions[:first_new]) == {0} and set(done.versions[first_new:]) == {1}

    run(scenario, step_hook=hook)


def test_raw_abort_pause_ends_in_flight_requests_with_abort() -> None:
    reached = asyncio.Event()

    async def hook(steps: int) -> None:
        if steps >= 3:
            reached.set()
        await asyncio.sleep(0.01)

    async def scenario(engine: TorchEngine, server: FakeSGLangServer, client: SGLangEngine) -> None:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as raw:
            body = {
                "input_ids": list(PROMPT),
                "sampling_params": {"max_new_tokens": 100, "ignore_eos": True},
                "return_logprob": True,
            }
            pending = asyncio.ensure_future(raw.post("/generate", json=body, timeout=20))
            await asyncio.wait_for(reached.wait(), 10)
            assert (await raw.post("/pause_generation", json={"mode": "abort"})).status_code == 200
            response = await asyncio.wait_for(pending, 10)
            meta = response.json()["meta_info"]
            assert meta["finish_reason"]["type"] == "abort"
            assert 0 < len(meta["output_token_logprobs"]) < 100
            await raw.post("/continue_generation", json={})

    run(scenario, step_hook=hook)


def test_server_down_fails_fast_naming_url_and_call() -> None:
    async def main() -> None:
        url = f"http://127.0.0.1:{free_port()}"
        client = SGLangEngine(url, retries=2, backoff_s=0.05, connect_timeout_s=1)
        started = time.monotonic()
        with pytest.raises(EngineHTTPError) as info:
            await client.generate([request()])
        assert time.monotonic() - started < 10
        assert url in str(info.value) and "POST /generate" in str(info.value) and "3 attempt" in str(info.value)
        with pytest.raises(EngineHTTPError, match="not healthy within"):
            await client.wait_healthy(timeout_s=0.5)
        await client.close()

    asyncio.run(main())


def test_in_memory_tensors_are_refused_with_a_clear_error() -> None:
    async def scenario(engine: TorchEngine, server: FakeSGLangServer, client: SGLangEngine) -> None:
        with pytest.raises(TypeError, match="safetensors directory"):
            await client.update_weights(1, perturbed(engine))
        assert not server.host.paused

    run(scenario)
