"""Loading a local Hugging Face causal LM, and calling it with the builtin model's forward contract.

Contract: :func:`load_hf` reads a model directory with ``local_files_only=True`` — nothing is ever
downloaded. A hub id (``Qwen/Qwen2.5-1.5B-Instruct``) that is no directory here is looked up in the local Hugging
Face cache (where ``huggingface-cli download`` puts it; ``HF_HOME``/``HF_HUB_CACHE`` move it); a model in neither
place, or one transformers cannot read, is a one-line ``ValueError`` that says which.
:class:`HFCausalLM` wraps the model so that ``forward(input_ids, attention_mask, position_ids, cache,
use_cache)`` behaves like :class:`~actors.policy._tiny_gpt.TinyGPT`'s: the cache is a list of per-layer
``(keys, values)`` tensors ``[B, heads, past, head_dim]`` (converted to and from transformers'
``DynamicCache`` around each call), and position ids are passed explicitly (GPT-2's absolute positions
otherwise count left padding). GPT-2 models in eval mode skip transformers' module
stack for the same computation written out in ``_gpt2`` (faster at CPU sizes);
``native=False`` (spec: ``policy.config.native_forward: false``) keeps transformers' forward throughout.

Non-goals: sliding-window or hybrid caches (Mistral/Gemma-style layers are treated as full attention),
remote code, quantised weights, tensor parallelism.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from actors.policy._gpt2 import gpt2_forward, native_gpt2_unsupported
from actors.policy._hub import model_directory
from actors.policy._tiny_gpt import KVCache, positions_from_mask
from actors.policy._tokenizer import HF_LOAD_LOCK, HFTokenizer, load_hf_tokenizer


class HFCausalLM(nn.Module):
    def __init__(self, model: Any, *, native: bool = True) -> None:
        super().__init__()
        self.hf = model
        # GPT-2 models run through flywheel's own forward over the same parameters (``_gpt2``), unless
        # ``native`` is off or the config has a feature that forward does not implement.
        self.native_unsupported = "turned off" if not native else native_gpt2_unsupported(model)
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed `past_key_values` to `cache`.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        config = model.config
        self.max_context: int = int(
            getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048
        )
        self.vocab_size: int = int(model.get_output_embeddings().weight.shape[0])

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool = False,
    ) -> tuple[Tensor, KVCache | None]:
        length = input_ids.shape[1]
        if attention_mask is None:
            past = 0 if cache is None else cache[0][0].shape[2]
            attention_mask = torch.ones(input_ids.shape[0], past + length, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask, length)
        if self.native_unsupported is None and not self.hf.training:  # the native forward has no dropout
            return gpt2_forward(self.hf, input_ids, attention_mask, position_ids, cache, use_cache)
        from transformers import DynamicCache

        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask.long(),
            "position_ids": position_ids,
            "use_cache": use_cache,
        }
        if cache is not None:
            kwargs[self._cache_kw] = DynamicCache(cache)
        elif use_cache:
            kwargs[self._cache_kw] = DynamicCache()
        out = self.hf(**kwargs)
        logits: Tensor = out.logits
        if not use_cache:
            return logits, None
        returned = getattr(out, "cache", None)
        if returned is None:
            returned = out.past_key_values
        return logits, _cache_to_list(returned)


def _cache_to_list(cache: Any) -> KVCache:
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return [(k, v) for k, v in cache.to_legacy_cache()]


def load_hf(
    path: str | Path, *, dtype: torch.dtype | None = None, native: bool = True, tokenizer_path: str | Path | None = None
) -> tuple[HFCausalLM, HFTokenizer]:
    """Load model and tokenizer from a local directory (``config.json`` + weights + tokenizer files), the tokenizer
    from ``tokenizer_path`` when given (``policy.tokenizer``); ``native`` lets GPT-2 models run through flywheel's
    own forward (see :class:`HFCausalLM`). Safe to call from several threads at once (they load one after another)."""
    with HF_LOAD_LOCK:
        return _load_hf(path, dtype=dtype, native=native, tokenizer_path=tokenizer_path)


def _load_hf(
    path: str | Path, *, dtype: torch.dtype | None, native: bool, tokenizer_path: str | Path | None
) -> tuple[HFCausalLM, HFTokenizer]:
    directory = model_directory(path)
    if not (directory / "config.json").is_file():
        raise ValueError(f"policy.model: {str(directory)!r} has no config.json (not a Hugging Face model dir)")
    try:
        import transformers as _transformers
    except ImportError as exc:
        raise ValueError("policy.model: hf models need the 'hf' extra (pip install 'flywheel[hf]')") from exc
    transformers: Any = _transformers  # transformers is only partly typed

    transformers.utils.logging.disable_progress_bar()
    transformers.DynamicCache  # noqa: B018 - resolved here, under the lock, not first by two forwards at once
    dtype_kw = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    kwargs: dict[str, Any] = {"local_files_only": True}
    if dtype is not None:
        kwargs[dtype_kw] = dtype
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"policy.model: cannot load {str(directory)!r}: {first_line}") from exc
    if tokenizer_path is None:
        tokenizer = load_hf_tokenizer(directory, "policy.model")
    else:
        tokenizer = load_hf_tokenizer(tokenizer_path, "policy.tokenizer")
    model.eval()
    module = HFCausalLM(model, native=native).eval()
    if tokenizer_path is not None and tokenizer.vocab_size > module.vocab_size:  # ids past the embeddings: an error
        raise ValueError(
            f"policy.tokenizer: the tokenizer has {tokenizer.vocab_size} tokens, more than the model's "
            f"{module.vocab_size} embeddings ({str(directory)!r}): expected the model's tokenizer or one of its size"
        )
    return module, tokenizer
