"""The warm start's learning-rate schedule and the length-bucketed supervised step."""

from __future__ import annotations

import math

import pytest
import torch

from actors.learner import PPOConfig, Trainer
from actors.learner._trainer import _length_buckets
from actors.learner._warmstart import FINAL_LR_FRACTION, lr_at
from actors.policy import GPTConfig, Policy


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    steps, peak = 200, 4e-3
    rates = [lr_at(s, steps, peak) for s in range(1, steps + 1)]
    assert rates[0] < peak / 5  # warmup starts small
    assert max(rates) == pytest.approx(peak)
    assert rates[-1] == pytest.approx(peak * FINAL_LR_FRACTION)
    top = rates.index(max(rates))
    assert all(a >= b for a, b in zip(rates[top:], rates[top + 1 :], strict=False))  # monotone decay
    assert lr_at(1, 1, peak) == pytest.approx(peak) and all(math.isfinite(lr_at(s, 3, peak)) for s in (1, 2, 3))


def test_length_buckets_keep_every_row_in_order() -> None:
    rows = sorted(([1] * n, [2] * 2) for n in (3, 3, 4, 5, 9, 10, 11, 30, 31, 33, 60))
    buckets = _length_buckets(rows, min_rows=2)
    assert [r for b in buckets for r in b] == rows
    assert len(buckets) > 1 and all(len(b) >= 2 or b is buckets[-1] for b in buckets)


def test_bucketed_sft_step_equals_one_padded_batch() -> None:
    """Accumulating per-bucket token sums over the batch's token count is the same loss and gradient."""
    pairs = [
        ("1+2=", "3"),
        ("name=Ada;age=36;city=Rome?age,city", '{"age":36,"city":"Rome"}'),
        ("7+5+9+3=", "24"),
        ("3 5 2 -> 17 (python, +-*):", "3*5+2"),
        ("9+9=", "18"),
    ]
    grads = []
    losses = []
    for bucketed in (False, True):
        policy = Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2), seed=0)
        trainer = Trainer(policy, lr=1e-3, ppo=PPOConfig(), grad_clip=1e9)
        optimizer = torch.optim.SGD(trainer.params, lr=0.0)
        if bucketed:
            losses.append(trainer.sft_step(optimizer, pairs))
        else:
            loss = trainer.sft_loss(pairs)
            loss.backward()  # type: ignore[no-untyped-call]
            losses.append(float(loss.detach()))
        grads.append(torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
