"""Policies shared by the generators and the learner: the builtin tiny GPT and local Hugging Face models.

Importing this package imports torch (the spec layer must not import it; ``actors.generator._types`` is
the torch-free surface)."""

from ._policy import Policy, StateDictError, read_safetensors
from ._prompting import encode_completion, encode_prompt, strip_eos
from ._testing import HF_CHARS, write_tiny_hf_model
from ._tiny_gpt import PRESETS, GPTConfig, KVCache, TinyGPT, positions_from_mask
from ._tokenizer import SPECIAL_TOKENS, CharTokenizer, HFTokenizer

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
