"""Tiny local Hugging Face model directories for tests and demos — built from a config, nothing downloaded.

Contract: :func:`write_tiny_hf_model` writes ``config.json``, ``model.safetensors`` and a character-level
``PreTrainedTokenizerFast`` (``<pad>`` = 0, ``<eos>`` = 1, then letters, digits, space and ``+-=?.,:\\n``)
into a directory that ``Policy.from_spec({"model": "hf:<dir>"})`` loads with ``local_files_only``.
Non-goals: realistic tokenizers (no merges, unknown characters map to ``<pad>``), trained weights.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any, Literal

import torch

HF_CHARS = string.ascii_letters + string.digits + " +-=?.,:\n"


def write_tiny_hf_model(
    path: str | Path,
    *,
    arch: Literal["gpt2", "llama"] = "gpt2",
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    max_positions: int = 256,
    seed: int = 0,
    bos: bool = False,
) -> Path:
    """Write a randomly initialised tiny causal LM plus its tokenizer to ``path``; return the path.

    The tokenizer is character level (``HF_CHARS``); ``bos=True`` gives it a ``<bos>`` token that every prompt
    starts with (``actors.policy._prompting.encode_prompt``), as many real tokenizers do.
    """
    import transformers as _transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    transformers: Any = _transformers  # transformers is only partly typed

    transformers.utils.logging.disable_progress_bar()
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<eos>": 1, **({"<bos>": 2} if bos else {})}
    for ch in HF_CHARS:
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", **({"bos_token": "<bos>"} if bos else {})
    )
    bos_id = 2 if bos else 1
    tokenizer.save_pretrained(str(directory))

    config: Any
    if arch == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=len(vocab),
            n_positions=max_positions,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            bos_token_id=bos_id,
            eos_token_id=1,
            pad_token_id=0,
        )
    else:
        config = transformers.LlamaConfig(
            vocab_size=len(vocab),
            hidden_size=n_embd,
            intermediate_size=4 * n_embd,
            num_hidden_layers=n_layer,
            num_attention_heads=n_head,
            num_key_value_heads=max(1, n_head // 2),
            max_position_embeddings=max_positions,
            bos_token_id=bos_id,
            eos_token_id=1,
            pad_token_id=0,
            tie_word_embeddings=False,
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(directory))
    return directory
