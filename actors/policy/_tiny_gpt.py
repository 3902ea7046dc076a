"""The builtin tiny GPT: a decoder-only transformer with rotary positions, sized from ~1M to ~100M params.

Architecture: token embedding (tied with the output head), ``n_layer`` pre-norm blocks (LayerNorm →
causal self-attention with RoPE → residual; LayerNorm → GELU MLP ×4 → residual), a final LayerNorm.
No biases, no dropout (RL fine-tuning on CPU; dropout would also make behavior and learner logprobs differ).

Contract of :meth:`TinyGPT.forward`:

* ``attention_mask`` (``[B, past + L]``, 1 = real token) lets rows of a batch be left-padded; padded
  keys are never attended by real queries, so a row's result does not depend on its batch-mates.
* ``position_ids`` (``[B, L]``) default to ``cumsum(attention_mask) - 1`` over the last ``L`` columns,
  i.e. positions count real tokens only — the same rule the generator and learner use.
* The cache is a list, one ``(keys, values)`` pair per layer, each ``[B, n_head, past, head_dim]`` with
  RoPE already applied to the keys; it is returned extended by the ``L`` new positions when
  ``use_cache`` is true. The caller owns it (the engine pads, merges and slices it between steps).

Non-goals: flash/paged attention, sliding windows, gradient checkpointing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from actors.policy._gpt_config import GPTConfig

KVCache = list[tuple[Tensor, Tensor]]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class _Attention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, past: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if past is not None:
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=length > 1)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width)), (k, v)


class _Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=False)
        self.attn = _Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=False)
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.out = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, past: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        attn_out, kv = self.attn(self.ln_1(x), cos, sin, mask, past)
        x = x + attn_out
        x = x + self.out(F.gelu(self.fc(self.ln_2(x))))
        return x, kv


def padded_causal_mask(attention_mask: Tensor, past: int, length: int) -> Tensor:
    """The boolean attention mask ``[B, 1, L, past+L]`` of ``L`` new queries over left-padded rows: causal, no
    padded key, and a query always sees itself (a padded query row never softmaxes over an empty set)."""
    device = attention_mask.device
    keys = torch.arange(past + length, device=device)
    queries = torch.arange(past, past + length, device=device)
    causal = keys[None, :] <= queries[:, None]  # [L, past+L]
    diagonal = keys[None, :] == queries[:, None]
    return ((causal[None] & attention_mask.bool()[:, None, :]) | diagonal[None])[:, None]


def positions_from_mask(attention_mask: Tensor, length: int) -> Tensor:
    """Position of each of the last ``length`` columns: the number of real tokens before it."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions[:, -length:].clamp(min=0)


class TinyGPT(nn.Module):
    inv_freq: Tensor

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=False)
        head_dim = config.n_embd // config.n_head
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        residual_std = 0.02 / (2 * self.config.n_layer) ** 0.5
        for name, param in self.named_parameters():
            if param.dim() < 2:
                continue  # LayerNorm weights keep their ones
            std = residual_std if name.endswith(("attn.proj.weight", "out.weight")) else 0.02
            nn.init.normal_(param, mean=0.0, std=std)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool = False,
    ) -> tuple[Tensor, KVCache | None]:
        batch, length = input_ids.shape
        past = 0 if cache is None else cache[0][0].shape[2]
        device = input_ids.device
        if attention_mask is not None and attention_mask.shape != (batch, past + length):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, expected {(batch, past + length)}"
            )
        if position_ids is None:
            if attention_mask is not None:
                position_ids = positions_from_mask(attention_mask, length)
            else:
                position_ids = torch.arange(past, past + length, device=device).expand(batch, length)

        freqs = position_ids.to(self.inv_freq.dtype)[..., None] * self.inv_freq  # [B, L, head_dim/2]
        dtype = self.wte.weight.dtype
        cos, sin = freqs.cos()[:, None].to(dtype), freqs.sin()[:, None].to(dtype)  # [B, 1, L, head_dim/2]

        mask: Tensor | None = None
        if attention_mask is not None:
            mask = padded_causal_mask(attention_mask, past, length)
        elif past > 0:
            keys = torch.arange(past + length, device=device)
            mask = (keys[None, :] <= torch.arange(past, past + length, device=device)[:, None])[None, None]

        x = self.wte(input_ids)
        new_cache: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, cos, sin, mask, None if cache is None else cache[i])
            if use_cache:
                new_cache.append(kv)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return logits, (new_cache if use_cache else None)
