"""TorchEngine: batching, caching, sampling, stopping, lifecycle. Weight updates are in test_torch_engine_weights."""

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import pytest
import torch

from actors.engines import Completion, EngineClosedError, GenerationRequest, SamplingParams, TorchEngine
from actors.policy import Policy
from tests.actors.engines._rig import scrambled_policy

T = TypeVar("T")
GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)
PROMPTS = ["12+7=", "the quick brown fox", "x", "def f(a, b):\n    return"]


def run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(asyncio.wait_for(make(), timeout=30))


@pytest.fixture(scope="module")
def policy() -> Policy:
    return scrambled_policy()


def requests(policy: Policy, prompts: Sequence[str], params: SamplingParams) -> list[GenerationRequest]:
    return [GenerationRequest(f"r{i}", tuple(policy.tokenizer.encode(p)), params) for i, p in enumerate(prompts)]


async def generate(policy: Policy, reqs: Sequence[GenerationRequest], **engine_kwargs: Any) -> list[Completion]:
    engine = TorchEngine(policy, **engine_kwargs)
    try:
        return await engine.generate(reqs)
    finally:
        await engine.close()


def naive_greedy(policy: Policy, prompt: Sequence[int], n: int) -> list[int]:
    """Full forward pass per token, no cache, no batching."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            logits, _ = policy.forward(torch.tensor([ids]))
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_greedy_with_cache_equals_decoding_without_cache(policy: Policy) -> None:
    reqs = requests(policy, PROMPTS, GREEDY)
    out = run(lambda: generate(policy, reqs))
    assert len({c.text for c in out}) == len(PROMPTS)  # the model really produces different continuations
    for req, completion in zip(reqs, out, strict=True):
        assert list(completion.token_ids) == naive_greedy(policy, req.prompt_ids, 10)
        assert completion.finish_reason == "length"
        assert completion.logprobs == (0.0,) * 10  # greedy samples from a point mass


def test_batched_equals_single_and_requests_join_mid_flight(policy: Policy) -> None:
    reqs = requests(policy, PROMPTS * 2, GREEDY)
    singles = [asyncio.run(generate(policy, [r]))[0] for r in reqs[: len(PROMPTS)]]
    # max_batch_size=3 with 8 requests: rows leave and new requests join at step boundaries.
    batched = run(lambda: generate(policy, reqs, max_batch_size=3))
    for i, completion in enumerate(batched):
        assert completion.token_ids == singles[i % len(PROMPTS)].token_ids
        assert completion.request_id == f"r{i}"


def test_logprobs_equal_a_fresh_forward_pass(policy: Policy) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=0.8, seed=3)
    out = run(lambda: generate(policy, requests(policy, PROMPTS, params)))
    # Score all completions in one left-padded batch, as the learner does.
    seqs = [c.prompt_ids + c.token_ids for c in out]
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[0] * (width - len(s)) + list(s) for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    with torch.no_grad():
        fresh = policy.token_logprobs(ids, mask, temperature=0.8)
    for row, completion in enumerate(out):
        n = len(completion.token_ids)
        expected = fresh[row, width - n - 1 :].tolist()
        assert completion.logprobs == pytest.approx(expected, abs=1e-4)
        assert completion.unfiltered_logprobs == pytest.approx(expected, abs=1e-4)


def test_top_k_and_top_p_report_the_filtered_distribution(policy: Policy) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_k=5, top_p=0.8, seed=1)
    out = run(lambda: generate(policy, requests(policy, PROMPTS, params)))
    for completion in out:
        for filtered, raw in zip(completion.logprobs, completion.unfiltered_logprobs, strict=True):
            assert filtered >= raw - 1e-6  # renormalising over fewer tokens can only raise the probability
        ids = torch.tensor([completion.prompt_ids + completion.token_ids])
        with torch.no_grad():
            logits, _ = policy.forward(ids)
        ranks = logits[0, len(completion.prompt_ids) - 1 : -1].argsort(dim=-1, descending=True)
        for t, token in enumerate(completion.token_ids):
            assert token in ranks[t, :5].tolist()


def test_top_k_one_equals_greedy(policy: Policy) -> None:
    greedy = run(lambda: generate(policy, requests(policy, PROMPTS, GREEDY)))
    top1 = SamplingParams(max_new_tokens=10, temperature=1.3, top_k=1, ignore_eos=True)
    sampled = run(lambda: generate(policy, requests(policy, PROMPTS, top1)))
    for a, b in zip(greedy, sampled, strict=True):
        assert a.token_ids == b.token_ids
        assert b.logprobs == (0.0,) * 10


def test_seeded_requests_do_not_depend_on_batch_mates(policy: Policy) -> None:
    params = SamplingParams(max_new_tokens=15, temperature=1.0, seed=42, ignore_eos=True)
    alone = run(lambda: generate(policy, requests(policy, PROMPTS[:1], params)))[0]
    others = SamplingParams(max_new_tokens=5, temperature=1.0, ignore_eos=True)
    mixed = run(
        lambda: generate(policy, [*requests(policy, PROMPTS[:1], params), *requests(policy, PROMPTS[1:], others)])
    )
    assert mixed[0].token_ids == alone.token_ids


def test_stop_strings_and_stop_tokens(policy: Policy) -> None:
    reference = run(lambda: generate(policy, requests(policy, PROMPTS[:1], GREEDY)))[0]
    stop_text = reference.text[3:5]
    first = reference.text.index(stop_text)
    by_string = SamplingParams(max_new_tokens=10, temperature=0.0, stop=(stop_text,))
    out = run(lambda: generate(policy, requests(policy, PROMPTS[:1], by_string)))[0]
    assert out.finish_reason == "stop"
    assert out.text == reference.text[: first + len(stop_text)]
    stop_token = reference.token_ids[2]
    by_token = SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(stop_token,))
    out = run(lambda: generate(policy, requests(policy, PROMPTS[:1], by_token)))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == reference.token_ids[: reference.token_ids.index(stop_token) + 1]


def test_eos_stops_unless_ignored() -> None:
    policy = scrambled_policy()
    reference = run(lambda: generate(policy, requests(policy, PROMPTS[:1], GREEDY)))[0]
    # Declare the third greedy token to be eos (a random model never picks the real eos on purpose).
    policy.tokenizer.eos_id = reference.token_ids[2]
    out = run(lambda: generate(policy, requests(policy, PROMPTS[:1], SamplingParams(temperature=0.0))))[0]
    assert (out.token_ids, out.finish_reason) == (reference.token_ids[:3], "stop")
    out = run(lambda: generate(policy, requests(policy, PROMPTS[:1], GREEDY)))[0]
    assert out.token_ids == reference.token_ids


def test_context_limit_ends_with_length(policy: Policy) -> None:
    prompt = "a" * 60  # block_size is 64
    out = run(lambda: generate(policy, requests(policy, [prompt], GREEDY)))[0]
    assert (len(out.token_ids), out.finish_reason) == (4, "length")


def test_invalid_requests_are_rejected_up_front(policy: Policy) -> None:
    async def attempt(prompt: tuple[int, ...]) -> None:
        await generate(policy, [GenerationRequest("bad", prompt, GREEDY)])

    with pytest.raises(ValueError, match="prompt_ids is empty"):
        run(lambda: attempt(()))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        run(lambda: attempt((5, 10_000)))
    with pytest.raises(ValueError, match="no room"):
        run(lambda: attempt((5,) * 64))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def test_pause_holds_steps_and_resume_continues(policy: Policy) -> None:
    async def scenario() -> None:
        engine = TorchEngine(policy)
        await engine.pause()
        task = asyncio.create_task(engine.generate(requests(policy, PROMPTS, GREEDY)))
        await asyncio.sleep(0.2)
        assert engine.stats()["steps"] == 0 and not task.done()
        assert engine.stats()["paused"]
        await engine.resume()
        out = await task
        assert all(len(c.token_ids) == 10 for c in out)
        await engine.close()

    run(scenario)


def test_abort_and_close_end_requests_with_abort(policy: Policy) -> None:
    async def scenario() -> None:
        steps = asyncio.Event()

        async def hook(step: int) -> None:
            if step == 3:
                steps.set()

        engine = TorchEngine(policy, step_hook=hook)
        long = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
        task = asyncio.create_task(engine.generate(requests(policy, PROMPTS[:2], long)))
        await steps.wait()
        assert engine.abort("r0") == 1
        await engine.pause()
        closing = asyncio.create_task(engine.close())
        out = await task
        await closing
        assert out[0].finish_reason == "abort" and 3 <= len(out[0].token_ids) < 40
        assert out[1].finish_reason == "abort" and len(out[1].token_ids) < 40
        with pytest.raises(EngineClosedError):
            await engine.generate(requests(policy, PROMPTS[:1], GREEDY))

    run(scenario)


def test_bounded_queue_and_counters(policy: Policy) -> None:
    async def scenario() -> None:
        engine = TorchEngine(policy, max_batch_size=2, max_queue=2)
        out = await engine.generate(requests(policy, PROMPTS * 3, GREEDY))
        stats = engine.stats()
        await engine.close()
        assert len(out) == 12
        assert stats["tokens_generated"] == 120
        assert stats["versions_served"] == {0: 120}
        assert stats["requests_finished"] == 12
        assert stats["queue_depth"] == 0 and stats["running"] == 0
        assert 0 < stats["mean_batch_occupancy"] <= 1

    run(scenario)


def test_from_config_uses_the_generator_config() -> None:
    from actors.generator._config import GeneratorConfig

    config = GeneratorConfig(max_batch_size=3, dtype="bfloat16", device="cpu")
    engine = TorchEngine.from_config({"model": "builtin:tiny-gpt", "config": {"n_layer": 1, "n_embd": 32}}, config)
    assert engine.max_batch_size == 3
    assert engine.policy.module.wte.weight.dtype == torch.bfloat16  # type: ignore[union-attr]
    params = SamplingParams(max_new_tokens=4, temperature=0.7)

    async def scenario() -> list[Completion]:
        try:
            return await engine.generate(requests(engine.policy, PROMPTS, params))
        finally:
            await engine.close()

    out = run(scenario)
    assert all(len(c.logprobs) == len(c.token_ids) > 0 for c in out)
    assert engine.recompute_cache_on_update  # the default: rebuild the running rows' cache after a swap


def test_a_failing_step_hook_fails_the_requests_instead_of_hanging(policy: Policy) -> None:
    async def hook(step: int) -> None:
        raise RuntimeError("hook broke")

    async def scenario() -> None:
        engine = TorchEngine(policy, step_hook=hook)
        with pytest.raises(RuntimeError, match="hook broke"):
            await engine.generate(requests(policy, PROMPTS, GREEDY))
        engine.step_hook = None
        out = await engine.generate(requests(policy, PROMPTS[:1], GREEDY))  # the loop restarts
        await engine.close()
        assert len(out[0].token_ids) == 10

    run(scenario)


def test_a_group_of_identical_prompts_is_prefilled_once_with_the_same_results(policy: Policy) -> None:
    prompt = tuple(policy.tokenizer.encode(PROMPTS[3]))
    group = [
        GenerationRequest(f"g{i}", prompt, SamplingParams(max_new_tokens=8, temperature=1.0, seed=i, ignore_eos=True))
        for i in range(6)
    ]
    engine = TorchEngine(policy)

    async def together() -> list[Completion]:
        try:
            return await engine.generate(group)
        finally:
            await engine.close()

    shared = run(together)
    assert engine.stats()["prefill_tokens"] == len(prompt)  # six rows, one prompt's worth of prefill
    assert engine.stats()["prefill_rows_shared"] == 5
    assert len({c.token_ids for c in shared}) > 1  # the rows still sample independently
    for request, completion in zip(group, shared, strict=True):  # each as if it had been alone
        alone = run(lambda r=request: generate(policy, [r]))[0]  # type: ignore[misc]
        assert completion.token_ids == alone.token_ids
        assert completion.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_several_steps_per_thread_hop_sample_what_one_step_per_hop_does(policy: Policy) -> None:
    params = [
        SamplingParams(max_new_tokens=n, temperature=1.0, seed=i, ignore_eos=True)
        for i, n in enumerate((3, 12, 7, 12, 5, 9))
    ]
    reqs = [GenerationRequest(f"m{i}", tuple(policy.tokenizer.encode(PROMPTS[i % 4])), p) for i, p in enumerate(params)]
    # max_batch_size 2: rows finish and joiners wait inside a multi-step hop, which must end so they get in
    engines = {n: TorchEngine(policy, max_batch_size=2, steps_per_call=n) for n in (1, 8)}

    async def both() -> dict[int, list[Completion]]:
        try:
            return {n: await engine.generate(reqs) for n, engine in engines.items()}
        finally:
            for engine in engines.values():
                await engine.close()

    out = run(both)
    for one, many in zip(out[1], out[8], strict=True):
        assert many.token_ids == one.token_ids and many.finish_reason == one.finish_reason == "length"
        assert many.logprobs == pytest.approx(one.logprobs, abs=1e-5)
    assert engines[1].stats()["steps_per_call"] == 1.0
    assert engines[8].stats()["steps_per_call"] > 1.5
    assert engines[8].stats()["steps"] == engines[1].stats()["steps"]  # the same steps, fewer hops
    with pytest.raises(ValueError, match="steps_per_call"):
        TorchEngine(policy, steps_per_call=0)
