"""Tokenizers behind one small protocol (``actors.generator.Tokenizer``).

* :class:`CharTokenizer` — the builtin tiny GPT's fixed character vocabulary: four special tokens
  (``<pad>`` ``<bos>`` ``<eos>`` ``<unk>``), then ``\\n``, ``\\t`` and printable ASCII (0x20–0x7e);
  101 ids in all, identical in every process, so no vocabulary file ever has to travel with weights.
  Characters outside the vocabulary encode to ``<unk>`` (and decode to ``"?"``).
* :class:`HFTokenizer` — an adapter over a Hugging Face ``PreTrainedTokenizerBase``.

Contract: ``encode`` adds no special tokens (callers add ``bos`` if they want it); ``decode`` skips
special tokens, so an ``eos`` kept in a completion's token ids does not show up in its text.
Non-goals: chat templates, byte fallback, normalisation.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
_CHARS = "\n\t" + "".join(chr(c) for c in range(0x20, 0x7F))
assert set(_CHARS) >= set(string.printable) - {"\r", "\x0b", "\x0c"}


class CharTokenizer:
    """Fixed character-level vocabulary; see the module docstring for the layout."""

    pad_id: int = 0
    bos_id: int | None = 1
    eos_id: int = 2
    unk_id: int = 3

    def __init__(self) -> None:
        self._itos: list[str] = [*SPECIAL_TOKENS, *_CHARS]
        self._stoi: dict[str, int] = {ch: i for i, ch in enumerate(self._itos) if i >= len(SPECIAL_TOKENS)}
        self.vocab_size: int = len(self._itos)

    def encode(self, text: str) -> list[int]:
        stoi, unk = self._stoi, self.unk_id
        return [stoi.get(ch, unk) for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        n_special, itos = len(SPECIAL_TOKENS), self._itos
        out: list[str] = []
        for i in ids:
            if i == self.unk_id:
                out.append("?")
            elif n_special <= i < len(itos):
                out.append(itos[i])
        return "".join(out)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


class HFTokenizer:
    """Adapter over a transformers tokenizer. ``pad_id`` falls back to ``eos_id`` when the tokenizer has none."""

    def __init__(self, tokenizer: Any) -> None:
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the Hugging Face tokenizer defines no eos token (set eos_token in its config)")
        self.hf: Any = tokenizer
        self.eos_id: int = int(eos)
        pad = tokenizer.pad_token_id
        self.pad_id: int = int(pad) if pad is not None else self.eos_id
        bos = tokenizer.bos_token_id
        self.bos_id: int | None = int(bos) if bos is not None else None
        self.vocab_size: int = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.hf.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=True))

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.hf).__name__}, vocab_size={self.vocab_size})"
