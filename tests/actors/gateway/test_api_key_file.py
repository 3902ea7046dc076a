"""With no key configured the gateway makes one, writes it to <run_dir>/<actor>/api_key (0600) and accepts it;
configured keys (env var, file) keep working and no file is written then."""

from __future__ import annotations

import concurrent.futures
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from actors.gateway import GatewayActor, generated_api_key
from tests.conftest import fresh_topology
from topology import load_spec
from topology.bus import Bus, EmbeddedNats
from topology.runtime import ActorContext

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SPEC = """
name: {name}
bus: {{embedded: true}}
policy: {{model: builtin:tiny-gpt}}
actors:
  gateway: {{port: 0, api_keys_env: {env}{extra}}}
"""
FEEDBACK = {"request_id": "fw-anything", "score": 1}


def test_a_generated_key_is_private_and_made_once(tmp_path: Path) -> None:
    path = tmp_path / "gateway" / "api_key"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        keys = set(pool.map(lambda _: generated_api_key(path), range(16)))
    assert len(keys) == 1 and len(keys.pop()) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["api_key"]  # no partial files left behind
    assert generated_api_key(path) == path.read_text().strip()  # a restart reads the same key


@asynccontextmanager
async def running_gateway(
    nats: EmbeddedNats, tmp_path: Path, *, env: str, extra: str = ""
) -> AsyncIterator[GatewayActor]:
    name = fresh_topology()
    (tmp_path / "spec.yaml").write_text(SPEC.format(name=name, env=env, extra=extra))
    spec = load_spec(tmp_path / "spec.yaml")
    async with await Bus.connect(nats.url, topology=name, name="key-test") as bus:
        ctx = ActorContext(
            topology=name, actor="gateway", replica=0, kind="gateway", spec=spec, bus=bus, run_dir=tmp_path / "run"
        )
        gateway = GatewayActor(ctx, spec.actors["gateway"].config)
        await gateway.start()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(gateway.run)
                yield gateway
                ctx.stopping.set()
        finally:
            await gateway.stop()


async def post_feedback(url: str, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(timeout=10) as client:
        return (await client.post(url + "/v1/feedback", json=FEEDBACK, headers=headers)).status_code


async def test_no_configured_key_generates_one_in_the_run_dir(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FW_TEST_NO_KEYS", raising=False)
    async with running_gateway(embedded_nats, tmp_path, env="FW_TEST_NO_KEYS") as gateway:
        path = tmp_path / "run" / "gateway" / "api_key"
        assert gateway.report()["api_key_file"] == str(path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert gateway.url is not None
        assert await post_feedback(gateway.url, path.read_text().strip()) == 200
        assert await post_feedback(gateway.url, None) == 401
        assert await post_feedback(gateway.url, "not-the-key") == 401


async def test_configured_keys_are_used_and_no_file_is_written(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FW_TEST_SOME_KEYS", "env-key-1,env-key-2")
    (tmp_path / "keys.txt").write_text("# ops\nfile-key\n")
    async with running_gateway(
        embedded_nats, tmp_path, env="FW_TEST_SOME_KEYS", extra=", api_keys_file: keys.txt"
    ) as gateway:
        assert gateway.url is not None and "api_key_file" not in gateway.report()
        for key in ("env-key-2", "file-key"):
            assert await post_feedback(gateway.url, key) == 200
        assert not (tmp_path / "run" / "gateway" / "api_key").exists()


async def test_generation_can_be_turned_off(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FW_TEST_NO_KEYS", raising=False)
    async with running_gateway(
        embedded_nats, tmp_path, env="FW_TEST_NO_KEYS", extra=", generate_api_key: false"
    ) as gateway:
        assert gateway.url is not None
        assert await post_feedback(gateway.url, "anything") == 401
        assert not (tmp_path / "run" / "gateway").exists()


@pytest.mark.parametrize("required", [False, True])
async def test_inference_and_metrics_ask_a_key_only_when_the_spec_says_so(
    embedded_nats: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, required: bool
) -> None:
    """``require_key_for_inference`` / ``require_key_for_metrics`` had no test: dropping either check passed."""
    monkeypatch.setenv("FW_TEST_SOME_KEYS", "the-key")
    extra = f", require_key_for_inference: {str(required).lower()}, require_key_for_metrics: {str(required).lower()}"
    async with running_gateway(embedded_nats, tmp_path, env="FW_TEST_SOME_KEYS", extra=extra) as gateway:
        assert gateway.url is not None
        async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
            body = {"model": "flywheel", "prompt": "1+1=", "max_tokens": 2}
            for key in (None, "the-key"):
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                completion = await client.post("/v1/completions", json=body, headers=headers)
                metrics = await client.get("/metrics", headers=headers)
                refused = required and key is None
                assert (completion.status_code == 401) == refused, completion.text  # (no generator: 503 otherwise)
                assert metrics.status_code == (401 if refused else 200), metrics.text
