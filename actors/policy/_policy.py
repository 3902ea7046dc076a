"""``Policy``: a tokenizer and a causal LM behind one interface, shared by generators and the learner.

Contract:

* :meth:`Policy.forward` — ``(input_ids, attention_mask, position_ids, cache, use_cache) → (logits,
  cache)`` for both the builtin tiny GPT and Hugging Face models (see ``_tiny_gpt`` for the cache layout);
  position ids default to ``cumsum(attention_mask) - 1`` so left-padded batches score like single rows.
* :meth:`Policy.token_logprobs` — the learner's side of ``log π``: ``log_softmax(logits / T)`` at each
  target, with grad when called with grad enabled. The generator's ``Completion.unfiltered_logprobs``
  are this exact quantity for the same weights and temperature (temperature 0 means ``T = 1`` on both
  sides), so behavior and learner logprobs compare like with like.
* Weights are named by ``named_parameters()`` of the underlying model (tied weights appear once; for HF
  models the names are the model's own, as in its safetensors files). :meth:`validate_state_dict`
  checks names, shapes, dtypes and finiteness without touching the live model; :meth:`load_state_dict`
  validates first and copies in only when everything passed, so a bad payload never half-loads.

Non-goals: optimizers, checkpoint formats beyond a single safetensors file, device placement policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from actors.policy._gpt_config import (
    BUILTIN_CONFIG_KEYS,
    DEFAULT_DTYPE,
    DEFAULT_PRESET,
    DTYPE_NAMES,
    HF_CONFIG_KEYS,
    PRESETS,
    GPTConfig,
    builtin_gpt_config,
)
from actors.policy._shapes import shape_mismatch
from actors.policy._tiny_gpt import KVCache, TinyGPT, positions_from_mask
from actors.policy._tokenizer import CharTokenizer, HFTokenizer, spec_field

_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}


class StateDictError(ValueError):
    """A weight payload does not fit the model (names, shapes, dtypes or non-finite values)."""


class Policy:
    """A tokenizer plus a causal LM; build with :meth:`from_spec`, :meth:`tiny_gpt` or :meth:`from_hf`."""

    def __init__(
        self,
        *,
        kind: Literal["builtin", "hf"],
        name: str,
        module: nn.Module,
        weights: nn.Module,
        tokenizer: CharTokenizer | HFTokenizer,
        max_context: int,
        vocab_size: int,
    ) -> None:
        self.kind = kind
        self.name = name
        self.module = module  # the forward-contract module
        self.weights = weights  # the module whose named_parameters() name the weights
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.vocab_size = vocab_size
        self._param_refs: dict[str, Tensor] = dict(weights.named_parameters())

    # ----------------------------------------------------------------- construction
    @classmethod
    def tiny_gpt(cls, config: GPTConfig | None = None, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Policy:
        config = config or GPTConfig(**PRESETS[DEFAULT_PRESET])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = TinyGPT(config)
        model.to(dtype=dtype).eval()
        return cls(
            kind="builtin",
            name="builtin:tiny-gpt",
            module=model,
            weights=model,
            tokenizer=CharTokenizer(),
            max_context=config.block_size,
            vocab_size=config.vocab_size,
        )

    @classmethod
    def from_hf(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype | None = None,
        native_forward: bool = True,
        tokenizer_path: str | Path | None = None,
    ) -> Policy:
        """A local Hugging Face model; ``tokenizer_path``: a tokenizer from another directory (or cached hub id)."""
        from actors.policy._hf import load_hf

        module, tokenizer = load_hf(path, dtype=dtype, native=native_forward, tokenizer_path=tokenizer_path)
        return cls(
            kind="hf",
            name=f"hf:{path}",
            module=module,
            weights=module.hf,
            tokenizer=tokenizer,
            max_context=module.max_context,
            vocab_size=module.vocab_size,
        )

    @classmethod
    def from_spec(cls, spec: Any, *, dtype: str | None = None, device: str | torch.device | None = None) -> Policy:
        """Build from the spec's ``policy`` section: a mapping or an object with ``model``, ``config``,
        ``checkpoint`` (and ``tokenizer``: another tokenizer for an ``hf:`` model). ``model`` is ``builtin:tiny-gpt``
        or ``hf:<dir>``. ``dtype`` (``float32`` /
        ``bfloat16`` / ``float16``) overrides ``config.dtype``; ``device`` (``cpu``, ``cuda``, ``auto``)
        places the model (default cpu). Errors are one-line ``ValueError``s."""
        model = spec_field(spec, "model", "builtin:tiny-gpt")
        config = dict(spec_field(spec, "config", None) or {})
        checkpoint = spec_field(spec, "checkpoint", None)
        tokenizer_path = spec_field(spec, "tokenizer", None)
        config_dtype = config.pop("dtype", DEFAULT_DTYPE)
        torch_dtype = _dtype(dtype if dtype is not None else config_dtype)
        if model == "builtin:tiny-gpt":
            if tokenizer_path:
                raise ValueError(
                    f"policy.tokenizer: builtin models have their own character tokenizer, got {tokenizer_path!r}"
                )
            unknown = sorted(set(config) - set(BUILTIN_CONFIG_KEYS))
            if unknown:
                allowed = ", ".join(BUILTIN_CONFIG_KEYS)
                raise ValueError(f"policy.config: unknown key {unknown[0]!r} for builtin:tiny-gpt (allowed: {allowed})")
            seed = config.pop("seed", 0)
            policy = cls.tiny_gpt(builtin_gpt_config(config), seed=int(seed), dtype=torch_dtype)
        elif isinstance(model, str) and model.startswith("hf:"):
            native_forward = config.pop("native_forward", True)
            if not isinstance(native_forward, bool):
                raise ValueError(f"policy.config.native_forward: expected true or false, got {native_forward!r}")
            if config:
                allowed = ", ".join(HF_CONFIG_KEYS)
                raise ValueError(f"policy.config: unknown key {sorted(config)[0]!r} for hf models (allowed: {allowed})")
            policy = cls.from_hf(
                model[3:], dtype=torch_dtype, native_forward=native_forward, tokenizer_path=tokenizer_path
            )
        else:
            raise ValueError(f"policy.model: expected 'builtin:tiny-gpt' or 'hf:<model dir>', got {model!r}")
        if checkpoint:
            policy.load_file(checkpoint)
        if device is not None:
            policy.to(device)
        return policy

    # ----------------------------------------------------------------- compute
    @property
    def device(self) -> torch.device:
        return next(iter(self._param_refs.values())).device

    def to(self, device: str | torch.device) -> Policy:
        """Move the model to ``device`` (``"auto"``: cuda when available, else cpu); returns self."""
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        target = torch.device(device)
        if target.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device: cuda requested but torch sees no CUDA device")
        self.module.to(target)
        self._param_refs = dict(self.weights.named_parameters())
        return self

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self._param_refs.values())

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool = False,
    ) -> tuple[Tensor, KVCache | None]:
        logits, new_cache = self.module(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
        )
        return logits, new_cache

    def token_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        targets: Tensor | None = None,
        temperature: float = 1.0,
    ) -> Tensor:
        """``log_softmax(logits / T)`` of the targets, ``[B, L - 1]`` by default.

        Without ``targets``, entry ``[b, t]`` scores ``input_ids[b, t + 1]`` given ``input_ids[b, :t + 1]``;
        with ``targets`` (``[B, L]``), entry ``[b, t]`` scores ``targets[b, t]`` given ``input_ids[b, :t + 1]``.
        Positions come from ``attention_mask`` (left padding is fine); entries whose target is padding are 0.
        ``temperature == 0`` is treated as 1 (what greedy completions report as unfiltered logprobs).
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        position_ids = positions_from_mask(attention_mask, input_ids.shape[1])
        logits, _ = self.forward(input_ids, attention_mask=attention_mask, position_ids=position_ids)
        if targets is None:
            # A target counts only when it and its context token are real (not left padding).
            target_mask = attention_mask[:, 1:] * attention_mask[:, :-1]
            logits, targets = logits[:, :-1], input_ids[:, 1:]
        else:
            target_mask = attention_mask
        scale = temperature if temperature > 0 else 1.0
        logp = F.log_softmax(logits.float() / scale, dim=-1)
        picked = logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
        return picked * target_mask.to(picked.dtype)

    # ----------------------------------------------------------------- weights
    def state_dict(self) -> dict[str, Tensor]:
        """Detached views of the live parameters (copy them before mutating)."""
        return {name: p.detach() for name, p in self._param_refs.items()}

    def validate_state_dict(self, state_dict: Mapping[str, Any], *, values: bool = True) -> None:
        """Raise :class:`StateDictError` unless ``state_dict`` has exactly this model's names, shapes and
        dtypes, and (unless ``values`` is False) only finite values. Touches nothing."""
        expected = self._param_refs
        for name, value in state_dict.items():
            if not isinstance(value, Tensor):
                raise StateDictError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
        problem = shape_mismatch(
            {n: tuple(t.shape) for n, t in expected.items()}, {n: tuple(t.shape) for n, t in state_dict.items()}
        )
        if problem is not None:
            raise StateDictError(problem)
        for name, live in expected.items():
            value = state_dict[name]
            if value.dtype != live.dtype:
                raise StateDictError(f"{name}: dtype {value.dtype} does not match the model's {live.dtype}")
            if values and value.is_floating_point() and not all_finite(value):
                raise StateDictError(f"{name}: contains NaN or infinite values")

    def load_state_dict(self, state_dict: Mapping[str, Any], *, validate: bool = True) -> None:
        """Validate (unless the caller just did) and copy every tensor into the live parameters."""
        if validate:
            self.validate_state_dict(state_dict)
        with torch.no_grad():
            for name, live in self._param_refs.items():
                live.copy_(state_dict[name])

    def exchange_weights(self, buffers: dict[str, Tensor]) -> None:
        """Make ``buffers`` (exactly this model's names, shapes, dtypes and device; unchecked) the live weights,
        and put the previous live tensors into ``buffers`` in their place: a swap without a copy."""
        for name, live in self._param_refs.items():
            previous = live.data
            live.data = buffers[name]
            buffers[name] = previous

    def load_file(self, path: str | Path) -> None:
        """Load weights from a ``.safetensors`` file, or a directory holding ``*.safetensors`` files."""
        self.load_state_dict(read_safetensors(path))


def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 matmuls natively (faster than float32): a CUDA GPU with bf16 support, or
    a CPU with AMX or AVX512-BF16 instructions (where torch's oneDNN kernels use them). Elsewhere bfloat16 is
    emulated and slower than float32."""
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    cpu: Any = torch.cpu
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")  # private, present since torch 2.3
    return any(bool(getattr(cpu, probe, lambda: False)()) for probe in probes)


def all_finite(tensor: Tensor) -> bool:
    """Whether every value of a floating-point tensor is finite, in one reading pass.

    A NaN or an infinity makes the sum non-finite, so a finite sum proves every value finite; a non-finite sum
    (which an overflow of large finite values can also give) is checked value by value. ``isfinite(t).all()``
    alone writes a boolean per value first: 20-30x slower than the sum on a CPU (bench/RESULTS.md).
    """
    accumulate = torch.float32 if tensor.dtype in (torch.float16, torch.bfloat16) else None
    if bool(torch.isfinite(tensor.sum(dtype=accumulate))):
        return True
    return bool(torch.isfinite(tensor).all())


def read_safetensors(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a ``.safetensors`` file, or of every one in a directory; ``StateDictError`` when there are
    none, or when a file is not one (a user's path to the wrong file is a one-line error, not a traceback)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    target = Path(path).expanduser()
    files = sorted(target.glob("*.safetensors")) if target.is_dir() else [target]
    if not files or not all(f.is_file() for f in files):
        raise StateDictError(f"no safetensors weights at {str(target)!r}")
    tensors: dict[str, Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(str(file)))
        except SafetensorError as exc:
            raise StateDictError(f"{str(file)!r} is not a safetensors file ({exc})") from None
    return tensors


def _dtype(name: Any) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"policy.config.dtype: expected one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]
