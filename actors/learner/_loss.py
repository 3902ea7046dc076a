"""Decoupled PPO with truncated importance weights — the learner's loss, written once.

Contract, per completion token ``t``:

```
ratio_t   = exp(log π_θ,t − log π_prox,t)
iw_t      = min(exp(log π_prox,t − log μ_t), C)          # no grad
clipped_t = clip(ratio_t, 1 − ε_low, 1 + ε_high)
loss_t    = − iw_t · min(ratio_t · A, clipped_t · A)
loss      = Σ loss_t / Σ 1                                # aggregate "token-mean": over the batch's tokens
loss      = mean_i (Σ_t∈i loss_t / |i|)                   # aggregate "seq-mean": each completion weighs the same
```

Token-mean is the usual choice for one domain (a long completion is not down-weighted per token). With domains of
very different lengths in one batch it hands the gradient to the longest domain: a 3-token arithmetic answer
weighs 3 against a 20-token extraction's 20. Seq-mean gives every completion — every domain's sample — the same
say.

plus, optionally, ``β · mean(kl_t)`` with the k3 estimator against a frozen reference policy, and, optionally, a
trust region around the behavior policy, added to every sampled token's loss:

```
log_r_t   = log π_θ,t − log μ_t
anchor_t  = β_μ · (exp(log_r_t) − 1 − log_r_t)            # k3 estimate of KL(μ ‖ π_θ) on μ's own samples
```

Its value and gradient ``β_μ · (π_θ/μ − 1) · ∇ log π_θ`` are exactly 0 on a token the learner still gives the
behavior probability, so on-policy (and a few versions stale) it costs nothing. It matters when every sample comes
from one version the gate keeps serving while the learner moves on: the importance weight ``min(π_prox/μ, C)`` then
goes to 0 on the tokens the learner has made unlikely, so the policy-gradient term stops pulling on them, while the
anchor pulls them back with a force that tends to ``β_μ`` (and pushes down, in proportion to ``π_θ/μ``, the tokens
the learner has made far likelier than μ). Reference answers (NaN behavior) have no μ and no anchor.

All tensors are ``[batch, time]`` with a float ``mask`` marking completion tokens (prompt and padding are 0).

What this module does not do: it computes no logprobs (the policy does) and it does not filter stale samples
(the batcher does, before any forward pass, so stale samples cost no compute).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True)
class PPOConfig:
    """Knobs of the decoupled PPO loss."""

    clip_low: float = 0.2  # ε_low: ratio may fall to 1 − ε_low before the clip bites
    clip_high: float = 0.28  # ε_high: "clip-higher" leaves room for unlikely tokens to grow
    iw_cap: float = 3.0  # C: truncation of the behavior→proximal importance weight
    kl_coef: float = 0.0  # β: weight of the k3 KL to the reference policy; 0 disables it
    behavior_kl_coef: float = 0.0  # β_μ: weight of the k3 KL(behavior ‖ π_θ) on sampled tokens; 0 disables it
    aggregate: Literal["token-mean", "seq-mean"] = "token-mean"  # how token losses become one number

    def __post_init__(self) -> None:
        if not 0 < self.clip_low < 1:
            raise ValueError(f"clip_low: expected a number in (0, 1), got {self.clip_low}")
        if self.clip_high <= 0:
            raise ValueError(f"clip_high: expected a number > 0, got {self.clip_high}")
        if self.iw_cap < 1:
            raise ValueError(f"iw_cap: expected a number >= 1, got {self.iw_cap}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef: expected a number >= 0, got {self.kl_coef}")
        if not (self.behavior_kl_coef >= 0 and math.isfinite(self.behavior_kl_coef)):
            raise ValueError(f"behavior_kl_coef: expected a finite number >= 0, got {self.behavior_kl_coef}")
        if self.aggregate not in ("token-mean", "seq-mean"):
            raise ValueError(f"aggregate: expected token-mean or seq-mean, got {self.aggregate!r}")


@dataclass(frozen=True)
class LossStats:
    """What one loss evaluation reports (plain floats, detached)."""

    loss: float
    tokens: int
    iw_mean: float
    iw_max: float
    iw_truncated_frac: float  # fraction of tokens whose importance weight hit the cap
    clipped_frac: float  # fraction of tokens where the clipped branch was the one taken
    kl: float  # mean k3 KL to the reference (0 when disabled)
    ratio_mean: float
    # mean k3 estimate of KL(behavior ‖ proximal) per token, from the untruncated importance weights: how far the
    #   policy has moved since the generator sampled (staleness in nats rather than versions); 0 for reference rows
    behavior_kl: float = 0.0


def importance_weights(prox_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated ``min(π_prox / μ, C)`` per token, without grad. A NaN behavior logprob marks a token no behavior
    policy sampled (a reference answer): its weight is 1, as if the proximal policy had."""
    with torch.no_grad():
        weights = torch.exp(prox_logprobs - behavior_logprobs).clamp(max=cap)
        return torch.where(torch.isnan(behavior_logprobs), torch.ones_like(weights), weights)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π_θ ‖ π_ref): ``exp(ref − θ) − (ref − θ) − 1`` (always ≥ 0)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def behavior_anchor(logprobs: torch.Tensor, behavior_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(μ ‖ π_θ) on tokens sampled from μ: ``r − 1 − log r`` with ``r = π_θ / μ``
    (always ≥ 0; 0 with a 0 gradient where ``π_θ = μ``). A NaN behavior logprob (a reference answer) gives 0 with
    a finite gradient: the NaN is replaced before the arithmetic, since a NaN in the branch ``torch.where`` drops
    still poisons the gradient."""
    sampled = ~torch.isnan(behavior_logprobs)
    behavior = torch.where(sampled, behavior_logprobs, logprobs.detach())
    log_r = logprobs - behavior
    return torch.exp(log_r) - 1.0 - log_r


def aggregate(values: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """``[batch, time]`` token values → one number: the masked token mean, or the mean over rows (with at least
    one masked token) of each row's token mean. All-zero masks give 0 with a grad path."""
    if how == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    lengths = mask.sum(dim=-1)
    rows = (lengths > 0).to(values.dtype)
    return ((values * mask).sum(dim=-1) / lengths.clamp(min=1.0) * rows).sum() / rows.sum().clamp(min=1.0)


def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    prox_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PPOConfig,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The token-mean decoupled PPO loss and its statistics.

    ``advantages`` is ``[batch]`` (one per completion) or ``[batch, time]``. An all-zero mask yields a zero
    loss that still has a grad path (so callers need no special case) and zeroed statistics.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    mask = mask.to(logprobs.dtype)
    tokens = int(mask.sum().item())

    iw = importance_weights(prox_logprobs.detach(), behavior_logprobs, config.iw_cap)
    ratio = torch.exp(logprobs - prox_logprobs.detach())
    clipped = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high)
    unclipped_obj = ratio * advantages
    clipped_obj = clipped * advantages
    objective = torch.minimum(unclipped_obj, clipped_obj)
    per_token = -iw * objective
    if config.behavior_kl_coef > 0:
        per_token = per_token + config.behavior_kl_coef * behavior_anchor(logprobs, behavior_logprobs)
    loss = aggregate(per_token, mask, config.aggregate)

    kl_value = 0.0
    if ref_logprobs is not None and config.kl_coef > 0:
        kl = k3_kl(logprobs, ref_logprobs.detach())
        kl_mean = aggregate(kl, mask, config.aggregate)
        loss = loss + config.kl_coef * kl_mean
        kl_value = float(kl_mean.detach())

    with torch.no_grad():
        on = mask > 0
        if tokens:
            iw_on = iw[on]
            sampled = on & ~torch.isnan(behavior_logprobs)
            log_r = (prox_logprobs.detach() - behavior_logprobs)[sampled]
            behavior_kl = float((torch.exp(log_r) - 1.0 - log_r).mean()) if bool(sampled.any()) else 0.0
            stats = LossStats(
                loss=float(loss.detach()),
                tokens=tokens,
                iw_mean=float(iw_on.mean()),
                iw_max=float(iw_on.max()),
                iw_truncated_frac=float((iw_on >= config.iw_cap).float().mean()),
                clipped_frac=float((clipped_obj < unclipped_obj)[on].float().mean()),
                kl=kl_value,
                ratio_mean=float(ratio[on].mean()),
                behavior_kl=behavior_kl,
            )
        else:
            stats = LossStats(0.0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return loss, stats
