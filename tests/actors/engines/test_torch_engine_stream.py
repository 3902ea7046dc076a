"""TorchEngine streaming: ``on_token`` deltas and ``generate_stream`` add up to exactly the final completion."""

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from actors.engines import Completion, GenerationRequest, SamplingParams, TorchEngine
from actors.engines._torch import TokenDelta
from actors.policy import GPTConfig, Policy

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=64))


def request(policy: Policy, rid: str, text: str, n: int, seed: int | None = 1) -> GenerationRequest:
    params = SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True, seed=seed)
    return GenerationRequest(rid, tuple(policy.tokenizer.encode(text)), params)


def test_on_token_deltas_concatenate_to_the_completion(policy: Policy) -> None:
    reqs = [request(policy, "a", "12+7=", 6), request(policy, "b", "hello there", 3)]
    deltas: list[TokenDelta] = []

    async def main() -> list[Completion]:
        engine = TorchEngine(policy, max_batch_size=1)  # b joins only after a finished
        try:
            return await engine.generate(reqs, on_token=deltas.append)
        finally:
            await engine.close()

    out = run(main())
    for index, completion in enumerate(out):
        mine = [d for d in deltas if d.request_id == completion.request_id]
        assert all(d.index == index and len(d.token_ids) == 1 for d in mine)  # one token per step
        assert tuple(t for d in mine for t in d.token_ids) == completion.token_ids
        assert tuple(lp for d in mine for lp in d.logprobs) == completion.logprobs
        assert tuple(v for d in mine for v in d.versions) == completion.versions


def test_streaming_does_not_change_what_is_sampled(policy: Policy) -> None:
    req = request(policy, "s", "abc", 8, seed=7)

    async def main() -> tuple[Completion, list[TokenDelta | Completion]]:
        engine = TorchEngine(policy)
        try:
            plain = (await engine.generate([req]))[0]
            items = [item async for item in engine.generate_stream(req)]
            return plain, items
        finally:
            await engine.close()

    plain, items = run(main())
    final = items[-1]
    assert isinstance(final, Completion) and final == plain
    assert all(isinstance(d, TokenDelta) for d in items[:-1]) and len(items) == 9


def test_leaving_a_stream_early_aborts_the_request(policy: Policy) -> None:
    req = request(policy, "long", "x", 60)

    async def main() -> dict[str, Any]:
        engine = TorchEngine(policy)
        try:
            stream = engine.generate_stream(req)
            async for item in stream:
                assert isinstance(item, TokenDelta)
                break
            await stream.aclose()  # type: ignore[attr-defined]
            for _ in range(50):  # the abort lands at the next step boundary
                if engine.stats()["running"] == 0:
                    break
                await asyncio.sleep(0.01)
            return engine.stats()
        finally:
            await engine.close()

    stats = run(main())
    assert stats["running"] == 0 and stats["tokens_generated"] < 60
