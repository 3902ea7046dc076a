"""The builtin tiny GPT's hyper-parameters, its named sizes, and what a spec's ``policy.config`` may hold (light: no
torch, so that the spec check can say which keys a model takes without loading one).

Contract: `GPTConfig` validates itself when built (one-line ``ValueError`` naming ``policy.config.<field>``);
`BUILTIN_CONFIG_KEYS` and `HF_CONFIG_KEYS` are every key `Policy.from_spec` accepts in ``policy.config`` for a builtin
and for an ``hf:`` model — the spec check and the loader read these same tuples.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["BUILTIN_CONFIG_KEYS", "HF_CONFIG_KEYS", "PRESETS", "GPTConfig"]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 101  # CharTokenizer's vocabulary
    block_size: int = 512  # longest sequence (prompt + completion) the model is used with
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads; n_embd must divide by it and the head size must be even (RoPE)
    n_embd: int = 128  # residual stream width
    rope_theta: float = 10000.0  # RoPE base frequency

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"policy.config.{name}: expected an integer >= 1, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"policy.config.n_embd: {self.n_embd} is not divisible by n_head={self.n_head}")
        if (self.n_embd // self.n_head) % 2:
            raise ValueError(
                f"policy.config: head size n_embd/n_head = {self.n_embd // self.n_head} must be even for RoPE"
            )
        if not self.rope_theta > 0:
            raise ValueError(f"policy.config.rope_theta: expected a number > 0, got {self.rope_theta!r}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# Named sizes (parameter counts with the 101-token character vocabulary).
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 5, "n_head": 4, "n_embd": 128},  # ≈ 1.0M
    "small": {"n_layer": 6, "n_head": 6, "n_embd": 384},  # ≈ 10.7M
    "medium": {"n_layer": 14, "n_head": 12, "n_embd": 768},  # ≈ 99M
}


# policy.config of builtin:tiny-gpt: GPTConfig's fields, a preset to start from, the init seed and the weights' dtype
BUILTIN_CONFIG_KEYS = (*GPTConfig.field_names(), "preset", "seed", "dtype")
HF_CONFIG_KEYS = ("dtype", "native_forward")  # policy.config of an hf: model
