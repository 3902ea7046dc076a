"""The learner's weight average: an exponential moving average of the policy's weights, updated after every RL step
(Polyak averaging). Held-out rounds measure it and the export at stop is it (`LearnerConfig.ema_decay`).

Why: at a rate that learns quickly, consecutive steps of a small model move its greedy answers back and forth —
one held-out round reads 77 %, the next 68 %, the one after 78 %, with no sign of it in the training. The average
of the last ~1/(1 - decay) steps' weights keeps what they agree on and cancels what they do not; the policy that
trains is untouched (generators keep sampling the current weights, apart from the seconds they decode a round).

The decay is ramped in, ``min(decay, (1 + n) / (10 + n))`` at the n-th update (as TensorFlow's
``ExponentialMovingAverage`` does with ``num_updates``): the first updates follow the weights closely, so the
average does not lag behind a policy that moves fast right after the warm start.

Non-goals: averaging the optimizer's state, or serving the average to the generators that train (tried:
generators sampling from an average ~20 steps behind made the policy oscillate more, bench/RESULTS.md).
"""

from __future__ import annotations

import copy

import torch

from actors.policy import Policy

__all__ = ["WeightAverage"]


class WeightAverage:
    """A copy of ``policy`` whose parameters follow the live ones as an exponential moving average."""

    def __init__(self, policy: Policy, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"expected a decay in (0, 1), got {decay}")
        self.decay = decay
        self.updates = 0  # how many steps the average holds (the ramp's n; a checkpoint keeps it)
        self.policy = copy.deepcopy(policy)
        for p in self.policy.weights.parameters():
            p.requires_grad_(False)
        self._pairs = [(self.policy.state_dict()[name], live) for name, live in policy.state_dict().items()]

    def decay_at(self, n: int) -> float:
        """The decay of the n-th update (n ≥ 1): ramped in from 2/11, then ``decay``."""
        return min(self.decay, (1 + n) / (10 + n))

    def update(self) -> None:
        """Move the average towards the live weights by one step."""
        self.updates += 1
        weight = 1.0 - self.decay_at(self.updates)
        with torch.no_grad():
            for average, live in self._pairs:  # the policy's parameters: all floating point
                average.lerp_(live, weight)

    def reset(self) -> None:
        """Start over from the live weights (after a warm start, or a restore from a checkpoint without one)."""
        self.updates = 0
        with torch.no_grad():
            for average, live in self._pairs:
                average.copy_(live)
