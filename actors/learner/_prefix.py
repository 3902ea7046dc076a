"""Shared-prompt packing for the RL step: a GRPO group's prompt is run through the model once, not once per row.

A group of n completions of one prompt costs, packed row by row, n × (prompt + completion) tokens of forward and
backward; here it costs prompt + n × completion. The prompt pass keeps its keys/values (with their autograd history),
which are copied to the rows of the group (a broadcast, or ``index_select`` when groups differ in size: the gradient
of every row flows back into the one prompt computation); the completion pass then attends to them. The numbers are
those of the row-by-row packing (same positions, same masks — a test pins the gradient), only cheaper: with 8
completions of a 25-token prompt and 8-token answers, 33 tokens per sample become ~11.

Layout (:class:`PrefixPacked`): distinct prompts left-padded ``[G, P]``; completions right-padded ``[N, C]`` (a
row's real tokens first; the padding after them is never attended by a real token, causality sees to it);
logprobs, behavior and loss mask are ``[N, C]``, entry ``[r, t]`` scoring completion token ``t`` of row ``r``
(token 0 is scored by the prompt pass's last position). Each row is scored at its own temperature.

Buckets (:func:`shared_buckets`): groups sorted by their longest row (prompt + completion), cut where the longest
would exceed ``waste`` × the bucket's shortest, so a batch mixing 3-token arithmetic answers and 30-token
extractions does not pad the former to the latter. A group never spans two buckets.

Non-goals: sharing prefixes that are only partly equal (a tree of prompts), the supervised warm start (its
prompts are distinct).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from actors.policy import Policy, positions_from_mask

__all__ = ["PrefixPacked", "SharedRow", "pack_shared", "shared_buckets", "shared_logprobs"]

# (prompt_ids, completion_ids, behavior_logprobs | None, advantage, temperature)
SharedRow = tuple[Sequence[int], Sequence[int], Sequence[float] | None, float, float]


@dataclass(frozen=True)
class PrefixPacked:
    prompt_ids: torch.Tensor  # [G, P] distinct prompts, left-padded
    prompt_mask: torch.Tensor  # [G, P]
    row_prompt: torch.Tensor  # [N] the prompt (row of prompt_ids) of each completion
    completion_ids: torch.Tensor  # [N, C] right-padded
    loss_mask: torch.Tensor  # [N, C] float: 1 on real completion tokens
    behavior: torch.Tensor  # [N, C] behavior logprobs, 0 on padding, NaN for a row given without them
    advantages: torch.Tensor  # [N]
    temperatures: torch.Tensor  # [N]
    repeats: int = 0  # > 0: row r's prompt is r // repeats (every group that many rows, in order); 0: see row_prompt

    def to_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``'s prompt rows ``[G, …]`` copied to the completion rows ``[N, …]``. Groups of one size, in order
        (the usual batch), are a broadcast: its gradient is a sum over each group's rows, where ``index_select``'s
        is a scatter-add, several times slower on a CPU."""
        if self.repeats:
            shape = tensor.shape
            return tensor.unsqueeze(1).expand(shape[0], self.repeats, *shape[1:]).reshape(-1, *shape[1:])
        return tensor.index_select(0, self.row_prompt)


def pack_shared(rows: Sequence[SharedRow], pad_id: int, device: torch.device) -> PrefixPacked:
    prompts: dict[tuple[int, ...], int] = {}
    row_prompt = [prompts.setdefault(tuple(prompt), len(prompts)) for prompt, *_ in rows]
    width = max(len(p) for p in prompts)
    prompt_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for g, prompt in enumerate(prompts):
        prompt_ids[g, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[g, width - len(prompt) :] = 1
    length = max(1, max(len(c) for _, c, *_ in rows))
    completion_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(rows), length))
    behavior = torch.zeros((len(rows), length))
    for r, (_, completion, logprobs, _, _) in enumerate(rows):
        n = len(completion)
        if n:
            completion_ids[r, :n] = torch.tensor(list(completion), dtype=torch.long)
            loss_mask[r, :n] = 1.0
            if logprobs is not None:
                behavior[r, :n] = torch.tensor(list(logprobs), dtype=torch.float32)
            else:  # no behavior policy sampled it: importance weight 1 (see _loss.importance_weights)
                behavior[r, :n] = float("nan")
    size = len(rows) // len(prompts)
    uniform = size * len(prompts) == len(rows) and all(g == r // size for r, g in enumerate(row_prompt))
    return PrefixPacked(
        repeats=size if uniform else 0,
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        row_prompt=torch.tensor(row_prompt, dtype=torch.long, device=device),
        completion_ids=completion_ids.to(device),
        loss_mask=loss_mask.to(device),
        behavior=behavior.to(device),
        advantages=torch.tensor([r[3] for r in rows], dtype=torch.float32, device=device),
        temperatures=torch.tensor([r[4] if r[4] > 0 else 1.0 for r in rows], dtype=torch.float32, device=device),
    )


def shared_logprobs(policy: Policy, packed: PrefixPacked) -> torch.Tensor:
    """``[N, C]``: log-probability of each completion token at its row's temperature (0 on padding)."""
    width = packed.prompt_ids.shape[1]
    prompt_logits, cache = policy.forward(
        packed.prompt_ids, packed.prompt_mask, positions_from_mask(packed.prompt_mask, width), None, use_cache=True
    )
    assert cache is not None
    logits = packed.to_rows(prompt_logits[:, -1:])  # [N, 1, V]: scores completion token 0
    steps = packed.completion_ids.shape[1] - 1  # the last token's own prediction is not needed
    if steps > 0:
        rows_cache = [(packed.to_rows(k), packed.to_rows(v)) for k, v in cache]
        mask = torch.cat((packed.to_rows(packed.prompt_mask), packed.loss_mask[:, :steps].long()), dim=1)
        tail, _ = policy.forward(
            packed.completion_ids[:, :steps], mask, positions_from_mask(mask, steps), rows_cache, use_cache=False
        )
        logits = torch.cat((logits, tail), dim=1)
    logp = F.log_softmax(logits.float() / packed.temperatures.view(-1, 1, 1), dim=-1)
    picked = logp.gather(-1, packed.completion_ids.unsqueeze(-1)).squeeze(-1)
    return picked * packed.loss_mask


def shared_buckets(rows: Sequence[SharedRow], waste: float = 1.3, min_rows: int = 4) -> list[list[SharedRow]]:
    """Rows grouped by prompt (a group stays in one bucket), groups cut into buckets of similar length."""
    groups: dict[tuple[int, ...], list[SharedRow]] = {}
    for row in rows:
        groups.setdefault(tuple(row[0]), []).append(row)
    ordered = sorted(groups.values(), key=lambda g: len(g[0][0]) + max(len(r[1]) for r in g))
    buckets: list[list[SharedRow]] = []
    current: list[SharedRow] = []
    shortest = 0
    for group in ordered:
        longest = len(group[0][0]) + max(len(r[1]) for r in group)
        if current and len(current) >= min_rows and longest > waste * shortest:
            buckets.append(current)
            current = []
        if not current:
            shortest = longest
        current.extend(group)
    if current:
        buckets.append(current)
    return buckets
