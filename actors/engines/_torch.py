"""The builtin torch engine: continuous batching with a KV cache and in-flight weight updates.

Contract:

* One background asyncio task (the *decode loop*) owns the model. ``generate()`` validates its requests,
  enqueues them (a bounded queue: ``max_queue`` waiting requests; callers wait for room) and awaits their
  completions. At every step boundary finished rows leave the batch and waiting requests join (up to
  ``max_batch_size`` rows): joiners are prefilled left-padded and their caches merged into the running
  batch's. Position ids always come from the attention mask, so a request's tokens do not depend on
  which requests it shares a batch with (greedy: batched == single == no cache, up to float round-off).
  Joiners with identical contexts (the rows of a GRPO group) are prefilled once and their cache rows copied.
* Each step (one decode forward for running rows, one prefill forward for joiners, sampling) runs in a
  worker thread (``asyncio.to_thread``) while holding the engine lock, so the event loop stays responsive.
  One hop to the thread runs up to ``steps_per_call`` steps back to back (default 4): it returns sooner when
  requests wait and the batch has room for them, when a row was aborted, or when the engine is paused or
  closing. A tiny model's step takes a few milliseconds, about what the hop back through a busy event loop
  (the bus's messages, other tasks) costs, so one step per hop would leave the decoder idle much of the time.
  A ``step_hook, or a streaming request in the batch (its
  tokens reach the caller after every step), makes it one step per hop.
* Logprobs: ``Completion.logprobs`` is ``log μ`` — the log-probability under the exact distribution the
  token was drawn from (temperature, then top-k, then top-p, renormalised; greedy and top_k=1 report
  0.0). That is what the decoupled-PPO importance weight needs as the behavior policy.
  ``Completion.unfiltered_logprobs`` is ``log softmax(logits / T)`` (T = 1 for greedy) — exactly what
  ``Policy.token_logprobs(..., temperature=T)`` recomputes in the learner, so it is the like-for-like
  number for measuring train/inference mismatch. Without top-k/top-p the two are identical; with them the
  learner should use ``logprobs`` as μ and apply the same temperature in its own forward (`actors.learner._loss`).
* Versions: every token carries the engine's weight version at the step that produced it.
  ``update_weights(version, source)`` validates the whole payload (names, shapes, dtypes, finite values)
  without touching the live model, then swaps it in under the engine lock *between* two steps — running
  requests are not drained; their next token carries the new version. On a CPU engine the payload is copied
  (and its values checked, tensor by tensor while fresh in the cache) into a second set of weights the engine
  keeps, outside the lock; the swap under the lock then exchanges the two sets' storage, so decoding waits
  microseconds, not a copy of the model (the price: the weights' memory twice). ``update_weights_from(version,
  fill)`` lets a transport read the new version straight into that second set (no copy at all), or hand over
  tensors that are ``shared`` (views of a shared-memory slot, values checked by their writer: ``actors.weights``'
  ``shm`` transport), which a CPU engine makes its live weights as they are — no copy, no second set used; the
  engine's own set it replaced becomes the standby set, and the views of a version it replaced are let go (which
  releases their slot). On other devices the validated payload is copied in place under the lock. By default the
  first step after a swap re-prefills the running rows (prompt + tokens so far) so their KV cache comes from the
  new weights too — each token is then exactly what its tagged version gives for its prefix (as in AReaL); with
  ``recompute_cache_on_update=False`` the old cache is kept (cheaper; post-swap tokens then come from new
  weights over old keys/values, still with exact behavior logprobs). A rejected payload raises
  :class:`WeightUpdateError` and the old version keeps serving. Versions must increase.
* ``pause()`` returns once no step is running and no new step will start; ``resume()`` continues.
  ``abort(request_id)`` ends a request at the next step boundary with ``finish_reason="abort"``.
  ``close()`` finishes the current step and ends everything left as ``"abort"``.
* Streaming (for the gateway): ``generate(requests, on_token=cb)`` calls ``cb(TokenDelta)`` on the event loop
  after every step, once per request that gained tokens in it, before its completion resolves; the callback
  must not block or raise. ``generate_stream(request)`` wraps it as an async iterator of ``TokenDelta``
  followed by the final ``Completion``; leaving the iteration early aborts the request. Neither changes
  what is sampled: the tokens, logprobs and versions are those of the final ``Completion``.
* ``step_hook`` (public, for tests and instrumentation): awaited after every step with the number of
  steps done so far, before the next step starts and outside the lock — e.g. to apply a weight update
  after exactly k steps.

Non-goals: paged attention / prefix caching, speculative decoding, chunked prefill (a long joining prompt
delays that step), fairness beyond FIFO admission.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from actors.engines import _kv as kv
from actors.engines._packing import allocate_packed, is_packed
from actors.engines._sampling import sample
from actors.engines._types import (
    Completion,
    EngineClosedError,
    FinishReason,
    GenerationRequest,
    RequestError,
    WeightSource,
    WeightUpdateError,
)
from actors.policy import KVCache, Policy, StateDictError, all_finite, positions_from_mask, read_safetensors

StepHook = Callable[[int], Awaitable[None]]
# update_weights_from's source: given the engine's standby buffers (or None), the new weights (a mapping whose
# ``values_checked`` attribute is True when its floating-point values were already checked finite)
WeightFill = Callable[[dict[str, Tensor] | None], Awaitable[Mapping[str, Any]]]


@dataclass(frozen=True)
class TokenDelta:
    """Tokens a request gained since its previous delta (usually one step's worth: one token)."""

    request_id: str
    index: int  # position of the request in the ``generate()`` call that submitted it
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]


TokenCallback = Callable[[TokenDelta], None]


@dataclass(eq=False)
class _Seq:
    request: GenerationRequest
    future: asyncio.Future[Completion]
    generator: torch.Generator | None
    stop_window: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    unfiltered: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    aborted: bool = False
    on_token: TokenCallback | None = None
    index: int = 0
    reported: int = 0  # tokens already handed to on_token


class TorchEngine:
    """Batched decoding of a :class:`~actors.policy.Policy`; see the module docstring."""

    name = "torch"

    def __init__(
        self,
        policy: Policy,
        *,
        max_batch_size: int = 32,
        max_queue: int = 1024,
        num_threads: int | None = None,
        version: int = 0,
        seed: int = 0,
        step_hook: StepHook | None = None,
        recompute_cache_on_update: bool = True,
        steps_per_call: int = 4,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if steps_per_call < 1:
            raise ValueError(f"steps_per_call must be >= 1, got {steps_per_call}")
        if num_threads is not None:
            if num_threads < 1:
                raise ValueError(f"num_threads must be >= 1, got {num_threads}")
            torch.set_num_threads(num_threads)
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.step_hook = step_hook
        self.recompute_cache_on_update = recompute_cache_on_update
        self.steps_per_call = steps_per_call
        # an older version may replace the one served (a serving generator: rollback, a manual promotion); else a
        # version at or below the current one is refused as stale
        self.accepts_older = False
        self.accepts_same = False  # the version it serves may be loaded again (a fake server: it relabels, not orders)
        self._cache_version = version
        self._version = version
        self._rng = torch.Generator().manual_seed(seed)
        self._device = policy.device
        self._pending: deque[_Seq] = deque()
        self._slots = asyncio.Semaphore(max_queue)
        self._active: list[_Seq] = []
        self._cache: KVCache | None = None
        self._mask: Tensor | None = None  # [rows, cache length], 1 = real token
        self._lock = asyncio.Lock()
        self._updating = asyncio.Lock()  # one weight update at a time (they share the standby set)
        self._spare: dict[str, Tensor] | None = None  # CPU: the standby set of weights, allocated at the first update
        self._live_shared = False  # the live weights are views of a shared slot (never written, never standby)
        self._wake = asyncio.Event()
        self._running = asyncio.Event()
        self._running.set()
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._counts: Counter[str] = Counter()
        self._versions_served: Counter[int] = Counter()
        self._last_batch = 0

    @classmethod
    def from_config(
        cls,
        policy_spec: Any,
        config: Any,
        *,
        num_threads: int | None = None,
        version: int = 0,
        seed: int = 0,
    ) -> TorchEngine:
        """Build from the spec's ``policy`` section and a ``GeneratorConfig`` (fields used: ``device``,
        ``dtype``, ``max_batch_size``; sampling fields are per-request and belong to the actor)."""
        policy = Policy.from_spec(policy_spec, dtype=config.dtype, device=config.device)
        return cls(
            policy,
            max_batch_size=config.max_batch_size,
            num_threads=num_threads,
            version=version,
            seed=seed,
        )

    # ------------------------------------------------------------------ public API
    @property
    def version(self) -> int:
        return self._version

    async def generate(
        self, requests: Sequence[GenerationRequest], *, on_token: TokenCallback | None = None
    ) -> list[Completion]:
        """Complete every request (continuous batching); ``on_token`` streams progress, see the module doc."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        for request in requests:
            self._validate(request)
        self._ensure_started()
        loop = asyncio.get_running_loop()
        seqs: list[_Seq] = []
        try:
            for index, request in enumerate(requests):
                await self._slots.acquire()
                seq = self._new_seq(request, loop.create_future())
                seq.on_token, seq.index = on_token, index
                seqs.append(seq)
                self._pending.append(seq)
                self._wake.set()
            return list(await asyncio.gather(*(s.future for s in seqs)))
        except BaseException:
            for seq in seqs:
                seq.aborted = True
                seq.future.cancel()
            raise

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | Completion]:
        """Yield the request's tokens as they are sampled, then its ``Completion``; closing the iterator early
        (``aclose()``, a cancelled consumer) aborts the request."""
        queue: asyncio.Queue[TokenDelta | None] = asyncio.Queue()
        task = asyncio.ensure_future(self.generate([request], on_token=queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (delta := await queue.get()) is not None:
                yield delta
            yield (await task)[0]
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def abort(self, request_id: str) -> int:
        """End every queued or running request with this id as ``"abort"`` at the next step boundary."""
        hits = 0
        for seq in (*self._pending, *self._active):
            if seq.request.request_id == request_id and not seq.aborted:
                seq.aborted = True
                hits += 1
        self._wake.set()
        return hits

    async def update_weights(self, version: int, source: WeightSource) -> None:
        async def given(_: dict[str, Tensor] | None) -> Mapping[str, Any]:
            if isinstance(source, str | Path):
                return await asyncio.to_thread(read_safetensors, source)
            if isinstance(source, Mapping):
                return source
            raise StateDictError(f"unsupported weight source {type(source).__name__}")

        await self.update_weights_from(version, given)

    async def update_weights_from(self, version: int, fill: WeightFill) -> None:
        """Swap in the weights ``await fill(buffers)`` returns; see the module docstring. On a CPU engine ``buffers``
        is the engine's second set of weights (its standby), which ``fill`` may read the new version into directly
        — then nothing is copied; ``None`` on other devices. ``fill`` is awaited with no other update under way."""
        self._check_newer(version)
        async with self._updating:
            on_cpu = self._device.type == "cpu"
            try:
                given = await fill(await self._standby() if on_cpu else None)
                checked = bool(getattr(given, "values_checked", False))  # e.g. checked as they were read
                adopt = on_cpu and bool(getattr(given, "shared", False))  # views to serve from as they are
                state = dict(given)
                del given
                if adopt:
                    if checked:  # names, shapes and dtypes only: microseconds, less than a hop to a thread
                        self.policy.validate_state_dict(state, values=False)
                    else:
                        await asyncio.to_thread(self.policy.validate_state_dict, state)
                    standby = None
                elif on_cpu:  # validate while copying into the standby set, all outside the lock
                    standby = await self._standby()
                    await asyncio.to_thread(self._stage, state, standby, checked)
                else:
                    standby = None
                    await asyncio.to_thread(self.policy.validate_state_dict, state)
            except StateDictError as exc:
                self._counts["weight_updates_rejected"] += 1
                raise WeightUpdateError(f"version {version} rejected, still serving {self._version}: {exc}") from None
            # shielded: a caller's timeout must not release the lock while a copy into the live weights runs
            await asyncio.shield(self._swap(version, state, standby, adopt))

    async def _swap(
        self, version: int, state: dict[str, Any], standby: dict[str, Tensor] | None, adopt: bool = False
    ) -> None:
        async with self._lock:
            self._check_newer(version)
            if adopt:
                replaced = dict(state)
                self.policy.exchange_weights(replaced)  # pointers only; ``replaced`` now holds the previous set
                if not self._live_shared:
                    self._spare = replaced  # the engine's own set: the standby for a later copying update
                self._live_shared = True
            elif standby is not None:
                self.policy.exchange_weights(standby)  # pointers only: the decode loop waits microseconds
                if self._live_shared:  # the standby set now holds a slot's views: let them go
                    self._spare, self._live_shared = None, False
            else:
                await asyncio.to_thread(self.policy.load_state_dict, state, validate=False)
            self._version = version
            self._counts["weight_updates"] += 1
        state.clear()  # nothing here keeps a replaced version's views (their slot is released with the last one)

    def _check_newer(self, version: int) -> None:
        if (version == self._version and not self.accepts_same) or (version < self._version and not self.accepts_older):
            self._counts["weight_updates_rejected"] += 1
            raise WeightUpdateError(f"version {version} rejected: engine already serves version {self._version}")

    async def _standby(self) -> dict[str, Tensor]:
        """The standby set, allocated at the first update. Both sets are packed (``actors.engines._packing``) so
        that a packed broadcast lands in either without a copy: the live set moves into a packed buffer of its own
        then (one copy outside the decode lock, while no other update can change it; pointers exchanged under
        it)."""
        if self._spare is None:
            live = self.policy.state_dict()
            if not is_packed(live):
                packed = allocate_packed(live)
                await asyncio.to_thread(_copy_into, packed, live)
                async with self._lock:
                    self.policy.exchange_weights(packed)  # ``packed`` now holds the previous tensors: let go
                    self._live_shared = False
            self._spare = allocate_packed(live)
        return self._spare

    def _stage(self, state: Mapping[str, Any], standby: dict[str, Tensor], checked: bool = False) -> None:
        """Names, shapes and dtypes first (nothing is written on a mismatch), then per tensor: copy it into the
        standby set unless it is already there, and check its values there while they are fresh in the cache —
        unless the source says it checked them (``values_checked``) and they were read into the standby set."""
        self.policy.validate_state_dict(state, values=False)
        with torch.no_grad():
            for name, target in standby.items():
                value = state[name]
                in_place = value.data_ptr() == target.data_ptr()
                if not in_place:
                    target.copy_(value)
                if not (checked and in_place) and target.is_floating_point() and not all_finite(target):
                    raise StateDictError(f"{name}: contains NaN or infinite values")

    async def pause(self) -> None:
        self._running.clear()
        async with self._lock:  # wait for a step in progress to finish
            pass

    async def resume(self) -> None:
        self._running.set()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._running.set()
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for seq in (*self._active, *self._pending):
            seq.finish_reason = "abort"
            self._resolve(seq)
        self._active, self._cache, self._mask = [], None, None
        self._pending.clear()

    def stats(self) -> dict[str, Any]:
        steps = self._counts["steps"]
        return {
            "version": self._version,
            "steps": steps,
            "steps_per_call": steps / self._counts["calls"] if self._counts["calls"] else 0.0,
            "tokens_generated": self._counts["tokens_generated"],
            "prefill_tokens": self._counts["prefill_tokens"],
            "prefill_rows_shared": self._counts["prefill_rows_shared"],
            "requests_finished": self._counts["requests_finished"],
            "requests_aborted": self._counts["requests_aborted"],
            "batch_size": self._last_batch,
            "mean_batch_occupancy": (self._counts["row_steps"] / steps / self.max_batch_size) if steps else 0.0,
            "queue_depth": len(self._pending),
            "running": len(self._active),
            "paused": not self._running.is_set(),
            "weight_updates": self._counts["weight_updates"],
            "weight_updates_rejected": self._counts["weight_updates_rejected"],
            "cache_rebuilds": self._counts["cache_rebuilds"],
            "versions_served": dict(self._versions_served),
        }

    # ------------------------------------------------------------------ decode loop
    def _validate(self, request: GenerationRequest) -> None:
        prompt = request.prompt_ids
        if not prompt:
            raise RequestError(f"request {request.request_id!r}: prompt_ids is empty")
        vocab = self.policy.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"request {request.request_id!r}: token id {bad} outside the vocabulary [0, {vocab})")
        if len(prompt) >= self.policy.max_context:
            raise RequestError(
                f"request {request.request_id!r}: prompt of {len(prompt)} tokens leaves no room in the "
                f"model's context of {self.policy.max_context}"
            )

    def _new_seq(self, request: GenerationRequest, future: asyncio.Future[Completion]) -> _Seq:
        seed = request.params.seed
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        longest_stop = max((len(s) for s in request.params.stop), default=0)
        return _Seq(request, future, generator, stop_window=4 * longest_stop + 4)

    def _ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="torch-engine-decode")

    async def _loop(self) -> None:
        try:
            await self._decode_loop()
        except BaseException as exc:  # e.g. a step_hook raised: fail the waiting callers instead of hanging them
            error = exc if isinstance(exc, Exception) else EngineClosedError("the decode loop was cancelled")
            for seq in (*self._active, *self._pending):
                if not seq.future.done():
                    seq.future.set_exception(error)
            self._active, self._cache, self._mask = [], None, None
            self._pending.clear()
            if not isinstance(exc, Exception):
                raise  # cancellation propagates; other errors were delivered to the callers above

    async def _decode_loop(self) -> None:
        while not self._closed:
            if not self._running.is_set():
                await self._running.wait()
                continue
            if not self._active and not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            async with self._lock:
                if not self._running.is_set() or self._closed:
                    continue
                admit = self._admit()
                if not admit and not self._active:
                    continue
                for seq in self._active:
                    seq.aborted = seq.aborted or seq.future.done()
                rows = [*self._active, *admit]
                try:
                    finished, steps = await asyncio.to_thread(self._steps, admit, self._version)
                except Exception as exc:  # a broken step fails its requests, not the engine
                    self._active, self._cache, self._mask = [], None, None
                    for seq in rows:
                        if not seq.future.done():
                            seq.future.set_exception(exc)
                    continue
            self._report_tokens(rows)
            for seq in finished:
                self._resolve(seq)
            self._counts["steps"] += steps
            self._counts["calls"] += 1
            if self.step_hook is not None:
                await self.step_hook(self._counts["steps"])

    @staticmethod
    def _report_tokens(rows: list[_Seq]) -> None:
        for seq in rows:
            if seq.on_token is None or len(seq.tokens) <= seq.reported:
                continue
            start, seq.reported = seq.reported, len(seq.tokens)
            seq.on_token(
                TokenDelta(
                    seq.request.request_id,
                    seq.index,
                    tuple(seq.tokens[start:]),
                    tuple(seq.logprobs[start:]),
                    tuple(seq.versions[start:]),
                )
            )

    def _admit(self) -> list[_Seq]:
        admit: list[_Seq] = []
        while self._pending and len(self._active) + len(admit) < self.max_batch_size:
            seq = self._pending.popleft()
            self._slots.release()
            if seq.aborted or seq.future.done():
                seq.finish_reason = "abort"
                self._resolve(seq)
                continue
            admit.append(seq)
        return admit

    def _resolve(self, seq: _Seq) -> None:
        reason = seq.finish_reason or "abort"
        self._counts["requests_aborted" if reason == "abort" else "requests_finished"] += 1
        if seq.future.done():
            return
        seq.future.set_result(
            Completion(
                request_id=seq.request.request_id,
                prompt_ids=seq.request.prompt_ids,
                token_ids=tuple(seq.tokens),
                logprobs=tuple(seq.logprobs),
                versions=tuple(seq.versions),
                text=self.tokenizer.decode(seq.tokens),
                finish_reason=reason,
                unfiltered_logprobs=tuple(seq.unfiltered),
            )
        )

    # ------------------------------------------------------------------ steps (worker thread)
    def _steps(self, admit: list[_Seq], version: int) -> tuple[list[_Seq], int]:
        """Up to ``steps_per_call`` steps in this thread; returns the rows that finished and the steps run."""
        streaming = any(seq.on_token is not None for seq in (*self._active, *admit))
        limit = 1 if self.step_hook is not None or streaming else self.steps_per_call
        finished = self._step(admit, version)
        steps = 1
        while steps < limit and self._active and not self._closed and self._running.is_set():
            if self._pending and len(self._active) < self.max_batch_size:
                break  # joiners wait: let the loop admit them
            if any(seq.future.done() for seq in self._active):
                break  # an aborted row: the loop ends it
            finished.extend(self._step([], version))
            steps += 1
        return finished, steps

    def _step(self, admit: list[_Seq], version: int) -> list[_Seq]:
        with torch.inference_mode():
            finished = [seq for seq in self._active if seq.aborted]
            if finished:
                for seq in finished:
                    seq.finish_reason = "abort"
                self._keep_rows([i for i, seq in enumerate(self._active) if not seq.aborted])
            last_logits: list[Tensor] = []
            if self._active and self._cache_version != version and self.recompute_cache_on_update:
                # The cached keys/values were computed by older weights: rebuild them with the new ones so
                # every token tagged with `version` is exactly what those weights give for its prefix.
                admit = [*self._active, *admit]
                self._counts["cache_rebuilds"] += 1
                self._active, self._cache, self._mask = [], None, None
            self._cache_version = version
            if self._active:
                assert self._mask is not None and self._cache is not None
                last = torch.tensor([[seq.tokens[-1]] for seq in self._active], device=self._device)
                positions = self._mask.sum(dim=1, keepdim=True)
                mask = torch.cat((self._mask, torch.ones_like(self._mask[:, :1])), dim=1)
                logits, self._cache = self.policy.forward(last, mask, positions, self._cache, use_cache=True)
                self._mask = mask
                last_logits.append(logits[:, -1])
            if admit:
                last_logits.append(self._prefill(admit))
            rows = [*self._active, *admit]
            if not rows:  # every running row was aborted and nobody joins: nothing to decode this step
                self._active, self._cache, self._mask = [], None, None
                return finished
            self._last_batch = len(rows)
            self._counts["row_steps"] += len(rows)
            sampled = sample(
                torch.cat(last_logits),
                [seq.request.params for seq in rows],
                [seq.generator for seq in rows],
                self._rng,
            )
            keep: list[int] = []
            for i, seq in enumerate(rows):
                seq.tokens.append(sampled.tokens[i])
                seq.logprobs.append(sampled.logprobs[i])
                seq.unfiltered.append(sampled.unfiltered_logprobs[i])
                seq.versions.append(version)
                seq.finish_reason = self._finish_reason(seq)
                if seq.finish_reason is None:
                    keep.append(i)
                else:
                    finished.append(seq)
            self._counts["tokens_generated"] += len(rows)
            self._versions_served[version] += len(rows)
            self._active = rows
            self._keep_rows(keep)
        return finished

    def _prefill(self, admit: list[_Seq]) -> Tensor:
        """One forward over the joiners' contexts; identical contexts (a GRPO group's rows before their first
        token) are computed once and their cache rows copied — the same numbers, a group's prefill at 1/n."""
        contexts = [(*seq.request.prompt_ids, *seq.tokens) for seq in admit]
        distinct: dict[tuple[int, ...], int] = {}
        rows_of = [distinct.setdefault(context, len(distinct)) for context in contexts]
        longest = max(len(context) for context in distinct)
        ids = torch.full((len(distinct), longest), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(distinct), longest), dtype=torch.long)
        for row, prompt in enumerate(distinct):
            ids[row, longest - len(prompt) :] = torch.tensor(prompt)
            mask[row, longest - len(prompt) :] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        self._counts["prefill_tokens"] += int(mask.sum())
        self._counts["prefill_rows_shared"] += len(contexts) - len(distinct)
        logits, cache = self.policy.forward(ids, mask, positions_from_mask(mask, longest), None, use_cache=True)
        assert cache is not None
        if len(distinct) < len(contexts):
            index = torch.tensor(rows_of, device=mask.device)
            logits, mask = logits.index_select(0, index), mask.index_select(0, index)
            cache = [(k.index_select(0, index), v.index_select(0, index)) for k, v in cache]
        if self._cache is None or self._mask is None:
            self._cache, self._mask = cache, mask
        else:
            self._cache, self._mask = kv.merge(self._cache, self._mask, cache, mask)
        return logits[:, -1]

    def _keep_rows(self, keep: list[int]) -> None:
        if len(keep) == len(self._active):
            return
        self._active = [self._active[i] for i in keep]
        if not keep or self._cache is None or self._mask is None:
            self._cache, self._mask = None, None
            return
        self._cache, self._mask = kv.keep_rows(self._cache, self._mask, keep)

    def _finish_reason(self, seq: _Seq) -> FinishReason | None:
        params, token = seq.request.params, seq.tokens[-1]
        if (token == self.tokenizer.eos_id and not params.ignore_eos) or token in params.stop_token_ids:
            return "stop"
        if params.stop:
            tail = self.tokenizer.decode(seq.tokens[-seq.stop_window :])
            if any(stop in tail for stop in params.stop):
                return "stop"
        if len(seq.tokens) >= params.max_new_tokens:
            return "length"
        if len(seq.request.prompt_ids) + len(seq.tokens) >= self.policy.max_context:
            return "length"
        return None


def _copy_into(targets: Mapping[str, Tensor], sources: Mapping[str, Tensor]) -> None:
    with torch.no_grad():
        for name, target in targets.items():
            target.copy_(sources[name])
