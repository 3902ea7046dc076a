"""A generator with an SGLang/vLLM engine at start: it waits for a server that is not up yet and says so in its log,
fails naming the url when none comes, and warns when the server serves another model than the spec's policy; a server
that goes down later is waited out, its prompts kept alive (not dead-lettered), and said once per outage."""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio
import pytest
import structlog

from actors.engines import TorchEngine
from actors.generator import _actor
from actors.generator._actor import GeneratorActor
from actors.generator._config import GeneratorConfig
from actors.policy import Policy, write_tiny_hf_model
from actors.protocol import PromptMsg
from actors.testing import FakeSGLangServer, FakeVLLMServer, actor_context, free_port
from tests.actors.engines._rig import request
from topology import Spec, load_spec
from topology.bus import DEADLETTER, Bus

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_hf_model(tmp_path_factory.mktemp("hf") / "tiny-gpt2", arch="gpt2", seed=1)


def _spec(tmp_path: Path, model_dir: Path, engine: str, port: int, extra: str = "") -> Spec:
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"name: g-{uuid.uuid4().hex[:8]}\nbus: {{embedded: true}}\nruntime: local\n"
        f"policy: {{model: 'hf:{model_dir}', warm_start: {{steps: 0}}}}\n"
        "domains:\n  arithmetic: {source: builtin:arithmetic, verifier: math, max_new_tokens: 4}\n"
        f"actors:\n  generator: {{engine: {engine}, url: 'http://127.0.0.1:{port}'{extra}}}\n"
        "channels:\n  prompts: {external: true}\n  rollouts: {external: true}\n"
    )
    return load_spec(path)


def _generator(spec: Spec, bus: Bus, run_dir: Path) -> GeneratorActor:
    config = spec.actors["generator"].config
    assert isinstance(config, GeneratorConfig)
    return GeneratorActor(actor_context(spec, "generator", bus, run_dir), config)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
async def test_a_server_not_up_yet_is_waited_for_and_the_log_says_which_and_why(
    bus: Bus, tmp_path: Path, model_dir: Path, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generator sat at `starting` with nothing in its log until a fixed 60 s ran out, then crashed — a real
    server still loading its model looked like a hung generator, then like a crash loop."""
    monkeypatch.setattr(_actor, "_SERVER_WAIT_LOG_S", 0.3)
    port = free_port()
    spec = _spec(tmp_path, model_dir, engine, port, ", server_start_timeout_s: 60")
    served = TorchEngine(Policy.from_spec({"model": f"hf:{model_dir}"}))
    fake = (FakeSGLangServer if engine == "sglang" else FakeVLLMServer)(served, port=port)
    actor = _generator(spec, bus, tmp_path)
    try:
        with structlog.testing.capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(actor.start)
                await anyio.sleep(1.5)  # down for a while: the log says so
                await fake.start()
        waits = [entry for entry in logs if entry["event"] == "generator.waiting_for_server"]
        assert waits and waits[0]["url"] == f"http://127.0.0.1:{port}", logs
        assert "ConnectError" in waits[0]["last"] or "connect" in waits[0]["last"].lower(), waits[0]
        assert actor.engine is not None and actor.engine.name == engine
    finally:
        await actor.stop()
        await fake.stop()
        await served.close()


async def test_a_server_that_never_answers_fails_the_start_naming_the_url_and_the_setting(
    bus: Bus, tmp_path: Path, model_dir: Path
) -> None:
    port = free_port()
    spec = _spec(tmp_path, model_dir, "sglang", port, ", server_start_timeout_s: 1")
    actor = _generator(spec, bus, tmp_path)
    with anyio.fail_after(30), pytest.raises(RuntimeError) as raised:
        await actor.start()
    await actor.stop()
    message = str(raised.value)
    assert f"http://127.0.0.1:{port}" in message and "actors.generator.server_start_timeout_s" in message, message


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
async def test_a_server_serving_another_model_is_named_in_a_warning(
    bus: Bus, tmp_path: Path, model_dir: Path, engine: str
) -> None:
    """Its versions would all be refused: the start says at once which model the server serves and which it must."""
    port = free_port()
    spec = _spec(tmp_path, model_dir, engine, port)
    served = TorchEngine(Policy.from_spec({"model": f"hf:{model_dir}"}))
    named = {"model_path" if engine == "sglang" else "model": "Org/another-model"}
    fake = (FakeSGLangServer if engine == "sglang" else FakeVLLMServer)(served, port=port, **named)  # type: ignore[arg-type]
    actor = _generator(spec, bus, tmp_path)
    try:
        await fake.start()
        with structlog.testing.capture_logs() as logs:
            await actor.start()
        [warning] = [entry for entry in logs if entry["event"] == "generator.model_mismatch"]
        assert warning["server_model"] == "Org/another-model" and warning["policy_model"] == str(model_dir)
    finally:
        await actor.stop()
        await fake.stop()
        await served.close()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
async def test_a_fake_serving_the_policys_model_names_it_as_the_real_server_would(
    bus: Bus, tmp_path: Path, model_dir: Path, engine: str
) -> None:
    """The fakes named every model `fake/tiny-gpt`: a user's integration test against one drew a model-mismatch
    warning although it served the spec's very model."""
    port = free_port()
    spec = _spec(tmp_path, model_dir, engine, port)
    served = TorchEngine(Policy.from_spec({"model": f"hf:{model_dir}"}))
    fake = (FakeSGLangServer if engine == "sglang" else FakeVLLMServer)(served, port=port)
    actor = _generator(spec, bus, tmp_path)
    try:
        await fake.start()
        with structlog.testing.capture_logs() as logs:
            await actor.start()
        assert [entry["event"] for entry in logs if entry["event"] == "generator.model_mismatch"] == []
        assert any(entry["event"] == "generator.ready" for entry in logs)
    finally:
        await actor.stop()
        await fake.stop()
        await served.close()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
async def test_a_server_down_mid_run_is_waited_out_and_its_prompts_are_not_dead_lettered(
    bus: Bus, tmp_path: Path, model_dir: Path, engine: str
) -> None:
    """Every prompt in flight failed while the server was down and went back to the bus, once a second: at the fifth
    delivery, about 12 s into the outage, each healthy prompt was dead-lettered as poison — an SGLang or vLLM server
    loading a model takes minutes. Prompts in flight now wait for the server (one warning per outage, each wait
    counted) and are served once it is back; nothing is dead-lettered."""
    port = free_port()
    spec = _spec(tmp_path, model_dir, engine, port)
    served = TorchEngine(Policy.from_spec({"model": f"hf:{model_dir}"}))
    fake_type = FakeSGLangServer if engine == "sglang" else FakeVLLMServer
    fake = fake_type(served, port=port)
    for channel in ("prompts", "rollouts", DEADLETTER):
        await bus.ensure_channel(channel)
    actor = _generator(spec, bus, tmp_path)
    try:
        await fake.start()
        await actor.start()
        await fake.stop()  # down from here on
        for i in range(4):
            msg = PromptMsg(task_id=f"t{i}", domain="arithmetic", prompt="1+1=", group_size=2)
            await bus.publish("prompts", "prompt", msg.model_dump(mode="json"))
        js = bus.nc.jetstream()
        with structlog.testing.capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(actor.run)
                with anyio.fail_after(60):
                    for _ in iter(int, 1):  # until every prompt was asked about 8 times (8 s)
                        if actor.ctx.counters.get("server_waits") >= 4 * 8:
                            break
                        await anyio.sleep(0.05)
                    fake = fake_type(served, port=port)
                    await fake.start()  # back
                    for _ in iter(int, 1):
                        if int((await js.stream_info(bus.stream("rollouts"))).state.messages) >= 4:
                            break
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
        assert int((await js.stream_info(bus.stream(DEADLETTER))).state.messages) == 0
        assert not actor.ctx.counters.get("errors")
        waiting = [entry for entry in logs if entry["event"] == "generator.server_unavailable"]
        assert len(waiting) == 1 and f"127.0.0.1:{port}" in waiting[0]["error"], waiting
        assert any(entry["event"] == "generator.server_back" for entry in logs)
    finally:
        await actor.stop()
        await fake.stop()
        await served.close()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
async def test_a_server_started_with_an_api_key_takes_the_key_the_spec_names_and_a_refusal_names_the_setting(
    bus: Bus, tmp_path: Path, model_dir: Path, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server started with --api-key refused every call of a generator that had no way to send a key: it waited out
    `server_start_timeout_s` (600 s by default) as for a server still loading, then said that no server answered."""
    port = free_port()
    served = TorchEngine(Policy.from_spec({"model": f"hf:{model_dir}"}))
    fake = (FakeSGLangServer if engine == "sglang" else FakeVLLMServer)(served, port=port, api_key="s3cret")
    actors: list[GeneratorActor] = []

    async def start(extra: str) -> GeneratorActor:
        actors.append(_generator(_spec(tmp_path, model_dir, engine, port, extra), bus, tmp_path))
        with anyio.fail_after(30):
            await actors[-1].start()
        return actors[-1]

    try:
        await fake.start()
        with pytest.raises(RuntimeError) as no_key:  # at once, not after the start timeout
            await start(", server_start_timeout_s: 60")
        assert f"server at http://127.0.0.1:{port} refuses this generator (HTTP 401)" in str(no_key.value)
        assert "set actors.generator.api_key_env" in str(no_key.value), no_key.value
        named = ", api_key_env: FW_TEST_SERVER_KEY, server_start_timeout_s: 60, weight_update_timeout_s: 42"
        with pytest.raises(RuntimeError) as unset:
            await start(named)
        assert "FW_TEST_SERVER_KEY, which is not set" in str(unset.value), unset.value
        monkeypatch.setenv("FW_TEST_SERVER_KEY", "not-the-key")
        with pytest.raises(RuntimeError) as wrong:
            await start(named)
        assert "the key in FW_TEST_SERVER_KEY (actors.generator.api_key_env) is not one it takes" in str(wrong.value)
        monkeypatch.setenv("FW_TEST_SERVER_KEY", "s3cret")
        actor = await start(named)
        assert actor.engine is not None and actor.engine.update_timeout_s == 42  # type: ignore[attr-defined]
        [completion] = await actor.engine.generate([request()])
        assert completion.token_ids and completion.finish_reason == "length"
    finally:
        for actor in actors:
            await actor.stop()
        await fake.stop()
        await served.close()


async def test_a_key_refused_mid_run_is_waited_out_naming_the_setting(
    bus: Bus, tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server restarted with another key under a running generator: its prompts are waited out as in an outage
    (not failed five times and dead-lettered as poison), the log naming the setting to change."""
    port = free_port()
    served = TorchEngine(Policy.from_spec({"model": f"hf:{model_dir}"}))
    fake = FakeSGLangServer(served, port=port, api_key="s3cret")
    monkeypatch.setenv("FW_TEST_SERVER_KEY", "s3cret")
    actor = _generator(_spec(tmp_path, model_dir, "sglang", port, ", api_key_env: FW_TEST_SERVER_KEY"), bus, tmp_path)
    try:
        await fake.start()
        await actor.start()
        await fake.stop()
        fake = FakeSGLangServer(served, port=port, api_key="rotated")
        await fake.start()
        msg = PromptMsg(task_id="t1", domain="arithmetic", prompt="1+1=", group_size=1)
        with structlog.testing.capture_logs() as logs:
            async with anyio.create_task_group() as tg:
                tg.start_soon(actor._generate, msg, actor._requests("m1", msg))
                with anyio.fail_after(20):
                    for _ in iter(int, 1):  # until it has waited once
                        if actor.ctx.counters.get("server_waits"):
                            break
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
        [said] = [entry for entry in logs if entry["event"] == "generator.server_unavailable"]
        assert "refuses this generator (HTTP 401)" in said["error"] and "FW_TEST_SERVER_KEY" in said["error"], said
    finally:
        await actor.stop()
        await fake.stop()
        await served.close()


def test_a_key_variable_unset_where_the_spec_is_validated_is_a_warning(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unset here, the generator stops at every start; the spec may be meant for another machine, so not an error."""
    monkeypatch.delenv("FW_TEST_SERVER_KEY", raising=False)
    spec = _spec(tmp_path, model_dir, "vllm", 8000, ", api_key_env: FW_TEST_SERVER_KEY")
    [warning] = [w for w in spec.warnings if w.path == "actors.generator.api_key_env"]
    assert warning.severity == "warning" and "FW_TEST_SERVER_KEY is not set here" in warning.message
    monkeypatch.setenv("FW_TEST_SERVER_KEY", "s3cret")
    spec = _spec(tmp_path, model_dir, "vllm", 8000, ", api_key_env: FW_TEST_SERVER_KEY")
    assert not [w for w in spec.warnings if w.path == "actors.generator.api_key_env"]
