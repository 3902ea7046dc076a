"""One way to turn a prompt into token ids, shared by the generators, the warm start and the learner.

A prompt is ``[bos] + encode(text)`` when the tokenizer has a bos token, else ``encode(text)``; a completion
ends with ``eos``. Everything that scores or trains on a completion must rebuild exactly these ids, so the
rule lives here once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class _Tokenizer(Protocol):
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]: ...


def encode_prompt(tokenizer: _Tokenizer, text: str) -> list[int]:
    ids = tokenizer.encode(text)
    return [tokenizer.bos_id, *ids] if tokenizer.bos_id is not None else ids


def encode_completion(tokenizer: _Tokenizer, text: str) -> list[int]:
    """A reference answer as the completion the policy should produce (for the supervised warm start)."""
    return [*tokenizer.encode(text), tokenizer.eos_id]


def strip_eos(tokenizer: _Tokenizer, ids: Sequence[int]) -> list[int]:
    return list(ids[:-1]) if ids and ids[-1] == tokenizer.eos_id else list(ids)
