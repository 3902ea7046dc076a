"""Re-issue recorded prompts against one set of weights and score them — the code the CLI and the gate share.

Contract:
- ``Replayer(spec)`` builds the spec's policy once and one verifier per domain (a sandbox pool only if a
  domain's verifier runs code). ``await replayer.run(items, weights, ...)`` loads the weights (``None``: the
  policy as the spec builds it), re-issues every item through a :class:`TorchEngine` with up to
  ``concurrency`` requests decoding at once (continuous batching; as many more wait in the engine's queue), and
  scores each completion with its domain's verifier as it completes when the item has verifier fields — recorded
  with it, or (served traffic) those of the domain's task whose prompt the request asked (``with_fields``:
  ``DomainSource.find`` on the prompt, then on what the user typed); others are compared with the recorded text
  only.
- Determinism: each request samples with its own RNG seeded from ``(seed, item.key)`` and the recorded
  temperature (``greedy``: temperature 0), so the same weights and seed give the same completions whatever
  the concurrency or the batch a request shared; greedy replay of a greedy recording at the recorded
  version reproduces it (up to float round-off in batched matmuls).
- ``raw_throughput`` times the engine alone on the same requests (no scoring, everything submitted at
  once): the ceiling replay's own tokens/s is reported against.

Non-goals: SGLang/vLLM engines (replay runs the builtin engine in-process), multi-turn conversations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import torch

from actors.domains import Domain, DomainVerifier, Scorer, domains_from_spec, find_task
from actors.engines import GenerationRequest, SamplingParams, TorchEngine
from actors.policy import Policy
from actors.protocol import VERIFIER_ERROR, domains_of, policy_of
from actors.replay._items import ReplayItem
from actors.sandbox import SandboxPool

__all__ = ["Outcome", "ReplayRun", "Replayer", "request_seed"]

_CODE_VERIFIERS = ("python-tests", "python-expr")
_DEFAULT_MAX_NEW_TOKENS = 64


def request_seed(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:7], "big")


TEXT_ONLY = "text-only"  # the verdict of a sample its domain's verifier has nothing to score with
NOT_IN_SPEC = "not-in-spec"  # … of a sample whose domain the spec replayed with does not have (another run's spec)


@dataclass(frozen=True)
class Outcome:
    key: str
    domain: str
    text: str
    tokens: int
    reward: float | None  # None: not scored (no verifier fields / no verifier for the domain / verifier error)
    verdict: str  # the verifier's; TEXT_ONLY (nothing to score with) or NOT_IN_SPEC (the domain is not the spec's)


@dataclass(frozen=True)
class ReplayRun:
    label: str  # what weights: "v3", a path, "initial"
    version: int
    outcomes: list[Outcome]
    tokens: int
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


class Replayer:
    """See the module docstring. Use as an async context manager (it may own a sandbox pool)."""

    def __init__(self, spec: Any, *, device: str = "cpu", num_threads: int | None = None) -> None:
        self.spec = spec
        self.policy = Policy.from_spec(policy_of(spec), device=device)
        self._initial = {name: t.detach().clone() for name, t in self.policy.state_dict().items()}
        self._num_threads = num_threads
        self._domains: dict[str, DomainVerifier] = {
            name: DomainVerifier(d.verifier, dict(d.verifier_config), d.verifier_timeout_s, d.verifier_processes)
            for name, d in domains_of(spec).items()
        }
        self._pool: SandboxPool | None = None
        self._scorer: Scorer | None = None
        self._sources: dict[str, Domain] | None = None  # the domains' task sources, opened on first use
        gen = next((a.config for a in spec.actors.values() if a.kind == "generator"), None)
        self._top_p = float(getattr(gen, "top_p", 1.0) or 1.0)
        self._top_k = int(getattr(gen, "top_k", 0) or 0)
        self._cap = getattr(gen, "max_new_tokens", None)

    async def __aenter__(self) -> Replayer:
        if any(d.verifier in _CODE_VERIFIERS for d in self._domains.values()):
            # the spec's verify actor's sandbox — its limits (an answer that passed or failed there for its memory,
            # CPU or output must do the same here, or a replayed outcome "changes" for no reason of the weights) and
            # its isolation policy (a weaker level is the spec's explicit opt-in)
            verify = next((a.config for a in self.spec.actors.values() if a.kind == "verify"), None)
            sandbox = getattr(verify, "sandbox", None)
            self._pool = SandboxPool.from_config(sandbox) if sandbox is not None else SandboxPool(workers=2)
            await self._pool.start()
        self._scorer = Scorer(self._domains, pool=self._pool)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pool is not None:
            await self._pool.aclose()

    # -- requests -------------------------------------------------------------------------------------
    def max_new_tokens(self, domain: str) -> int:
        spec_domain = domains_of(self.spec).get(domain)
        wanted = int(getattr(spec_domain, "max_new_tokens", 0) or _DEFAULT_MAX_NEW_TOKENS)
        return min(wanted, int(self._cap)) if self._cap else wanted

    def request(self, item: ReplayItem, *, seed: int, greedy: bool) -> GenerationRequest:
        params = SamplingParams(
            max_new_tokens=self.max_new_tokens(item.domain),
            temperature=0.0 if greedy else item.temperature,
            top_p=self._top_p,
            top_k=self._top_k,
            seed=request_seed(seed, item.key),
        )
        return GenerationRequest(item.key, item.prompt_ids, params)

    def scorable(self, item: ReplayItem) -> bool:
        return bool(self.with_fields(item).verifier_fields) and item.domain in self._domains

    def with_fields(self, item: ReplayItem) -> ReplayItem:
        """``item`` with the verifier fields of its domain's task when it has none (served traffic whose prompt,
        or whose user text, is a task of the domain); unchanged otherwise."""
        if item.verifier_fields or item.source != "traffic" or item.domain not in self._domains:
            return item
        if self._sources is None:
            self._sources = domains_from_spec(self.spec)
        task = find_task(self._sources, item.domain, (item.prompt, item.asked))
        if task is None or not task.verifier_fields:
            return item
        return dataclasses.replace(item, verifier_fields=dict(task.verifier_fields))

    # -- running --------------------------------------------------------------------------------------
    def engine(self, weights: Mapping[str, torch.Tensor] | None, *, version: int, concurrency: int) -> TorchEngine:
        self.policy.load_state_dict(weights if weights is not None else self._initial)
        return TorchEngine(
            self.policy, max_batch_size=concurrency, num_threads=self._num_threads, version=max(0, version)
        )

    async def run(
        self,
        items: Sequence[ReplayItem],
        weights: Mapping[str, torch.Tensor] | None,
        *,
        label: str,
        version: int,
        seed: int = 0,
        concurrency: int = 16,
        greedy: bool = False,
    ) -> ReplayRun:
        assert self._scorer is not None, "use `async with Replayer(spec) as replayer`"
        items = [self.with_fields(item) for item in items]
        engine = self.engine(weights, version=version, concurrency=concurrency)
        outcomes: list[Outcome | None] = [None] * len(items)

        async def one(index: int, item: ReplayItem) -> None:
            assert self._scorer is not None
            [completion] = await engine.generate([self.request(item, seed=seed, greedy=greedy)])
            reward: float | None = None
            verdict = TEXT_ONLY if item.domain in self._domains else NOT_IN_SPEC
            if self.scorable(item):
                result = await self._scorer.score(item.domain, completion.text, item.verifier_fields)
                verdict = str(result.verdict)  # a verifier's error scores nothing: no reward (not a 0)
                reward = None if verdict == VERIFIER_ERROR else result.reward
            outcomes[index] = Outcome(
                item.key, item.domain, completion.text, len(completion.token_ids), reward, verdict
            )

        # Items reach a fixed set of workers through a bounded stream: a task per item (a week of recordings is
        # 100k+ of them) made a Ctrl-C wait for every one of them to be cancelled. Twice ``concurrency`` workers
        # keep the engine's batch full while finished completions are scored: a finished row's place is taken at
        # the next step by a request already waiting in the engine's queue.
        send, receive = anyio.create_memory_object_stream[tuple[int, ReplayItem]](max_buffer_size=concurrency)

        async def feed() -> None:
            async with send:
                for pair in enumerate(items):
                    await send.send(pair)

        async def work() -> None:
            async for index, item in receive:
                await one(index, item)

        started = time.perf_counter()
        try:
            with receive:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(feed)
                    for _ in range(min(len(items), 2 * concurrency)):
                        tg.start_soon(work)
        finally:
            await engine.close()
        wall = time.perf_counter() - started
        done = [o for o in outcomes if o is not None]
        return ReplayRun(label, version, done, sum(o.tokens for o in done), wall)

    async def raw_throughput(
        self,
        items: Sequence[ReplayItem],
        weights: Mapping[str, torch.Tensor] | None,
        *,
        version: int,
        seed: int = 0,
        concurrency: int = 16,
        greedy: bool = False,
    ) -> tuple[int, float]:
        """(tokens, seconds) of the bare engine on the same requests, all submitted at once."""
        engine = self.engine(weights, version=version, concurrency=concurrency)
        requests = [self.request(item, seed=seed, greedy=greedy) for item in items]
        started = time.perf_counter()
        try:
            completions = await engine.generate(requests)
        finally:
            await engine.close()
        return sum(len(c.token_ids) for c in completions), time.perf_counter() - started
