"""The learner's optimizer steps: packing samples into tensors, one RL step, one supervised (warm-start) step.

Contract:
- Packing (supervised step, :func:`pack`): each completion becomes one row ``prompt_ids + token_ids``, left-padded
  to the batch's longest row; the RL step packs whole groups with the prompt computed once per group
  (:mod:`actors.learner._prefix`, the same numbers). Positions come from the attention mask
  (``Policy.token_logprobs``), so a row scores exactly the tokens the generator sampled whatever its padding
  (positions count real tokens only). The completion tokens sit
  at the right end; the loss mask covers exactly them.
- RL step (:meth:`Trainer.rl_step`): ``ppo_epochs`` passes over ``minibatches`` slices, each an optimizer step
  on the decoupled PPO loss (``_loss.decoupled_ppo_loss``, plus the k3 KL to the frozen reference when
  ``kl_beta > 0`` and the trust region around each sample's behavior policy when ``behavior_kl_coef > 0``), with
  global gradient-norm clipping. Proximal logprobs are the policy's before the step's first
  update:
  for the first minibatch they are the detached logprobs of its own first forward (the weights have not moved yet;
  the same numbers, one forward pass fewer per step), for later minibatches one forward pass without grad at the
  start of the step. Rows are packed in length buckets, each bucket's loss weighted by
  its share (of tokens, or of completions with ``aggregate: seq-mean``), so the gradient is that of the whole
  minibatch. Logprobs use each sample's own temperature (the generator's), so behavior and learner logprobs
  compare like with like. An empty batch is a no-op that reports zeros, never a NaN.
- Supervised step (:meth:`Trainer.sft_step`): cross-entropy of the reference completion tokens only
  (``encode_prompt`` + ``encode_completion``), its own AdamW at the warm-start learning rate.
- Dropout stays off: the module is never put in train mode. A Hugging Face model's config often has dropout
  (GPT-2: 0.1); in train mode the learner's logprobs would be those of a randomly thinned network, not of the
  policy the generators sample, and the importance weights would measure that noise instead of staleness.

Non-goals: choosing samples (the batcher), advantages (``_advantages``), data-parallel training.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from actors.learner._loss import PPOConfig, decoupled_ppo_loss
from actors.learner._prefix import PrefixPacked, pack_shared, shared_buckets, shared_logprobs
from actors.policy import Policy, encode_completion, encode_prompt

__all__ = ["Packed", "StepStats", "TrainSample", "Trainer", "pack"]

_Row = TypeVar("_Row", bound=tuple[Any, ...])  # (prompt_ids, completion_ids, ...) sorted by total length


@dataclass(frozen=True)
class TrainSample:
    """One completion ready to train on."""

    prompt_ids: Sequence[int]
    token_ids: Sequence[int]
    behavior_logprobs: Sequence[float] | None  # log μ_t per completion token (same length as token_ids); None for a
    #   completion no behavior policy sampled (a reference answer): importance weight 1
    advantage: float
    temperature: float  # > 0: the temperature the generator sampled with


@dataclass(frozen=True)
class StepStats:
    """What one RL step reports (plain floats)."""

    samples: int
    tokens: int
    loss: float
    iw_mean: float
    iw_max: float
    iw_truncated_frac: float
    clipped_frac: float
    kl: float
    ratio_mean: float
    grad_norm: float
    behavior_kl: float = 0.0  # mean k3 KL(behavior ‖ proximal) per token (see ``LossStats``)


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor  # [B, L] left-padded
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor  # [B, L-1] float: 1 where entry t scores a completion token
    behavior: torch.Tensor  # [B, L-1] behavior logprobs at those entries, 0 elsewhere
    advantages: torch.Tensor  # [B]
    temperatures: torch.Tensor  # [B]


def pack(
    rows: Sequence[tuple[Sequence[int], Sequence[int], Sequence[float] | None, float, float]],
    pad_id: int,
    device: torch.device,
) -> Packed:
    """Rows of ``(prompt_ids, completion_ids, behavior_logprobs | None, advantage, temperature)``."""
    length = max(len(p) + len(c) for p, c, _, _, _ in rows)
    batch = len(rows)
    ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attn = torch.zeros((batch, length), dtype=torch.long)
    loss_mask = torch.zeros((batch, max(length - 1, 1)))
    behavior = torch.zeros((batch, max(length - 1, 1)))
    for b, (prompt, completion, logprobs, _, _) in enumerate(rows):
        seq = [*prompt, *completion]
        ids[b, length - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        attn[b, length - len(seq) :] = 1
        if completion:
            loss_mask[b, length - 1 - len(completion) :] = 1.0
            if logprobs is not None:
                behavior[b, length - 1 - len(completion) :] = torch.tensor(list(logprobs), dtype=torch.float32)
    return Packed(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        loss_mask=loss_mask.to(device),
        behavior=behavior.to(device),
        advantages=torch.tensor([r[3] for r in rows], dtype=torch.float32, device=device),
        temperatures=torch.tensor([r[4] for r in rows], dtype=torch.float32),
    )


def adamw(params: Sequence[torch.Tensor], *, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW, fused where torch has a fused kernel for these parameters (CPU and CUDA): the same update, faster.
    Elsewhere the default implementation. A checkpoint written by either loads into either."""
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


class Trainer:
    """Owns the RL optimizer (and the frozen reference when KL is on) for one policy."""

    def __init__(
        self,
        policy: Policy,
        *,
        lr: float,
        ppo: PPOConfig,
        grad_clip: float,
        weight_decay: float = 0.0,
        ppo_epochs: int = 1,
        minibatches: int = 1,
        with_reference: bool = False,
        autocast: torch.dtype | None = None,
    ) -> None:
        self.policy = policy
        self.autocast = autocast  # the RL passes' matmul dtype (torch autocast); None: the weights' own
        self.ppo = ppo
        self.grad_clip = grad_clip
        self.ppo_epochs = ppo_epochs
        self.minibatches = minibatches
        self.params = [p for p in policy.weights.parameters() if p.requires_grad]
        self.optimizer = adamw(self.params, lr=lr, weight_decay=weight_decay)
        self.reference: Policy | None = None
        if with_reference:
            self.reset_reference()

    def reset_reference(self) -> None:
        """Freeze a copy of the current weights as the KL reference."""
        self.reference = copy.deepcopy(self.policy)
        for p in self.reference.weights.parameters():
            p.requires_grad_(False)

    def _pad(self) -> int:
        return int(self.policy.tokenizer.pad_id)

    # ------------------------------------------------------------------ RL
    def rl_step(self, samples: Sequence[TrainSample]) -> StepStats:
        """One RL update (``ppo_epochs`` × ``minibatches`` optimizer steps) on ``samples``.

        Each minibatch is packed in length buckets of whole groups, each group's prompt computed once for all its
        rows (:mod:`actors.learner._prefix`): short arithmetic rows are not padded to the longest extraction row,
        and 8 completions of a prompt do not pay for it 8 times; each bucket's loss is weighted by its share of
        the minibatch's tokens (or completions, for seq-mean), so the gradient equals the whole minibatch's. The first
        minibatch's first
        forward runs before any update, so its detached logprobs *are* the proximal policy's: kept for the later
        epochs, they save the no-grad proximal pass (half the passes of a single update; a third fewer forwards
        at ``ppo_epochs: 2``). Later minibatches get theirs from a no-grad pass before the first update.
        """
        if not samples:
            return StepStats(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        rows = torch.arange(len(samples))
        minibatches = [
            self._packed_buckets([samples[int(i)] for i in chunk])
            for chunk in torch.chunk(rows, self.minibatches)
            if len(chunk)
        ]
        ref_policy = self.reference if self.ppo.kl_coef > 0 else None
        with (
            torch.no_grad()
        ):  # proximal logprobs of the later minibatches (the first's come from its forward), reference
            proximal: list[list[torch.Tensor | None]] = [
                [None if m == 0 else self._logprobs(self.policy, packed) for packed in buckets]
                for m, buckets in enumerate(minibatches)
            ]
            reference = [
                [None if ref_policy is None else self._logprobs(ref_policy, packed) for packed in buckets]
                for buckets in minibatches
            ]
        totals: dict[str, float] = dict.fromkeys(
            ("loss", "iw_mean", "iw_trunc", "clipped", "kl", "ratio", "behavior_kl"), 0.0
        )
        tokens_seen, iw_max, grad_norm = 0, 0.0, 0.0
        for _ in range(self.ppo_epochs):
            for buckets, prox_logprobs, ref_logprobs in zip(minibatches, proximal, reference, strict=True):
                weight_total = float(sum(self._weight(p) for p in buckets)) or 1.0
                self.optimizer.zero_grad(set_to_none=True)
                for b, packed in enumerate(buckets):
                    current = self._logprobs(self.policy, packed)
                    if prox_logprobs[b] is None:  # first minibatch, first epoch: no update yet, current = proximal
                        prox_logprobs[b] = current.detach()
                    prox = prox_logprobs[b]
                    assert prox is not None
                    loss, stats = decoupled_ppo_loss(
                        current,
                        prox,
                        packed.behavior,
                        packed.advantages,
                        packed.loss_mask,
                        self.ppo,
                        ref_logprobs=ref_logprobs[b],
                    )
                    (loss * (self._weight(packed) / weight_total)).backward()  # type: ignore[no-untyped-call]
                    n = stats.tokens
                    tokens_seen += n
                    for key, value in (
                        ("loss", stats.loss),
                        ("iw_mean", stats.iw_mean),
                        ("iw_trunc", stats.iw_truncated_frac),
                        ("clipped", stats.clipped_frac),
                        ("kl", stats.kl),
                        ("ratio", stats.ratio_mean),
                        ("behavior_kl", stats.behavior_kl),
                    ):
                        totals[key] += value * n
                    iw_max = max(iw_max, stats.iw_max)
                norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip))
                grad_norm = max(grad_norm, norm if math.isfinite(norm) else float("inf"))
                if math.isfinite(norm):
                    self.optimizer.step()
        denom = max(tokens_seen, 1)
        return StepStats(
            samples=len(samples),
            tokens=tokens_seen // self.ppo_epochs,
            loss=totals["loss"] / denom,
            iw_mean=totals["iw_mean"] / denom,
            iw_max=iw_max,
            iw_truncated_frac=totals["iw_trunc"] / denom,
            clipped_frac=totals["clipped"] / denom,
            kl=totals["kl"] / denom,
            ratio_mean=totals["ratio"] / denom,
            grad_norm=grad_norm,
            behavior_kl=totals["behavior_kl"] / denom,
        )

    def _packed_buckets(self, samples: Sequence[TrainSample]) -> list[PrefixPacked]:
        rows = [(s.prompt_ids, s.token_ids, s.behavior_logprobs, s.advantage, s.temperature) for s in samples]
        return [pack_shared(bucket, self._pad(), self.policy.device) for bucket in shared_buckets(rows)]

    def _weight(self, packed: PrefixPacked) -> float:
        """A bucket's share of its minibatch's loss: its tokens (token-mean) or its completions (seq-mean)."""
        if self.ppo.aggregate == "token-mean":
            return float(packed.loss_mask.sum())
        return float((packed.loss_mask.sum(dim=-1) > 0).sum())

    def _logprobs(self, policy: Policy, packed: PrefixPacked) -> torch.Tensor:
        if self.autocast is None:
            return shared_logprobs(policy, packed)
        # weights, gradients, the optimizer and the log-softmax stay float32; the matmuls run in `autocast`
        with torch.autocast(policy.device.type, dtype=self.autocast):
            return shared_logprobs(policy, packed)

    # ------------------------------------------------------------------ supervised
    def sft_rows(self, pairs: Sequence[tuple[str, str]]) -> Packed:
        tok = self.policy.tokenizer
        rows = [
            (encode_prompt(tok, prompt), encode_completion(tok, reference), None, 0.0, 1.0)
            for prompt, reference in pairs
        ]
        return pack(rows, self._pad(), self.policy.device)

    def sft_loss(self, pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
        """Mean cross-entropy (nats per token) of the reference completions given their prompts."""
        packed = self.sft_rows(pairs)
        logp = self.policy.token_logprobs(packed.input_ids, packed.attention_mask)
        return -(logp * packed.loss_mask).sum() / packed.loss_mask.sum().clamp(min=1.0)

    def sft_step(self, optimizer: torch.optim.Optimizer, pairs: Sequence[tuple[str, str]]) -> float:
        """One supervised optimizer step on ``(prompt, reference)`` pairs; returns the loss before the step.

        The loss is the mean cross-entropy over every completion token of the batch (as :meth:`sft_loss`), but
        the rows are packed in length buckets (gradients accumulated, each bucket weighted by its share of the
        tokens): a batch mixing 10-token and 70-token rows then costs far less than padding them all to 70.
        """
        tok = self.policy.tokenizer
        rows = sorted(
            ((encode_prompt(tok, p), encode_completion(tok, r)) for p, r in pairs),
            key=lambda row: len(row[0]) + len(row[1]),
        )
        total = float(sum(len(c) for _, c in rows)) or 1.0
        optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for bucket in _length_buckets(rows):
            packed = pack([(p, c, None, 0.0, 1.0) for p, c in bucket], self._pad(), self.policy.device)
            logp = self.policy.token_logprobs(packed.input_ids, packed.attention_mask)
            loss = -(logp * packed.loss_mask).sum() / total
            loss.backward()  # type: ignore[no-untyped-call]
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        optimizer.step()
        return loss_sum


def _length_buckets(rows: Sequence[_Row], waste: float = 1.3, min_rows: int = 4) -> list[Sequence[_Row]]:
    """Split rows sorted by length into runs whose longest row is at most ``waste`` × their shortest (each run at
    least ``min_rows`` rows, so a batch never turns into many tiny forwards)."""
    buckets: list[Sequence[_Row]] = []
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows):
            buckets.append(rows[start:i])
        elif i - start >= min_rows and len(rows[i][0]) + len(rows[i][1]) > waste * (
            len(rows[start][0]) + len(rows[start][1])
        ):
            buckets.append(rows[start:i])
            start = i
    return buckets
