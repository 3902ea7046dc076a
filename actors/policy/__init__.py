"""Policies shared by the generators and the learner: the builtin tiny GPT and local Hugging Face models.

A library. Importing the package is light; the names load their modules (and torch) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topology import lazy_exports

if TYPE_CHECKING:
    from actors.policy._checks import check_policy as check_policy
    from actors.policy._gpt_config import PRESETS as PRESETS
    from actors.policy._gpt_config import GPTConfig as GPTConfig
    from actors.policy._hub import model_directory as model_directory
    from actors.policy._policy import Policy as Policy
    from actors.policy._policy import StateDictError as StateDictError
    from actors.policy._policy import all_finite as all_finite
    from actors.policy._policy import native_bfloat16 as native_bfloat16
    from actors.policy._policy import read_safetensors as read_safetensors
    from actors.policy._prompting import encode_completion as encode_completion
    from actors.policy._prompting import encode_prompt as encode_prompt
    from actors.policy._prompting import strip_eos as strip_eos
    from actors.policy._testing import HF_CHARS as HF_CHARS
    from actors.policy._testing import write_tiny_hf_model as write_tiny_hf_model
    from actors.policy._tiny_gpt import KVCache as KVCache
    from actors.policy._tiny_gpt import TinyGPT as TinyGPT
    from actors.policy._tiny_gpt import positions_from_mask as positions_from_mask
    from actors.policy._tokenizer import SPECIAL_TOKENS as SPECIAL_TOKENS
    from actors.policy._tokenizer import CharTokenizer as CharTokenizer
    from actors.policy._tokenizer import HFTokenizer as HFTokenizer
    from actors.policy._tokenizer import load_tokenizer as load_tokenizer

_EXPORTS = {
    "all_finite": "_policy",
    "CharTokenizer": "_tokenizer",
    "check_policy": "_checks",
    "encode_completion": "_prompting",
    "encode_prompt": "_prompting",
    "GPTConfig": "_gpt_config",
    "HF_CHARS": "_testing",
    "HFTokenizer": "_tokenizer",
    "KVCache": "_tiny_gpt",
    "load_tokenizer": "_tokenizer",
    "model_directory": "_hub",
    "native_bfloat16": "_policy",
    "Policy": "_policy",
    "positions_from_mask": "_tiny_gpt",
    "PRESETS": "_gpt_config",
    "read_safetensors": "_policy",
    "SPECIAL_TOKENS": "_tokenizer",
    "StateDictError": "_policy",
    "strip_eos": "_prompting",
    "TinyGPT": "_tiny_gpt",
    "write_tiny_hf_model": "_testing",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
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
    "all_finite",
    "check_policy",
    "encode_completion",
    "encode_prompt",
    "load_tokenizer",
    "model_directory",
    "native_bfloat16",
    "positions_from_mask",
    "read_safetensors",
    "strip_eos",
    "write_tiny_hf_model",
]
