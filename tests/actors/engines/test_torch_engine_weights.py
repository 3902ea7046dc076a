"""TorchEngine weight updates: in-flight swap at a step boundary, validation, monotonic versions."""

import asyncio
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from actors.engines import GenerationRequest, SamplingParams, TorchEngine, WeightUpdateError
from actors.policy import Policy
from tests.actors.engines._rig import scrambled_policy

PARAMS = SamplingParams(max_new_tokens=10, temperature=0.0, ignore_eos=True)


def request(policy: Policy, text: str = "12+7=") -> GenerationRequest:
    return GenerationRequest("r", tuple(policy.tokenizer.encode(text)), PARAMS)


def fresh_logprobs(policy: Policy, prompt: tuple[int, ...], tokens: tuple[int, ...]) -> list[float]:
    with torch.no_grad():
        scores = policy.token_logprobs(torch.tensor([prompt + tokens]))[0]
    return list(scores[len(prompt) - 1 :].tolist())


@pytest.mark.parametrize(("swap_after", "recompute"), [(1, True), (4, True), (4, False)])
def test_swap_mid_generation_changes_version_at_the_right_token(swap_after: int, recompute: bool) -> None:
    old, new = scrambled_policy(0), scrambled_policy(1)
    new_weights = {k: v.clone() for k, v in new.state_dict().items()}

    async def scenario() -> None:
        async def hook(step: int) -> None:
            if step == swap_after:
                await engine.update_weights(1, new_weights)

        engine = TorchEngine(scrambled_policy(0), step_hook=hook, recompute_cache_on_update=recompute)
        try:
            (completion,) = await engine.generate([request(old)])
        finally:
            await engine.close()
        assert completion.versions == (0,) * swap_after + (1,) * (10 - swap_after)
        assert engine.stats()["versions_served"] == {0: swap_after, 1: 10 - swap_after}
        assert engine.stats()["cache_rebuilds"] == int(recompute)
        # Tokens before the swap were scored by the old weights, tokens after by the new ones (when the
        # cache is rebuilt; otherwise the new weights attended to keys/values computed by the old ones).
        prompt, tokens = completion.prompt_ids, completion.token_ids
        before = fresh_logprobs(old, prompt, tokens)[:swap_after]
        assert completion.unfiltered_logprobs[:swap_after] == pytest.approx(before, abs=1e-4)
        if recompute:
            after = fresh_logprobs(new, prompt, tokens)[swap_after:]
            assert completion.unfiltered_logprobs[swap_after:] == pytest.approx(after, abs=1e-4)
        # And the continuation differs from what the old weights alone would have produced.
        engine_old = TorchEngine(old)
        (unswapped,) = await engine_old.generate([request(old)])
        await engine_old.close()
        assert unswapped.token_ids[:swap_after] == tokens[:swap_after]
        assert unswapped.token_ids != tokens

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))


def _bad(policy: Policy, case: str) -> dict[str, torch.Tensor]:
    payload = {k: v.clone() for k, v in policy.state_dict().items()}
    name = "blocks.0.attn.qkv.weight"
    if case == "missing":
        del payload[name]
    elif case == "unexpected":
        payload["blocks.7.attn.qkv.weight"] = payload[name]
    elif case == "shape":
        payload[name] = payload[name][:-1]
    elif case == "dtype":
        payload[name] = payload[name].half()
    elif case == "nan":
        payload[name][3, 3] = float("nan")
    elif case == "inf":
        payload[name][0, 0] = float("inf")
    return payload


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "1 missing \\(e.g. 'blocks.0.attn.qkv.weight'\\)"),
        ("unexpected", "unexpected \\(e.g. 'blocks.7.attn.qkv.weight'\\)"),
        ("shape", "shape \\(191, 64\\) does not match the model's \\(192, 64\\)"),
        ("dtype", "dtype torch.float16 does not match"),
        ("nan", "NaN or infinite"),
        ("inf", "NaN or infinite"),
    ],
)
def test_bad_payload_is_rejected_and_the_old_version_keeps_serving(case: str, message: str) -> None:
    policy = scrambled_policy(0)

    async def scenario() -> None:
        engine = TorchEngine(policy)
        (before,) = await engine.generate([request(policy)])
        with pytest.raises(WeightUpdateError, match=f"version 1 rejected, still serving 0: .*{message}"):
            await engine.update_weights(1, _bad(scrambled_policy(1), case))
        (after,) = await engine.generate([request(policy)])
        stats = engine.stats()
        await engine.close()
        assert engine.version == 0
        assert after.token_ids == before.token_ids and set(after.versions) == {0}
        assert stats["weight_updates_rejected"] == 1 and stats["weight_updates"] == 0

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))


def test_versions_must_increase_and_files_are_accepted(tmp_path: Path) -> None:
    policy = scrambled_policy(0)
    new = scrambled_policy(1)
    save_file({k: v.contiguous() for k, v in new.state_dict().items()}, str(tmp_path / "model.safetensors"))

    async def scenario() -> None:
        engine = TorchEngine(policy, version=3)
        with pytest.raises(WeightUpdateError, match="already serves version 3"):
            await engine.update_weights(3, new.state_dict())
        await engine.update_weights(5, str(tmp_path))
        (completion,) = await engine.generate([request(policy)])
        await engine.close()
        assert set(completion.versions) == {5}
        assert completion.unfiltered_logprobs == pytest.approx(
            fresh_logprobs(new, completion.prompt_ids, completion.token_ids), abs=1e-4
        )
        with pytest.raises(WeightUpdateError, match="no safetensors weights"):
            await TorchEngine(policy, version=5).update_weights(6, str(tmp_path / "missing"))

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))


def test_a_cpu_swap_exchanges_storage_and_a_fill_into_the_standby_copies_nothing() -> None:
    policy = scrambled_policy(0)
    new = [{k: v.clone() for k, v in scrambled_policy(seed).state_dict().items()} for seed in (1, 2, 3)]

    async def scenario() -> None:
        engine = TorchEngine(policy)
        filled: list[dict[str, int]] = []

        async def fill(standby: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
            assert standby is not None
            for name, tensor in standby.items():
                tensor.copy_(new[len(filled)][name])
            filled.append({name: t.data_ptr() for name, t in standby.items()})
            return standby

        for version in (1, 2, 3):
            await engine.update_weights_from(version, fill)
            live = policy.state_dict()
            # the very tensors the fill wrote are now live; the previous live ones became the next standby
            assert {name: t.data_ptr() for name, t in live.items()} == filled[-1]
            assert all(torch.equal(live[k], new[version - 1][k]) for k in live)
        assert filled[2] == filled[0] != filled[1]  # two sets, exchanged at every swap
        await engine.close()
        assert engine.version == 3

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))


def test_a_rejected_fill_leaves_the_live_weights_untouched() -> None:
    policy = scrambled_policy(0)
    before = {k: v.clone() for k, v in policy.state_dict().items()}

    async def scenario() -> None:
        engine = TorchEngine(policy)

        async def fill(standby: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
            assert standby is not None
            for tensor in standby.values():
                tensor.fill_(float("nan"))
            return standby

        with pytest.raises(WeightUpdateError, match="NaN or infinite"):
            await engine.update_weights_from(1, fill)
        await engine.close()
        assert engine.version == 0
        live = policy.state_dict()
        assert all(torch.equal(live[k], before[k]) for k in before)

    asyncio.run(asyncio.wait_for(scenario(), timeout=30))
