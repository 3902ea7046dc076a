"""The decoupled PPO loss against hand-computed values (the formulas in `actors.learner._loss`)."""

from __future__ import annotations

import math

import pytest
import torch

from actors.learner import PPOConfig, decoupled_ppo_loss, importance_weights, k3_kl


def _t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_iw_is_one_when_behavior_equals_proximal() -> None:
    lp = _t([-1.0, -2.0, -0.5])
    assert torch.allclose(importance_weights(lp, lp, cap=3.0), torch.ones_like(lp))


def test_iw_is_capped() -> None:
    prox = _t([0.0, 0.0])
    behavior = _t([-math.log(10.0), -math.log(2.0)])  # ratios 10 and 2
    iw = importance_weights(prox, behavior, cap=3.0)
    assert iw.tolist()[0] == [3.0, pytest.approx(2.0)]


def test_iw_is_one_where_no_behavior_policy_sampled() -> None:
    prox = _t([-1.0, -0.5, -2.0])
    behavior = _t([-1.5, math.nan, -2.0])  # the second token is a reference answer's: no behavior logprob
    assert importance_weights(prox, behavior, cap=3.0).tolist()[0] == [pytest.approx(math.exp(0.5)), 1.0, 1.0]


def test_on_policy_positive_advantage_increases_logprob() -> None:
    logits = torch.zeros(1, 1, 4, dtype=torch.float64, requires_grad=True)
    token = torch.tensor([[2]])
    logprobs = torch.log_softmax(logits, -1).gather(-1, token[..., None])[..., 0]
    frozen = logprobs.detach()
    loss, _ = decoupled_ppo_loss(
        logprobs, frozen, frozen, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 1), PPOConfig()
    )
    loss.backward()
    assert logits.grad is not None
    # gradient descent moves the logit of the sampled token up, the others down
    assert logits.grad[0, 0, 2] < 0
    assert all(logits.grad[0, 0, i] > 0 for i in (0, 1, 3))


def test_hand_computed_value_with_clipping_and_truncation() -> None:
    cfg = PPOConfig(clip_low=0.2, clip_high=0.2, iw_cap=2.0)
    # token 0: ratio 1.5 (clipped to 1.2 for A>0), iw = e^{0.5} = 1.6487
    # token 1: ratio 0.5 (A>0 → min picks 0.5, unclipped), iw = e^{1.0} capped to 2
    # token 2: padding (masked)
    prox = _t([-1.0, -1.0, -1.0])
    cur = prox + torch.log(_t([1.5, 0.5, 7.0]))
    behavior = _t([-1.5, -2.0, -9.0])
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    loss, stats = decoupled_ppo_loss(cur, prox, behavior, torch.tensor([2.0], dtype=torch.float64), mask, cfg)
    expected = -(math.exp(0.5) * 1.2 * 2.0 + 2.0 * 0.5 * 2.0) / 2
    assert loss.item() == pytest.approx(expected)
    assert stats.tokens == 2
    assert stats.iw_truncated_frac == pytest.approx(0.5)
    assert stats.clipped_frac == pytest.approx(0.5)
    assert stats.iw_max == pytest.approx(2.0)


def test_negative_advantage_clips_on_the_low_side() -> None:
    cfg = PPOConfig(clip_low=0.2, clip_high=0.2, iw_cap=5.0)
    prox = _t([-1.0])
    cur = prox + math.log(0.5)  # ratio 0.5 → clipped 0.8; A<0: min(0.5·-1, 0.8·-1) = -0.8
    loss, stats = decoupled_ppo_loss(cur, prox, prox, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(0.8)
    assert stats.clipped_frac == 1.0


def test_empty_mask_gives_zero_loss_not_nan() -> None:
    lp = _t([-1.0, -2.0]).requires_grad_()
    loss, stats = decoupled_ppo_loss(
        lp, lp.detach(), lp.detach(), torch.tensor([1.0], dtype=torch.float64), torch.zeros(1, 2), PPOConfig()
    )
    assert loss.item() == 0.0 and not math.isnan(loss.item())
    loss.backward()
    assert stats.tokens == 0


def test_k3_kl_is_zero_at_reference_and_positive_elsewhere() -> None:
    lp = _t([-1.0, -2.0])
    assert torch.allclose(k3_kl(lp, lp), torch.zeros_like(lp))
    assert (k3_kl(lp, lp - 0.3) > 0).all()


def test_kl_term_is_added_with_its_coefficient() -> None:
    prox = _t([-1.0])
    ref = _t([-1.5])
    cfg = PPOConfig(kl_coef=0.5)
    loss, stats = decoupled_ppo_loss(
        prox, prox, prox, torch.tensor([0.0], dtype=torch.float64), torch.ones(1, 1), cfg, ref_logprobs=ref
    )
    kl = math.exp(-0.5) + 0.5 - 1
    assert stats.kl == pytest.approx(kl)
    assert loss.item() == pytest.approx(0.5 * kl)


@pytest.mark.parametrize("kwargs", [{"clip_low": 0.0}, {"clip_low": 1.0}, {"iw_cap": 0.5}, {"kl_coef": -1.0}])
def test_config_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PPOConfig(**kwargs)


def test_seq_mean_gives_every_completion_the_same_weight() -> None:
    """Row 0 has 1 token with loss 4, row 1 has 3 tokens with loss 1: token-mean (4+3)/4, seq-mean (4+1)/2."""
    from actors.learner._loss import aggregate

    values = torch.tensor([[0.0, 0.0, 4.0], [1.0, 1.0, 1.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # row 2: padding only, no say
    assert float(aggregate(values, mask, "token-mean")) == pytest.approx(7 / 4)
    assert float(aggregate(values, mask, "seq-mean")) == pytest.approx(5 / 2)
    assert float(aggregate(values, torch.zeros_like(mask), "seq-mean")) == 0.0


def test_seq_mean_loss_of_one_sided_advantages() -> None:
    """On-policy (ratio 1, iw 1), the loss is −A aggregated: seq-mean averages per completion first."""
    logprobs = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[0.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    advantages = torch.tensor([2.0, -1.0])
    token, _ = decoupled_ppo_loss(logprobs, logprobs.detach(), torch.zeros(2, 3), advantages, mask, PPOConfig())
    seq, _ = decoupled_ppo_loss(
        logprobs, logprobs.detach(), torch.zeros(2, 3), advantages, mask, PPOConfig(aggregate="seq-mean")
    )
    assert float(token) == pytest.approx(-(2.0 - 3.0) / 4)
    assert float(seq) == pytest.approx(-(2.0 - 1.0) / 2)


def test_behavior_kl_measures_the_drift_since_sampling_untruncated_and_ignores_reference_rows() -> None:
    prox = torch.tensor([[math.log(0.5), math.log(0.5)], [math.log(0.5), 0.0]])
    behavior = torch.tensor([[math.log(0.5), math.log(0.05)], [float("nan"), 0.0]])  # r = 1, 10 (over the cap of 3)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    _, stats = decoupled_ppo_loss(prox, prox, behavior, torch.ones(2), mask, PPOConfig(iw_cap=3.0))
    assert stats.behavior_kl == pytest.approx((0.0 + (10 - 1 - math.log(10))) / 2)
    _, same = decoupled_ppo_loss(prox, prox, prox, torch.ones(2), mask, PPOConfig())
    assert same.behavior_kl == pytest.approx(0.0)


def test_behavior_anchor_costs_nothing_on_policy_in_value_and_gradient() -> None:
    """π_θ = μ on every sampled token: the loss and its gradient are those without the anchor."""
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 6, (3, 4))
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    advantages = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    results = []
    for coef in (0.0, 1.0):
        logits.grad = None
        logprobs = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
        loss, _ = decoupled_ppo_loss(
            logprobs, logprobs.detach(), logprobs.detach(), advantages, mask, PPOConfig(behavior_kl_coef=coef)
        )
        loss.backward()
        assert logits.grad is not None
        results.append((loss.item(), logits.grad.clone()))
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-12)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-12)


def test_behavior_anchor_pulls_back_a_token_the_importance_weight_gave_up_on() -> None:
    """μ sampled the token with p 0.5; the learner has drifted to 0.5·e⁻¹⁰. The importance weight is ~e⁻¹⁰, so the
    policy-gradient term no longer moves the token; the anchor pulls it up with force β(1 − r) ≈ β."""
    behavior = _t([math.log(0.5)])
    drifted = math.log(0.5) - 10.0
    grads = []
    for coef in (0.0, 0.5):
        logprobs = _t([drifted]).requires_grad_(True)
        loss, stats = decoupled_ppo_loss(
            logprobs,
            logprobs.detach(),
            behavior,
            torch.tensor([-1.0], dtype=torch.float64),  # thumbs down: the policy gradient would push it further down
            torch.ones(1, 1, dtype=torch.float64),
            PPOConfig(behavior_kl_coef=coef),
        )
        loss.backward()
        assert logprobs.grad is not None
        grads.append(float(logprobs.grad[0, 0]))
        assert stats.behavior_kl == pytest.approx(math.exp(-10) - 1 + 10)
    r = math.exp(-10.0)
    assert abs(grads[0]) < 1e-4  # without the anchor: nothing pulls it back
    assert grads[1] == pytest.approx(grads[0] + 0.5 * (r - 1.0))  # gradient descent raises log π_θ by ~β
    assert grads[1] < -0.49


def test_behavior_anchor_value_by_hand_and_reference_rows_have_none() -> None:
    """Row 0: r = 2 and r = 1/2 on two sampled tokens; row 1: a reference answer (NaN behavior), no anchor, and
    a finite gradient (a NaN in the branch torch.where drops would still poison it)."""
    logprobs = _t([-1.0, -1.0], [-0.7, -0.2]).requires_grad_(True)
    behavior = _t([-1.0 - math.log(2.0), -1.0 + math.log(2.0)], [math.nan, math.nan])
    mask = torch.ones(2, 2, dtype=torch.float64)
    zero = torch.zeros(2, dtype=torch.float64)  # no advantage: the loss is the anchor alone
    loss, _ = decoupled_ppo_loss(logprobs, logprobs.detach(), behavior, zero, mask, PPOConfig(behavior_kl_coef=0.3))
    k3 = (2.0 - 1.0 - math.log(2.0)) + (0.5 - 1.0 + math.log(2.0))
    assert loss.item() == pytest.approx(0.3 * k3 / 4)
    loss.backward()
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[1].abs().max() == 0.0
    assert logprobs.grad[0].tolist() == pytest.approx([0.3 * (2.0 - 1.0) / 4, 0.3 * (0.5 - 1.0) / 4])


@pytest.mark.parametrize("coef", [-0.1, math.nan, math.inf])
def test_config_rejects_a_behavior_kl_coef_that_is_not_a_finite_number_at_least_zero(coef: float) -> None:
    with pytest.raises(ValueError, match="behavior_kl_coef"):
        PPOConfig(behavior_kl_coef=coef)
