"""TorchEngine over a local Hugging Face model (GPT-2: absolute positions, so left padding must not leak)."""

import asyncio
from pathlib import Path

import pytest
import torch

from actors.engines import GenerationRequest, SamplingParams, TorchEngine
from actors.policy import Policy, write_tiny_hf_model


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory: pytest.TempPathFactory) -> Policy:
    directory: Path = write_tiny_hf_model(tmp_path_factory.mktemp("hf") / "gpt2", arch="gpt2", seed=1)
    return Policy.from_spec({"model": f"hf:{directory}"})


def test_hf_generation_batched_matches_single_and_fresh_forward(hf_policy: Policy) -> None:
    prompts = ["1+1=", "what is 12 times 3?", "abc"]
    tok = hf_policy.tokenizer
    sampled = SamplingParams(max_new_tokens=8, temperature=0.9, seed=7, ignore_eos=True)
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)

    async def scenario() -> None:
        engine = TorchEngine(hf_policy)
        reqs = [GenerationRequest(f"s{i}", tuple(tok.encode(p)), sampled) for i, p in enumerate(prompts)]
        out = await engine.generate(reqs)
        greedy_reqs = [GenerationRequest(f"g{i}", tuple(tok.encode(p)), greedy) for i, p in enumerate(prompts)]
        batched = await engine.generate(greedy_reqs)
        singles = [(await engine.generate([r]))[0] for r in greedy_reqs]
        await engine.close()
        assert [c.token_ids for c in batched] == [c.token_ids for c in singles]
        seqs = [c.prompt_ids + c.token_ids for c in out]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([[tok.pad_id] * (width - len(s)) + list(s) for s in seqs])
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
        with torch.no_grad():
            fresh = hf_policy.token_logprobs(ids, mask, temperature=0.9)
        for row, c in enumerate(out):
            assert len(c.token_ids) == 8
            assert c.logprobs == pytest.approx(fresh[row, width - 9 :].tolist(), abs=1e-4)

    asyncio.run(asyncio.wait_for(scenario(), timeout=60))
