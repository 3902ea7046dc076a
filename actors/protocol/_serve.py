"""The serve protocol: how the gateway asks a serving generator for a completion, over core NATS request/reply.

Protocol (orjson objects; ``v`` = :data:`SERVE_PROTOCOL_VERSION`):

* Subject ``fw.<topology>.eph.serve`` (:func:`serve_subject`), queue group :data:`SERVE_QUEUE`: NATS hands
  each request to one subscribed generator replica, which balances the replicas. Core NATS, not JetStream:
  a request is answered now or not at all; nothing is stored.
* Request (published with a reply subject): ``{v, request_id, prompt_ids: [int], params: {SamplingParams
  fields; stop / stop_token_ids as lists}, stream: bool}``.
* Replies, all to the request's reply subject:
  ``{type: "busy", retry_after_s}`` — this replica already has ``max_in_flight`` serve requests or its
  engine queue is full; sent at once, nothing was started (the gateway may try another replica, then 429).
  ``{type: "error", status: 400|500, message}`` — bad parameters (400) or an engine failure (500).
  ``{type: "delta", token_ids: [int]}`` — streaming only: tokens as the engine samples them (a torch engine
  sends one per decode step; SGLang/vLLM engines have no token stream and send none — the final message
  carries everything).
  ``{type: "final", token_ids, logprobs, versions, text, finish_reason, generator}`` — always last.
* Cancel: ``{v, request_id}`` published (no reply) on ``fw.<topology>.eph.serve-cancel`` (:func:`cancel_subject`),
  which every serving replica subscribes to (no queue group: the gateway does not know which replica took the
  request). The replica running that request cancels it — the engine drops the row at its next step boundary
  — and sends nothing more for it; a replica that does not have it remembers the id for a while, so a cancel
  that overtakes its request (they travel on different subscriptions) still stops it. The gateway sends one
  when its client disconnected, when ``request_timeout_s`` ran out, or when it gave up the call for any other
  reason before the ``final`` message.
* Health: a request on ``fw.<topology>.eph.serve-ping`` (:func:`ping_subject`, same queue group) is
  answered ``{type: "pong", generator, version, in_flight, max_in_flight}`` even when the replica is busy.
* A generator that is stopping unsubscribes (new requests go to its siblings), answers what it accepted,
  and sends ``{type: "error", status: 503}`` for a request it cannot finish.

The generator's side is `actors.generator._serve`, the gateway's `actors.gateway._client`; sampling parameters
travel as ``SamplingParams.to_wire()`` and are read back with ``SamplingParams.from_wire``.

Non-goals: fairness between gateway traffic and training prompts beyond the engine's FIFO admission, persistence
of anything.
"""

from __future__ import annotations

from topology import ephemeral_subject

__all__ = ["SERVE_PROTOCOL_VERSION", "SERVE_QUEUE", "cancel_subject", "ping_subject", "serve_subject"]

SERVE_PROTOCOL_VERSION = 1
SERVE_QUEUE = "generators"  # the queue group every serving replica joins: NATS hands each request to one


def serve_subject(topology: str) -> str:
    """Core NATS subject the gateway sends requests to (the bus's ephemeral namespace)."""
    return ephemeral_subject(topology, "serve")


def cancel_subject(topology: str) -> str:
    """Core NATS subject of cancels (every serving replica hears each one)."""
    return ephemeral_subject(topology, "serve-cancel")


def ping_subject(topology: str) -> str:
    """Core NATS subject of the health ping (one serving replica answers)."""
    return ephemeral_subject(topology, "serve-ping")
