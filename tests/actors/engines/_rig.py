"""The rig the engine tests share: tiny GPTs, a fake server with its client connected, weights to load."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import torch
from safetensors.torch import save_file

from actors.engines import GenerationRequest, SamplingParams, SGLangEngine, TorchEngine, VLLMEngine
from actors.policy import GPTConfig, Policy
from actors.testing import FakeSGLangServer, FakeVLLMServer

PROMPT = (23, 17, 23, 35)

Server = TypeVar("Server", FakeSGLangServer, FakeVLLMServer)
Client = TypeVar("Client", SGLangEngine, VLLMEngine)


def make_engine(**kwargs: object) -> TorchEngine:
    policy = Policy.tiny_gpt(GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=256), seed=0)
    return TorchEngine(policy, **kwargs)  # type: ignore[arg-type]


def scrambled_policy(seed: int = 0) -> Policy:
    """A 2-layer tiny GPT with large random weights, so that its continuations vary (a freshly initialised
    model mostly repeats the last character, which would make equality tests weak)."""
    policy = Policy.tiny_gpt(GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=64))
    gen = torch.Generator().manual_seed(seed)
    policy.load_state_dict(
        {
            k: torch.randn(v.shape, generator=gen) * 0.3 if v.dim() == 2 else v.clone()
            for k, v in policy.state_dict().items()
        }
    )
    return policy


def perturbed(engine: TorchEngine, scale: float = 0.5, seed: int = 1) -> dict[str, torch.Tensor]:
    """The engine's weights plus seeded noise: a version that generates differently."""
    gen = torch.Generator().manual_seed(seed)
    return {
        n: (t + scale * torch.randn(t.shape, generator=gen)).contiguous() for n, t in engine.policy.state_dict().items()
    }


def write_dir(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    return str(path)


def request(rid: str = "r", *, tokens: int = 12, seed: int = 7) -> GenerationRequest:
    return GenerationRequest(
        rid, PROMPT, SamplingParams(max_new_tokens=tokens, temperature=1.0, seed=seed, ignore_eos=True)
    )


def run_against(
    server_type: type[Server],
    client_type: type[Client],
    scenario: Callable[[TorchEngine, Server, Client], Awaitable[None]],
    **engine_kwargs: object,
) -> None:
    """Run ``scenario`` with a fresh engine served by ``server_type`` and a started ``client_type`` client."""

    async def main() -> None:
        engine = make_engine(**engine_kwargs)
        try:
            async with server_type(engine) as server:
                client = client_type(server.url, timeout_s=30)
                await client.start(health_timeout_s=10)
                try:
                    await scenario(engine, server, client)
                finally:
                    await client.close()
        finally:
            await engine.close()

    asyncio.run(main())
