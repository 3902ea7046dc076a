"""What gives a Hugging Face tokenizer's ids their meaning, read from its files (light: no torch, no transformers).

Contract: :func:`vocabulary_hash` is a hash of a tokenizer directory's vocabulary — each id's token string and the
ids of its special tokens (bos, eos, pad, unk, sep, cls, mask) — or None when the directory holds no tokenizer
file it can read. The ids come from ``tokenizer.json`` (its model's vocabulary and its added tokens: what a fast
tokenizer loads) when there is one, else from the slow tokenizer's files (``vocab.json``, ``vocab.txt``, or a
sentencepiece model's bytes), with the added tokens of ``added_tokens.json`` and of ``tokenizer_config.json``'s
``added_tokens_decoder`` over them; the special tokens are named in ``tokenizer_config.json`` or
``special_tokens_map.json`` (a string, or a token's ``content``) and resolved to their ids. Reading a tokenizer.json
of a few MB takes milliseconds; nothing is loaded.

What a re-save by another transformers rewrites is not hashed: the file layout and formatting, which of the
bookkeeping files it writes (``special_tokens_map.json``, ``added_tokens_decoder``), ``tokenizer_class``,
``model_max_length``, the merges' format. Neither is how text is split into tokens (merges, normalizer,
pre-tokenizer, post-processor, chat template): the same ids still stand for the same strings.

Non-goals: telling apart two sentencepiece-only tokenizers by anything but their ``*.model`` file's bytes (a slow
tokenizer saved again as a fast one, with a tokenizer.json, reads as another tokenizer).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

__all__ = ["vocabulary_hash"]

# the special tokens a tokenizer names, in tokenizer_config.json or special_tokens_map.json
_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_SENTENCEPIECE = ("tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "sentencepiece.model")


def vocabulary_hash(directory: Path) -> str | None:
    """A hash of the vocabulary of the tokenizer in ``directory`` (see the module docstring), or None."""
    try:
        ids, model_bytes = _base_vocabulary(directory)
        if ids is None and model_bytes is None:
            return None
        ids = dict(ids or {})
        config = _json(directory / "tokenizer_config.json")
        for id_, token in (config.get("added_tokens_decoder") or {}).items():
            content = _content(token)
            if content is not None:
                ids[int(id_)] = content
        for token, id_ in _json(directory / "added_tokens.json").items():
            ids[int(id_)] = str(token)
        named = {**config, **_json(directory / "special_tokens_map.json")}
    except (OSError, ValueError, TypeError, AttributeError, LookupError):  # files it cannot read: nothing recorded
        return None
    by_token: dict[str, int] = {}
    for id_ in sorted(ids):
        by_token.setdefault(ids[id_], id_)
    special: dict[str, Any] = {}
    for name in _SPECIAL:
        token = _content(named.get(name))
        if token is not None:
            special[name] = by_token.get(token, token)  # a token not in the vocabulary: its string
    digest = hashlib.sha256(orjson.dumps({"ids": sorted(ids.items()), "special": special}))
    if model_bytes is not None:
        digest.update(hashlib.sha256(model_bytes).digest())
    return digest.hexdigest()[:16]


def _base_vocabulary(directory: Path) -> tuple[dict[int, str] | None, bytes | None]:
    """id → token of the tokenizer's own vocabulary, and the sentencepiece model's bytes where that is what holds it."""
    fast = directory / "tokenizer.json"
    if fast.is_file():
        data = orjson.loads(fast.read_bytes())
        vocab = (data.get("model") or {}).get("vocab") or {}
        if isinstance(vocab, Mapping):  # BPE, WordPiece, WordLevel: token → id
            ids = {int(id_): str(token) for token, id_ in vocab.items()}
        else:  # Unigram: [token, score] by id
            ids = {id_: str(entry[0]) for id_, entry in enumerate(vocab)}
        for added in data.get("added_tokens") or []:
            ids[int(added["id"])] = str(added["content"])
        return ids, None
    if (directory / "vocab.json").is_file():
        return {int(id_): str(token) for token, id_ in _json(directory / "vocab.json").items()}, None
    if (directory / "vocab.txt").is_file():
        lines = (directory / "vocab.txt").read_text(encoding="utf-8").split("\n")
        return {id_: token for id_, token in enumerate(lines[:-1] if lines[-1] == "" else lines)}, None
    for name in _SENTENCEPIECE:
        if (directory / name).is_file():
            return None, (directory / name).read_bytes()
    return None, None


def _json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; empty when there is no such file."""
    if not path.is_file():
        return {}
    data = orjson.loads(path.read_bytes())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _content(token: Any) -> str | None:
    """A special or added token's string: itself, or an AddedToken's ``content``; None when it names none."""
    if isinstance(token, Mapping):
        token = token.get("content")
    return token if isinstance(token, str) else None
