"""Tokenizers behind one small protocol (``actors.generator.Tokenizer``).

* :class:`CharTokenizer` — the builtin tiny GPT's fixed character vocabulary: four special tokens
  (``<pad>`` ``<bos>`` ``<eos>`` ``<unk>``), then ``\\n``, ``\\t`` and printable ASCII (0x20–0x7e);
  101 ids in all, identical in every process, so no vocabulary file ever has to travel with weights.
  Characters outside the vocabulary encode to ``<unk>`` (and decode to ``"?"``).
* :class:`HFTokenizer` — an adapter over a Hugging Face ``PreTrainedTokenizerBase``.
* :func:`load_tokenizer` — a spec's policy's tokenizer without its weights (``policy.tokenizer``, else the model's).

Contract: ``encode`` adds no special tokens (callers add ``bos`` if they want it); ``decode`` skips
special tokens, so an ``eos`` kept in a completion's token ids does not show up in its text.
Non-goals: chat templates, byte fallback, normalisation.
"""

from __future__ import annotations

import string
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
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


# One Hugging Face load at a time per process (models and tokenizers): transformers resolves its top-level names
# lazily (two threads asking for the first one see "module 'transformers' has no attribute ...") and from_pretrained
# builds a model on the meta device by patching torch process-wide (a load beside another one gets meta tensors).
# ``--single-process`` runs the learner, the generators and the gateway in one process, each loading in a thread.
HF_LOAD_LOCK = threading.RLock()


def load_hf_tokenizer(path: str | Path, field: str = "policy.model") -> HFTokenizer:
    """The Hugging Face tokenizer in a local directory or a hub id in this machine's cache (never downloaded);
    errors are one-line ``ValueError``s that start with ``field``, the spec key that named it."""
    from actors.policy._hub import model_directory

    directory = model_directory(path, field)
    try:
        import transformers
    except ImportError as exc:
        raise ValueError(f"{field}: hf models need the 'hf' extra (pip install 'flywheel[hf]')") from exc
    try:
        with HF_LOAD_LOCK:
            return HFTokenizer(transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True))
    except (OSError, ValueError, KeyError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{field}: cannot load a tokenizer from {str(directory)!r}: {first_line}") from None


def load_tokenizer(policy_spec: Any, base_dir: Path | None = None) -> CharTokenizer | HFTokenizer:
    """The tokenizer of a spec's ``policy`` (a mapping or an object with ``model`` and ``tokenizer``) without its
    weights: ``policy.tokenizer`` when set, else the model's own (the builtin character tokenizer, or the ``hf:``
    model's). A relative path that is not there as written is looked up under ``base_dir`` (the spec's folder; the
    spec check already made the paths it could resolve absolute)."""
    model = str(spec_field(policy_spec, "model") or "builtin:tiny-gpt")
    tokenizer = spec_field(policy_spec, "tokenizer")
    if model.startswith("builtin:"):
        if tokenizer:
            raise ValueError(f"policy.tokenizer: builtin models have their own character tokenizer, got {tokenizer!r}")
        return CharTokenizer()
    if not model.startswith("hf:"):
        raise ValueError(f"policy.model: expected 'builtin:tiny-gpt' or 'hf:<model dir>', got {model!r}")
    field, given = ("policy.tokenizer", str(tokenizer)) if tokenizer else ("policy.model", model[3:])
    path = Path(given).expanduser()
    if base_dir is not None and not path.is_absolute() and not path.exists() and (base_dir / path).exists():
        path = base_dir / path
    return load_hf_tokenizer(path, field)


def spec_field(spec: Any, name: str, default: Any = None) -> Any:
    """``spec[name]`` of a mapping, else ``spec.name``; ``default`` when absent."""
    return spec.get(name, default) if isinstance(spec, Mapping) else getattr(spec, name, default)
