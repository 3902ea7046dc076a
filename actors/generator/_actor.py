"""The generator actor: ``prompts`` in, ``rollouts`` out, weights swapped in while it runs.

Each prompt message asks for ``group_size`` completions; they are submitted to the engine together and
published as one rollout (a GRPO group stays together). Many prompts are in flight at once — up to
``max_batch_size`` completions — so the engine's continuous batching always has rows to decode. A prompt is
acked only after its rollout is published: a generator killed mid-prompt loses nothing, its prompts are
redelivered to a sibling replica or to itself after the restart. A prompt the engine can never serve as made (a
``RequestError``: longer than the model's context, say) goes to the dead-letter channel at once, counted per domain
(``prompts_refused.<domain>``) and logged at most once a minute per domain; other failures (a server down) are
retried, each counted (``errors``) and logged at most once per ``_FAILURE_LOG_EVERY_S`` with how many failed since.
A prompt being generated has its ack timer kept reset, so a generation that outlasts ``bus.ack_wait_s`` (a slow or
restarting server) is not redelivered meanwhile; a redelivery that comes anyway (a lost keepalive) is counted
(``redelivered_while_generating``) and settled by the generation under way. A prompt of
a domain the spec no longer has (a run resumed without it) is acked unanswered, counted in
``removed_domain.<domain>``.

Weights: a :class:`~actors.weights.WeightSubscriber` watches the topology's current version and swaps it into
the engine between decode steps. When the topology has a learner, a new generator waits for the first
published version (so it never samples from weights the learner does not have); otherwise it serves the
policy as the spec describes it (checkpoint or fresh init) as version 0.

With ``serve: true`` the same engine also answers the gateway (:mod:`actors.generator._serve`), from the
start — before the first learner version, users are served the policy as specified. A generator that consumes no
channel (``consumes: []``, with ``serve: true``) only answers users: the serving generator of a service, kept on the
promoted version (``follow: serving``) beside the training generators.

An SGLang/vLLM server started with ``--api-key`` is sent the key held by the environment variable ``api_key_env``
names. A 401/403 at start fails the start at once, naming that setting (no wait mends a key); one mid-run (the
server restarted with another key) is waited out like an outage.

Non-goals: driving an SGLang/vLLM server's own weight-update group from here (the HTTP engines take a
safetensors directory or a ``DistributedWeights`` source; see :mod:`actors.engines._group`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import PurePath
from typing import Any

import anyio

from actors.engines import Completion, Engine, EngineHTTPError, GenerationRequest, RequestError, SamplingParams
from actors.generator._config import GeneratorConfig
from actors.policy import encode_prompt, load_tokenizer
from actors.protocol import (
    CompletionRecord,
    PromptMsg,
    RolloutMsg,
    count_removed_domain,
    domains_of,
    policy_of,
    served_key,
)
from actors.weights import SafetensorsDirTransport, WeightSubscriber, weight_transports
from topology.bus import BUS_AWAY, Delivery, InFlight, Outbox
from topology.runtime import Actor, ActorContext, iterate_until

_REFUSAL_LOG_EVERY_S = 60.0  # a domain's refused prompts (each counted) are logged at most this often
_RETRY_S = 1.0  # a failed prompt goes back to the bus this long before it is delivered again (and a server that
#   is unavailable is asked again this often)
_KEY_REFUSED = (401, 403)  # the server wants another API key (or one): no prompt is at fault
_FAILURE_LOG_EVERY_S = 10.0  # prompts that failed and went back to the bus (each counted) are logged at most this often

__all__ = ["GeneratorActor"]

_DEFAULT_MAX_NEW_TOKENS = 64
_SERVER_WAIT_LOG_S = 10.0  # a starting generator says what server it waits for this often
_WEIGHTS_ERROR_CHARS = 300  # a reason for a heartbeat, not a log: the whole of it is in the replica's log


class GeneratorActor(Actor[GeneratorConfig]):
    def __init__(self, ctx: ActorContext, config: GeneratorConfig) -> None:
        super().__init__(ctx, config)
        self.engine: Engine | None = None
        self._tokenizer: Any = None
        self._subscriber: WeightSubscriber | None = None
        self._in_flight = 0
        self._tokens = 0
        self._outbox: Outbox | None = None
        self._started = time.monotonic()
        self._refusal_logged: dict[str, float] = {}  # domain → when a refused prompt of it was last logged
        # prompts being generated: their ack timers kept reset (a slow or restarting server may take longer than
        # `bus.ack_wait_s`), and a redelivery of one (the keepalive lost) settled by the generation under way
        self._generating: InFlight[PromptMsg] = InFlight(ctx.bus.settings.ack_wait_s, on_failure=self._keepalive_failed)
        self._failure_logged = -_FAILURE_LOG_EVERY_S  # when a failed prompt was last logged (monotonic)
        self._failures_unlogged = 0  # prompts failed since then
        self._send_waiting = False  # a rollout's publish is being retried (the bus refused it or did not answer)
        self._server_waiting = False  # the engine's server is unavailable: prompts in flight wait for it
        self._has_learner = any(a.kind == "learner" for a in ctx.spec.actors.values())
        self._staging_root = ctx.run_dir / "weights-staged" / f"{ctx.actor}-{ctx.replica}"

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self._staging_root, True)  # an earlier life's
        self.engine, self._tokenizer = await self._build_engine()
        from actors.engines import TorchEngine

        if self.config.follow == "serving" and isinstance(self.engine, TorchEngine):
            self.engine.accepts_older = True  # the serving version moves back on a rollback
        self._subscriber = WeightSubscriber(
            self.ctx.bus,
            self.ctx.topology,
            self.engine,
            weight_transports(self.ctx),
            key=self.config.follow,
            log=self.ctx.log,
            on_event=lambda event, fields: self.ctx.counters.inc(event),
            served_key=served_key(self.ctx.actor, self.ctx.replica),
            # an SGLang or vLLM server reads a directory: the versions it loads are staged there
            staging=SafetensorsDirTransport(self._staging_root),
        )
        self.ctx.log.info(
            "generator.ready",
            engine=self.engine.name,
            max_batch_size=self.config.max_batch_size,
            waits_for_weights=self._has_learner,
        )

    async def _build_engine(self) -> tuple[Engine, Any]:
        if self.config.engine == "torch":
            from actors.engines import TorchEngine

            threads = self.ctx.threads
            engine = await asyncio.to_thread(
                TorchEngine.from_config,
                policy_of(self.ctx.spec),
                self.config,
                num_threads=threads,
                seed=1000 + self.ctx.replica,
            )
            return engine, engine.tokenizer
        spec_dir = self.ctx.spec.source_path.parent
        tokenizer = await asyncio.to_thread(load_tokenizer, policy_of(self.ctx.spec), spec_dir)
        url = self.config.url or ""
        options: dict[str, Any] = {
            "timeout_s": self.config.request_timeout_s,
            "update_timeout_s": self.config.weight_update_timeout_s,
            "api_key": self._api_key(),
        }
        http_engine: Any
        if self.config.engine == "sglang":
            from actors.engines import SGLangEngine

            http_engine = SGLangEngine(url, **options)
        else:
            from actors.engines import VLLMEngine

            http_engine = VLLMEngine(url, **options)
        await self._start_server_engine(http_engine)
        return http_engine, tokenizer

    def _key_refused(self, exc: EngineHTTPError) -> str:
        """What a 401/403 from the server means for this generator's settings, and which one to change."""
        setting = f"actors.{self.ctx.actor}.api_key_env"
        named = self.config.api_key_env
        fix = (
            f"the key in {named} ({setting}) is not one it takes"
            if named
            else f"it was started with --api-key: set {setting} to the environment variable that holds that key"
        )
        return f"the {self.config.engine} server at {self.config.url} refuses this generator (HTTP {exc.status}): {fix}"

    def _api_key(self) -> str | None:
        """The server's API key, from the environment variable ``api_key_env`` names (None when it names none)."""
        name = self.config.api_key_env
        if name is None:
            return None
        key = os.environ.get(name, "")
        if not key:
            raise RuntimeError(
                f"actors.{self.ctx.actor}.api_key_env names {name}, which is not set (or empty) in this generator's "
                f"environment: set it to the key the {self.config.engine} server at {self.config.url} was started with"
            )
        return key

    async def _start_server_engine(self, engine: Any) -> None:
        """Wait for the SGLang/vLLM server — a starting one loads its model for minutes — saying in the log what it
        waits for and why, every ``_SERVER_WAIT_LOG_S``, up to ``server_start_timeout_s``; then fail naming the url."""
        from actors.engines import EngineHTTPError

        started = time.monotonic()
        timeout_s = self.config.server_start_timeout_s
        while True:
            left = timeout_s - (time.monotonic() - started)
            try:
                await engine.start(health_timeout_s=max(0.5, min(_SERVER_WAIT_LOG_S, left)))
                break
            except EngineHTTPError as exc:
                if exc.status in _KEY_REFUSED:  # no wait mends a key: say which setting does, at once
                    raise RuntimeError(f"{self._key_refused(exc)} (at {exc.method} {exc.path})") from None
                waited = time.monotonic() - started
                if waited >= timeout_s:
                    raise RuntimeError(
                        f"no {engine.name} server answered at {engine.url} within {timeout_s:g}s "
                        f"(actors.{self.ctx.actor}.server_start_timeout_s): {exc.message}. Start the server there, "
                        f"or point actors.{self.ctx.actor}.url at it"
                    ) from None
                self.ctx.log.warning(
                    "generator.waiting_for_server",
                    engine=engine.name,
                    url=engine.url,
                    waited_s=round(waited),
                    last=exc.message,
                )
        served = _served_model(engine)
        wanted = policy_of(self.ctx.spec).model.removeprefix("hf:")
        if served and PurePath(served.rstrip("/")).name != PurePath(wanted.rstrip("/")).name:
            self.ctx.log.warning(
                "generator.model_mismatch",
                url=engine.url,
                server_model=served,
                policy_model=wanted,
                hint="the server must serve policy.model: the learner's versions will not load into another model",
            )

    async def run(self) -> None:
        assert self.engine is not None and self._subscriber is not None
        limit = anyio.CapacityLimiter(max(1, self.config.max_batch_size))
        channel_in = self.ctx.input_channel if self.ctx.consumes else None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_weights)
            tg.start_soon(self._report_loop)
            tg.start_soon(self._generating.keepalive)
            if self.config.serve:  # [gateway] answer gateway requests over NATS (actors.generator._serve)
                tg.start_soon(self._serve)
            if channel_in is None:  # serves users only (consumes: []): no training prompts to take
                await self.ctx.stopping.wait()
                tg.cancel_scope.cancel()
                return
            if self._has_learner:
                await self._wait_for_first_weights()
            # the work group closes before the consumer does, so every accepted prompt is acked (or nak'ed)
            # (and the outbox sends what they queued before the consumer closes)
            async with (
                self.ctx.bus.consume(
                    channel_in, self.ctx.actor, model=PromptMsg, batch=self.config.max_batch_size
                ) as prompts,
                Outbox(self.ctx.bus, source=self._who()) as outbox,
                anyio.create_task_group() as work,
            ):
                self._outbox = outbox
                async for delivery in iterate_until(prompts, self.ctx.stopping):
                    if delivery.payload.domain not in domains_of(self.ctx.spec):
                        await self._drop_removed(delivery)
                        continue
                    if not self._generating.begin(delivery):  # redelivered while being generated: that one settles it
                        self.ctx.counters.inc("redelivered_while_generating")
                        continue
                    slots = min(delivery.payload.group_size, self.config.max_batch_size)
                    for index in range(slots):
                        await limit.acquire_on_behalf_of(_token(delivery, index))
                    work.start_soon(self._handle, delivery, limit, slots, outbox)
            tg.cancel_scope.cancel()

    async def drain(self) -> None:
        # run() only returns after its work group finished every accepted prompt, so nothing is in flight here.
        self.ctx.log.info("generator.drained", tokens=self._tokens)

    async def stop(self) -> None:
        if self.engine is not None:
            await self.engine.close()
        await asyncio.to_thread(shutil.rmtree, self._staging_root, True)

    def report(self) -> dict[str, Any]:
        counters: dict[str, Any] = dict(self.ctx.counters.snapshot())
        counters["follow"] = self.config.follow  # the live view: a serving generator is not a training one behind
        failing = self._subscriber.failing if self._subscriber is not None else ""
        if failing:  # the live view and `flywheel status` say why this generator is behind, not only that it is
            counters["weights_error"] = failing[:_WEIGHTS_ERROR_CHARS]
        return counters

    # ------------------------------------------------------------------ work
    async def _wait_for_first_weights(self) -> None:
        assert self.engine is not None
        waited = 0.0
        while self.engine.version == 0 and not self.ctx.stopping.is_set():
            await asyncio.sleep(0.2)
            waited += 0.2
            if waited in (10.0, 60.0):
                self.ctx.log.info("generator.waiting_for_weights", waited_s=waited)

    async def _serve(self) -> None:
        """Answer the gateway's requests — once there are weights worth answering with: a builtin model without a
        checkpoint starts from random weights, which the learner's warm start and first version replace, and users
        get "no generator serving" (503, /healthz not ok) until then, not gibberish from v0. A pretrained (hf:) model
        or a checkpoint serves at once."""
        from actors.generator._serve import default_max_in_flight, serve

        assert self.engine is not None
        policy = policy_of(self.ctx.spec)
        if self._has_learner and policy.model.startswith("builtin:") and not policy.checkpoint:
            await self._wait_for_first_weights()
        await serve(self.ctx, self.engine, max_in_flight=default_max_in_flight(self.config.max_batch_size))

    async def _watch_weights(self) -> None:
        assert self._subscriber is not None
        await self._subscriber.run()

    async def _handle(
        self, delivery: Delivery[PromptMsg], limit: anyio.CapacityLimiter, slots: int, outbox: Outbox
    ) -> None:
        assert self.engine is not None
        msg = delivery.payload
        try:
            self._in_flight += 1
            started = time.perf_counter()
            completions = await self._generate(msg, self._requests(delivery.id, msg))
            rollout = self._rollout(msg, completions, time.perf_counter() - started)
            await self._send(outbox, delivery, rollout.model_dump(mode="json"))
            self.ctx.counters.inc("prompts")
            self.ctx.counters.inc("completions", len(completions))
            generated = sum(len(c.token_ids) for c in completions)
            self._tokens += generated
            self.ctx.counters.inc("tokens", generated)
        except RequestError as exc:  # the prompt itself can never be served (too long for the context): no retries
            self.ctx.counters.inc(f"prompts_refused.{msg.domain}")
            now = time.monotonic()
            if now - self._refusal_logged.get(msg.domain, -_REFUSAL_LOG_EVERY_S) >= _REFUSAL_LOG_EVERY_S:
                self._refusal_logged[msg.domain] = now  # each is counted; a task drawn again and again is logged
                self.ctx.log.warning("generator.prompt_refused", task_id=msg.task_id, domain=msg.domain, error=str(exc))
            await self._generating.newest(delivery).dead_letter(f"prompt refused by the engine: {exc}")
        except Exception as exc:  # an engine or bus failure: give the prompt back for another try
            self.ctx.counters.inc("errors")
            self._failed(msg, exc)
            await self._generating.newest(delivery).nak(delay_s=_RETRY_S)
        finally:
            self._generating.end(delivery.id)
            self._in_flight -= 1
            for index in range(slots):
                limit.release_on_behalf_of(_token(delivery, index))

    async def _drop_removed(self, delivery: Delivery[PromptMsg]) -> None:
        """Ack a prompt of a domain removed from the spec since it was drawn (a resume with an edited spec): nothing
        downstream would score or train it. Counted, logged at the first."""
        await delivery.ack()
        count_removed_domain(self.ctx, delivery.payload.domain, "prompts")

    def _keepalive_failed(self, exc: Exception) -> None:
        self.ctx.log.warning("generator.keepalive_failed", error=str(exc))

    async def _generate(self, msg: PromptMsg, requests: list[GenerationRequest]) -> list[Completion]:
        """The engine's completions. A server that does not answer, or answers 5xx or 429 (down, restarting, loading a
        model, paused by a weight update that hangs) is waited out, the prompt kept alive: given back to the bus
        instead, every prompt in flight was dead-lettered as poison on its fifth delivery, about 12 s into an
        outage, while an SGLang or vLLM server takes minutes to load a model. A 401/403 (the server's API key changed
        under a running generator) is waited out alike, its log line naming the setting. At a stop the error goes to
        the caller (the prompt is given back)."""
        assert self.engine is not None
        while True:
            try:
                completions = await self.engine.generate(requests)
            except EngineHTTPError as exc:
                refused = exc.status in _KEY_REFUSED  # the server's key changed under a running generator
                if self.ctx.stopping.is_set() or not (_unavailable(exc) or refused):
                    raise
                self.ctx.counters.inc("server_waits")
                if not self._server_waiting:  # once per outage: every prompt in flight waits alike
                    error = self._key_refused(exc) if refused else str(exc)
                    self.ctx.log.warning("generator.server_unavailable", error=error, retry_s=_RETRY_S)
                self._server_waiting = True
                with anyio.move_on_after(_RETRY_S):
                    await self.ctx.stopping.wait()
                continue
            if self._server_waiting:
                self._server_waiting = False
                self.ctx.log.info("generator.server_back", task_id=msg.task_id)
            return completions

    async def _send(self, outbox: Outbox, delivery: Delivery[PromptMsg], rollout: dict[str, Any]) -> None:
        """Publish the rollout, then ack its prompt. A publish the bus refuses (its storage budget reached, a full
        disk) or does not answer is tried again every ``_RETRY_S`` with the same rollout, the prompt kept alive
        meanwhile: given back instead, a healthy prompt was dead-lettered as poison on its fifth delivery, and its
        completions generated again each time. At a stop the prompt is given back (the caller naks it)."""
        while True:
            try:
                await outbox.send(
                    self._out_channel(),
                    "rollout",
                    rollout,
                    id=f"{delivery.id}.r",
                    delivery=self._generating.newest(delivery),  # the newest delivery, if it was redelivered
                )
            except BUS_AWAY as exc:
                if self.ctx.stopping.is_set():
                    raise
                self.ctx.counters.inc("rollout_send_waits")
                if not self._send_waiting:  # once per outage: every prompt in flight waits alike
                    self.ctx.log.warning("generator.rollout_not_stored", error=f"{type(exc).__name__}: {exc}")
                self._send_waiting = True
                with anyio.move_on_after(_RETRY_S):
                    await self.ctx.stopping.wait()
                continue
            self._send_waiting = False
            return

    def _failed(self, msg: PromptMsg, exc: Exception) -> None:
        """Log a prompt that failed (a server down makes every prompt in flight fail, and fail again on each retry):
        the first, then at most once per ``_FAILURE_LOG_EVERY_S`` with how many failed since the last line."""
        self._failures_unlogged += 1
        now = time.monotonic()
        if now - self._failure_logged < _FAILURE_LOG_EVERY_S:
            return
        self.ctx.log.warning(
            "generator.prompt_failed",
            task_id=msg.task_id,
            error=f"{type(exc).__name__}: {exc}",
            failed=self._failures_unlogged,
            retry_s=_RETRY_S,
            note=f"each failed prompt goes back to the bus; logged at most every {_FAILURE_LOG_EVERY_S:g} s",
        )
        self._failure_logged, self._failures_unlogged = now, 0

    def _requests(self, message_id: str, msg: PromptMsg) -> list[GenerationRequest]:
        prompt_ids = tuple(encode_prompt(self._tokenizer, msg.prompt))
        params = SamplingParams(
            max_new_tokens=self._max_new_tokens(msg.domain),
            temperature=self.config.temperature if msg.temperature is None else msg.temperature,
            top_p=self.config.top_p,
            top_k=self.config.top_k,
        )
        return [GenerationRequest(f"{message_id}.{i}", prompt_ids, params) for i in range(msg.group_size)]

    def _max_new_tokens(self, domain: str) -> int:
        domain_spec = domains_of(self.ctx.spec).get(domain)
        wanted = getattr(domain_spec, "max_new_tokens", None) or _DEFAULT_MAX_NEW_TOKENS
        return min(wanted, self.config.max_new_tokens) if self.config.max_new_tokens else wanted

    def _rollout(self, msg: PromptMsg, completions: list[Completion], generate_s: float) -> RolloutMsg:
        temperature = self.config.temperature if msg.temperature is None else msg.temperature
        return RolloutMsg(
            task_id=msg.task_id,
            domain=msg.domain,
            prompt=msg.prompt,
            prompt_ids=list(completions[0].prompt_ids),
            verifier_fields=msg.verifier_fields,
            heldout=msg.heldout,
            temperature=temperature,
            generator=self._who(),
            generate_s=generate_s,
            reference=msg.reference,
            completions=[
                CompletionRecord(
                    text=c.text,
                    token_ids=list(c.token_ids),
                    logprobs=list(c.logprobs),
                    versions=list(c.versions),
                    finish_reason=c.finish_reason,
                )
                for c in completions
            ],
        )

    def _out_channel(self) -> str:
        return self.ctx.output_channel("rollouts")

    def _who(self) -> str:
        return self.ctx.replica_id

    async def _report_loop(self) -> None:
        last_tokens, last_t = 0, time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            self.ctx.counters.set("tokens_per_s", round((self._tokens - last_tokens) / max(now - last_t, 1e-6), 1))
            last_tokens, last_t = self._tokens, now
            self.ctx.counters.set("in_flight_prompts", self._in_flight)
            if self._outbox is not None and self._outbox.per_batch is not None:  # rollouts per publish batch
                self.ctx.counters.set("outbox_batch", self._outbox.per_batch)
            if self.engine is not None:
                self.ctx.counters.set("version", self.engine.version)
                stats = getattr(self.engine, "stats", None)
                if callable(stats):
                    engine_stats = stats()
                    # cache_rebuilds and prefill_tokens (rebuilds included) vs tokens: what weight swaps cost
                    for key in (
                        "mean_batch_occupancy",
                        "steps_per_call",
                        "queue_depth",
                        "running",
                        "weight_updates_rejected",
                        "cache_rebuilds",
                        "prefill_tokens",
                    ):
                        if key in engine_stats:
                            self.ctx.counters.set(key, float(engine_stats[key]))


def _served_model(engine: Any) -> str:
    """The model the server says it serves: SGLang's ``model_path``, vLLM's served model name ("" if unknown)."""
    info = getattr(engine, "server_info", None)
    if isinstance(info, dict) and info.get("model_path"):
        return str(info["model_path"])
    return str(getattr(engine, "model", None) or "")


def _token(delivery: Delivery[PromptMsg], index: int) -> tuple[str, int]:
    return (delivery.id, index)


def _unavailable(exc: EngineHTTPError) -> bool:
    """The server is down or busy, not the prompt at fault: no answer, a 5xx, or 429 (too many requests)."""
    return exc.status is None or exc.status >= 500 or exc.status == 429
