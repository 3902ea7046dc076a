"""Policies shared by the generators and the learner: the builtin tiny GPT and local Hugging Face models.

Importing this package imports torch (the spec layer must not import it; ``actors.engines._types`` is
the torch-free surface)."""

from actors.policy._policy import Policy, StateDictError, read_safetensors
from actors.policy._prompting import encode_completion, encode_prompt, strip_eos
from actors.policy._testing import HF_CHARS, write_tiny_hf_model
from actors.policy._tiny_gpt import PRESETS, GPTConfig, KVCache, TinyGPT, positions_from_mask
from actors.policy._tokenizer import SPECIAL_TOKENS, CharTokenizer, HFTokenizer

__all__ = [
    "HF_CHARS",
    "PRESETS",
    "SPECIAL_TOKENS",
    "CharTokenizer",
    "GPTConfig",
    "HFTokenizer",
    "KVCache",
    "Policy",
    "StateDictError",
    "TinyGPT",
    "encode_completion",
    "encode_prompt",
    "positions_from_mask",
    "read_safetensors",
    "strip_eos",
    "write_tiny_hf_model",
]
