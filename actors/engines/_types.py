"""Engine-facing data types: sampling parameters, requests, completions, and the protocols.

Contract: plain frozen dataclasses and ``typing.Protocol`` classes, importable without torch (the
spec/config layer and the gateway import this module). Every engine — the builtin torch engine, the
SGLang/vLLM HTTP clients, the in-memory fake — takes :class:`GenerationRequest` and returns
:class:`Completion` with one behavior logprob and one weight version per generated token.

Logprob semantics (see ``_torch_engine`` for the full argument):

* ``Completion.logprobs`` — ``log μ_t``: the log-probability of the sampled token under the exact
  distribution it was drawn from, i.e. after temperature, top-k and top-p filtering and renormalisation.
  Greedy decoding (``temperature == 0``) and ``top_k == 1`` draw from a point mass, so the value is ``0.0``.
* ``Completion.unfiltered_logprobs`` — ``log softmax(logits / T)`` at the sampled token with no
  top-k/top-p filtering (``T = 1`` for greedy). This is exactly what the learner's forward pass computes
  with the same temperature, so it is the number to compare against the learner to measure
  train/inference numerical mismatch. With ``top_k == 0`` and ``top_p == 1`` both fields are identical.

Non-goals: no tensors here, no validation of token ids against a vocabulary (engines do that).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


class WeightUpdateError(RuntimeError):
    """A weight payload was rejected; the engine keeps serving the version it had."""


class EngineClosedError(RuntimeError):
    """The engine was closed while a request was waiting or running."""


class UnsupportedServerError(RuntimeError):
    """An inference server lacks what a call needs — an older release, or one not started in the mode the call needs:
    trying again fails the same way until the server is replaced. The message says what it needs."""


class RequestError(ValueError):
    """A request this engine can never serve as made — its prompt is empty, holds a token outside the vocabulary, or
    leaves no room in the model's context: trying it again fails the same way."""


_TUPLE_FIELDS = frozenset({"stop", "stop_token_ids"})


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion."""

    max_new_tokens: int = 64  # >= 1; the completion stops with finish_reason "length" after this many
    temperature: float = 1.0  # 0 = greedy (argmax); otherwise logits are divided by it before softmax
    top_p: float = 1.0  # nucleus sampling: keep the smallest prefix of tokens whose mass reaches top_p
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    stop: tuple[str, ...] = ()  # stop when the decoded completion ends with one of these (kept in text)
    stop_token_ids: tuple[int, ...] = ()  # stop after sampling one of these (kept in token_ids)
    ignore_eos: bool = False  # keep going past the tokenizer's eos token
    seed: int | None = None  # per-request RNG seed: same seed + same weights ⇒ same tokens

    def to_wire(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples as lists): how the serve protocol carries sampling parameters."""
        # getattr per field, not dataclasses.asdict: asdict deep-copies, and this runs once per served request
        return {name: list(getattr(self, name)) if name in _TUPLE_FIELDS else getattr(self, name) for name in _NAMES}

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> SamplingParams:
        """The inverse of `to_wire`. Unknown keys are ignored (a newer sender may send more); bad values raise
        ``ValueError``."""
        fields: dict[str, Any] = {k: tuple(v) if k in _TUPLE_FIELDS else v for k, v in raw.items() if k in _NAMES}
        try:
            return cls(**fields)
        except TypeError as exc:
            raise ValueError(str(exc)) from None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if any(s == "" for s in self.stop):
            raise ValueError("stop strings must be non-empty")


_NAMES = tuple(f.name for f in dataclasses.fields(SamplingParams))  # the wire's keys, in field order


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True)
class Completion:
    request_id: str
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # behavior logprob log μ_t of each sampled token (filtered distribution)
    versions: tuple[int, ...]  # weight version that produced each token
    text: str  # tokenizer.decode(token_ids): special tokens skipped, a matched stop string included
    finish_reason: FinishReason
    # log softmax(logits / T) of each sampled token before top-k/top-p; () when an engine cannot provide it
    unfiltered_logprobs: tuple[float, ...] = ()


@runtime_checkable
class Tokenizer(Protocol):
    bos_id: int | None
    eos_id: int
    pad_id: int
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


# What update_weights accepts. The torch engine takes an in-memory ``name -> torch.Tensor`` mapping or
# a path (str) to a .safetensors file / a directory of them; other transports are added by the weights
# package. Typed loosely here so that this module needs no torch.
WeightSource = Mapping[str, Any] | str


class Engine(Protocol):
    name: str

    @property
    def version(self) -> int: ...

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]: ...

    async def update_weights(self, version: int, source: WeightSource) -> None: ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def close(self) -> None: ...
