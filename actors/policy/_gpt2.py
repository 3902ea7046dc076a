"""A native forward for Hugging Face GPT-2 models, over the model's own parameters.

Why: at the sizes flywheel trains on a CPU (a few layers, width 128, batches of 64 rows, one token per
decode step) the transformers module stack — output dataclasses, decorators, cache objects, mask
builders — costs as much as the arithmetic. This forward runs the same computation as
``GPT2LMHeadModel.forward`` in eval mode in a few dozen tensor ops, and is faster for it at these sizes
(bench/RESULTS.md).

Contract: :func:`gpt2_forward` has the builtin model's forward contract (``actors.policy._tiny_gpt``):
left-padded rows, explicit positions counting real tokens, a cache of per-layer ``(keys, values)``
tensors ``[B, heads, past, head_dim]``, which is also the layout transformers' ``DynamicCache`` holds for
GPT-2, so caches from either path are interchangeable. It reads the parameters of the wrapped model,
never copies them: training, ``state_dict`` and weight updates all go through the Hugging Face module.
:func:`native_gpt2_unsupported` names the first config feature this forward does not implement; the
caller then uses transformers' own forward. Dropout is not implemented, so callers use it only while
the model is in eval mode (flywheel never trains with dropout: behavior and learner logprobs must agree).

Non-goals: cross-attention, ``scale_attn_by_inverse_layer_idx``, ``reorder_and_upcast_attn``, other
architectures (they run through transformers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from actors.policy._tiny_gpt import KVCache, padded_causal_mask, positions_from_mask

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def native_gpt2_unsupported(model: Any) -> str | None:
    """``None`` when :func:`gpt2_forward` computes exactly what ``model`` does; else the reason it does not."""
    config = model.config
    if getattr(config, "model_type", None) != "gpt2" or type(model).__name__ != "GPT2LMHeadModel":
        return f"not a GPT2LMHeadModel ({type(model).__name__})"
    if getattr(config, "add_cross_attention", False):
        return "add_cross_attention"
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        return "scale_attn_by_inverse_layer_idx"
    if getattr(config, "reorder_and_upcast_attn", False):
        return "reorder_and_upcast_attn"
    if config.activation_function not in _ACTIVATIONS:
        return f"activation_function {config.activation_function!r}"
    if getattr(model.lm_head, "bias", None) is not None:
        return "lm_head has a bias"
    return None


def gpt2_forward(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None,
    cache: KVCache | None,
    use_cache: bool,
) -> tuple[Tensor, KVCache | None]:
    config = model.config
    transformer = model.transformer
    batch, length = input_ids.shape
    width, heads = config.n_embd, config.n_head
    head_dim = width // heads
    past = 0 if cache is None else cache[0][0].shape[2]
    if attention_mask.shape != (batch, past + length):
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, expected {(batch, past + length)}")
    if position_ids is None:
        position_ids = positions_from_mask(attention_mask, length)
    mask = padded_causal_mask(attention_mask, past, length)
    scale = head_dim**-0.5 if config.scale_attn_weights else 1.0
    act = _ACTIVATIONS[config.activation_function]
    eps = config.layer_norm_epsilon

    x = transformer.wte(input_ids) + transformer.wpe(position_ids)
    new_cache: KVCache = []
    for i, block in enumerate(transformer.h):
        h = F.layer_norm(x, (width,), block.ln_1.weight, block.ln_1.bias, eps)
        attn = block.attn
        # transformers' Conv1D is x @ weight + bias with weight [in, out]: addmm over the flattened rows.
        qkv = torch.addmm(attn.c_attn.bias, h.reshape(-1, width), attn.c_attn.weight)
        q, k, v = qkv.view(batch, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k = torch.cat((cache[i][0], k), dim=2)
            v = torch.cat((cache[i][1], v), dim=2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        y = torch.addmm(attn.c_proj.bias, y.transpose(1, 2).reshape(-1, width), attn.c_proj.weight)
        x = x + y.view(batch, length, width)
        h = F.layer_norm(x, (width,), block.ln_2.weight, block.ln_2.bias, eps)
        mlp = block.mlp
        h = act(torch.addmm(mlp.c_fc.bias, h.reshape(-1, width), mlp.c_fc.weight))
        x = x + torch.addmm(mlp.c_proj.bias, h, mlp.c_proj.weight).view(batch, length, width)
        if use_cache:
            new_cache.append((k, v))
    x = F.layer_norm(x, (width,), transformer.ln_f.weight, transformer.ln_f.bias, eps)
    return F.linear(x, model.lm_head.weight), (new_cache if use_cache else None)
