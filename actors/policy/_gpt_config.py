"""The builtin tiny GPT's hyper-parameters, its named sizes, and what a spec's ``policy.config`` may hold (light: no
torch, so that the spec check can say which keys a model takes without loading one).

Contract: `GPTConfig` validates itself when built (one-line ``ValueError`` naming ``policy.config.<field>``);
`BUILTIN_CONFIG_KEYS` and `HF_CONFIG_KEYS` are every key `Policy.from_spec` accepts in ``policy.config`` for a builtin
and for an ``hf:`` model — the spec check and the loader read these same tuples; `CONFIG_ON_RESUME` says of each
whether a resumed run may change it; `resolved_config` is what a builtin's ``policy.config`` makes of its weights (its
preset merged in, `DEFAULT_PRESET` when it names none, and its dtype), which a resume compares rather than the keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = [
    "BUILTIN_CONFIG_KEYS",
    "CONFIG_ON_RESUME",
    "DEFAULT_DTYPE",
    "DEFAULT_PRESET",
    "DTYPE_NAMES",
    "HF_CONFIG_KEYS",
    "PRESETS",
    "GPTConfig",
    "builtin_gpt_config",
    "config_problems",
    "resolved_config",
]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 101  # CharTokenizer's vocabulary
    block_size: int = 512  # longest sequence (prompt + completion) the model is used with
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads; n_embd must divide by it and the head size must be even (RoPE)
    n_embd: int = 128  # residual stream width
    rope_theta: float = 10000.0  # RoPE base frequency

    def __post_init__(self) -> None:
        problems = config_problems(self.as_dict())
        if problems:
            field, message = problems[0]
            raise ValueError(f"policy.config{'.' + field if field else ''}: {message}")

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
DEFAULT_PRESET = "tiny"  # the preset of a builtin model whose policy.config names none


# policy.config of builtin:tiny-gpt: GPTConfig's fields, a preset to start from, the init seed and the weights' dtype
BUILTIN_CONFIG_KEYS = (*GPTConfig.field_names(), "preset", "seed", "dtype")
HF_CONFIG_KEYS = ("dtype", "native_forward")  # policy.config of an hf: model
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # policy.config.dtype of either kind of model
DEFAULT_DTYPE = "float32"  # policy.config.dtype when it is not given

_SHAPE = "the run's checkpoints hold weights of the shape it gives the model"
# What a resumed run (`flywheel up --resume`) makes of a changed key of policy.config, for every key of either kind
# of model: why it may not change, or None where the change is followed (and logged). What shapes the weights or
# gives them their meaning is fixed; what only decides how they are used or first drawn is free.
CONFIG_ON_RESUME: dict[str, str | None] = {
    "preset": _SHAPE,
    "vocab_size": _SHAPE,
    "n_layer": _SHAPE,
    "n_head": "the run's checkpoints hold attention weights trained split into this many heads",
    "n_embd": _SHAPE,
    "rope_theta": "the run's checkpoints hold weights trained with the positions this RoPE base encodes",
    "dtype": "the run's checkpoints hold the weights and the optimizer's state in the dtype it started with",
    "block_size": None,  # the longest sequence the model is used with: no weight depends on it (RoPE positions)
    "seed": None,  # draws a fresh model's first weights: a resumed run's come from its checkpoint
    "native_forward": None,  # which forward runs inference: the weights are the same
}


def config_problems(values: dict[str, Any]) -> list[tuple[str, str]]:
    """What is wrong with a builtin model's hyper-parameters (GPTConfig's fields, a preset's merged in), as
    ``(field, message)`` pairs — ``""`` for a problem of two fields together; empty when they make a model."""
    problems: list[tuple[str, str]] = []
    for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
        value = values.get(name, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append((name, f"expected an integer >= 1, got {value!r}"))
    theta = values.get("rope_theta", 1.0)
    if isinstance(theta, bool) or not isinstance(theta, int | float) or not theta > 0:
        problems.append(("rope_theta", f"expected a number > 0, got {theta!r}"))
    if problems:
        return problems
    embd, heads = values.get("n_embd", GPTConfig.n_embd), values.get("n_head", GPTConfig.n_head)
    if embd % heads:
        problems.append(("n_embd", f"{embd} is not divisible by n_head={heads}"))
    elif (embd // heads) % 2:
        problems.append(("", f"head size n_embd/n_head = {embd // heads} must be even for RoPE"))
    return problems


def resolved_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """What a builtin model's ``policy.config`` makes of the model: `GPTConfig`'s fields (its preset's sizes —
    `DEFAULT_PRESET`'s when it names none — under its own keys, the rest GPTConfig's defaults) and ``dtype``
    (`DEFAULT_DTYPE` when not given). ``ValueError`` (naming the key) when they make no model."""
    return {**builtin_gpt_config(config).as_dict(), "dtype": config.get("dtype", DEFAULT_DTYPE)}


def builtin_gpt_config(config: Mapping[str, Any]) -> GPTConfig:
    """The `GPTConfig` a builtin model's ``policy.config`` builds: its preset's sizes (`DEFAULT_PRESET`'s when it
    names none) under its own; keys that are not GPTConfig's fields are ignored. ``ValueError`` naming the key."""
    preset = config.get("preset", DEFAULT_PRESET)
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"policy.config.preset: expected one of {sorted(PRESETS)}, got {preset!r}")
    sizes = {key: value for key, value in config.items() if key in GPTConfig.field_names()}
    return GPTConfig(**{**PRESETS[preset], **sizes})
