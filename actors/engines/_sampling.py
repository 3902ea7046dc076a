"""Batched token sampling with per-row temperature / top-k / top-p and per-row RNGs.

Contract: :func:`sample` returns, for each row, the sampled token, ``log μ`` (its log-probability under
the exact distribution it was drawn from: logits / T, top-k then top-p filtering, renormalised) and the
unfiltered ``log softmax(logits / T)``. Greedy rows (``temperature == 0``) take the argmax, report
``log μ = 0`` (a point mass) and use ``T = 1`` for the unfiltered value. Sampling is by inverse CDF on one
uniform draw per row, taken from the row's own ``torch.Generator`` when it has one (per-request seeds),
so a seeded request draws the same tokens whatever batch it shares.

Non-goals: repetition/presence penalties, min-p, logit bias, beam search.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from actors.engines._types import SamplingParams


@dataclass(frozen=True)
class Sampled:
    tokens: list[int]
    logprobs: list[float]  # log μ (filtered distribution)
    unfiltered_logprobs: list[float]  # log softmax(logits / T)


def sample(
    logits: Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    default_generator: torch.Generator,
) -> Sampled:
    """Sample one token per row of ``logits`` (``[N, V]``)."""
    rows, vocab = logits.shape
    logits = logits.float()
    greedy = torch.tensor([p.temperature == 0 for p in params], device=logits.device)
    temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=logits.device)
    scaled = logits / temps[:, None]
    unfiltered = F.log_softmax(scaled, dim=-1)

    filtered_logits = scaled
    if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
        sorted_vals, sorted_idx = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device)
        top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=logits.device)
        remove_sorted = ranks[None, :] >= top_k[:, None]
        probs_sorted = F.softmax(sorted_vals.masked_fill(remove_sorted, float("-inf")), dim=-1)
        mass_before = probs_sorted.cumsum(dim=-1) - probs_sorted
        top_p = torch.tensor([p.top_p for p in params], device=logits.device)
        # Keep the smallest prefix whose mass reaches top_p (the most likely token is always kept).
        remove_sorted |= mass_before >= top_p[:, None]
        remove_sorted[:, 0] = False
        remove = torch.zeros_like(remove_sorted).scatter(1, sorted_idx, remove_sorted)
        filtered_logits = scaled.masked_fill(remove, float("-inf"))
    filtered = F.log_softmax(filtered_logits, dim=-1)

    uniforms = torch.empty(rows, dtype=torch.float64)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        uniforms[shared] = torch.rand(len(shared), dtype=torch.float64, generator=default_generator)
    for i, gen in enumerate(generators):
        if gen is not None:
            uniforms[i] = torch.rand(1, dtype=torch.float64, generator=gen)[0]
    cdf = filtered.double().exp().cumsum(dim=-1)
    targets = (uniforms.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    drawn = torch.searchsorted(cdf, targets, right=True).squeeze(-1).clamp(max=vocab - 1)
    # Float round-off at the top of the CDF could land on a filtered-out token; fall back to the mode.
    invalid = torch.isinf(filtered.gather(1, drawn[:, None]).squeeze(-1))
    drawn = torch.where(invalid, filtered.argmax(dim=-1), drawn)
    tokens = torch.where(greedy, logits.argmax(dim=-1), drawn)

    logp = filtered.gather(1, tokens[:, None]).squeeze(-1)
    logp = torch.where(greedy, torch.zeros_like(logp), logp)
    raw = unfiltered.gather(1, tokens[:, None]).squeeze(-1)
    return Sampled(tokens=tokens.tolist(), logprobs=logp.tolist(), unfiltered_logprobs=raw.tolist())
