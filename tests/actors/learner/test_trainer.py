"""Trainer and warm start: real optimizer steps on a tiny GPT."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from actors.domains import Domain, DomainSampler, open_source
from actors.learner import PPOConfig, Trainer, TrainSample, reference_pairs, warm_start
from actors.policy import GPTConfig, Policy, encode_completion, encode_prompt


def tiny() -> Policy:
    return Policy.tiny_gpt(GPTConfig(n_layer=1, n_embd=32, n_head=2), seed=0)


def arithmetic() -> dict[str, Domain]:
    return {"arithmetic": Domain("arithmetic", open_source("builtin:arithmetic", domain="arithmetic"), weight=1.0)}


def test_warm_start_lowers_reference_loss() -> None:
    torch.manual_seed(0)
    trainer = Trainer(tiny(), lr=1e-5, ppo=PPOConfig(), grad_clip=1.0)
    probe = reference_pairs(DomainSampler(arithmetic(), random.Random(99)), 64)
    with torch.no_grad():
        before = float(trainer.sft_loss(probe))
    result = warm_start(trainer, arithmetic(), steps=40, lr=3e-3, batch_size=16)
    with torch.no_grad():
        after = float(trainer.sft_loss(probe))
    assert result.steps == 40 and not result.skipped_reason
    assert after < before - 1.0, (before, after)  # from ~ln(101) ≈ 4.6 nats per token to well below


def test_positive_advantage_raises_the_sampled_tokens_logprob() -> None:
    policy = tiny()
    tok = policy.tokenizer
    prompt, completion = encode_prompt(tok, "2+2="), encode_completion(tok, "4")
    ids = torch.tensor([prompt + completion])

    def logprob() -> float:
        with torch.no_grad():
            return float(policy.token_logprobs(ids)[0, -len(completion) :].sum())

    before = logprob()
    behavior = policy.token_logprobs(ids)[0, -len(completion) :].tolist()  # on-policy: μ = π_prox = π_θ
    trainer = Trainer(policy, lr=1e-2, ppo=PPOConfig(), grad_clip=1.0)
    stats = trainer.rl_step([TrainSample(prompt, completion, behavior, advantage=1.0, temperature=1.0)])
    assert logprob() > before
    assert abs(stats.iw_mean - 1.0) < 1e-4 and stats.tokens == len(completion)


def test_a_reference_answer_without_behavior_logprobs_trains_with_weight_one() -> None:
    policy = tiny()
    tok = policy.tokenizer
    prompt, reference = encode_prompt(tok, "2+2="), encode_completion(tok, "4")
    wrong = encode_completion(tok, "5")
    ids = torch.tensor([prompt + reference])

    def logprob() -> float:
        with torch.no_grad():
            return float(policy.token_logprobs(ids)[0, -len(reference) :].sum())

    before = logprob()
    behavior = policy.token_logprobs(torch.tensor([prompt + wrong]))[0, -len(wrong) :].tolist()
    trainer = Trainer(policy, lr=1e-2, ppo=PPOConfig(), grad_clip=1.0)
    stats = trainer.rl_step(
        [
            TrainSample(prompt, reference, None, advantage=1.0, temperature=1.0),
            TrainSample(prompt, wrong, behavior, advantage=-1.0, temperature=1.0),
        ]
    )
    assert logprob() > before and math.isfinite(stats.loss)
    assert abs(stats.iw_mean - 1.0) < 1e-4  # the sampled row is on-policy, the reference row has weight 1


def test_empty_batch_is_a_no_op_without_nan() -> None:
    policy = tiny()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    stats = Trainer(policy, lr=1e-2, ppo=PPOConfig(), grad_clip=1.0).rl_step([])
    assert stats.samples == 0 and stats.loss == 0.0
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def row_logprobs(policy: Policy, ids: torch.Tensor, attn: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """Reference: ``Policy.token_logprobs`` of whole left-padded rows, one forward per distinct temperature."""
    out = torch.zeros(ids.shape[0], ids.shape[1] - 1)
    for value in {float(t) for t in temps.tolist()}:
        index = (temps == value).nonzero().flatten()
        out = out.index_copy(0, index, policy.token_logprobs(ids[index], attn[index], temperature=value))
    return out


def test_rows_with_different_temperatures_score_like_alone() -> None:
    from actors.learner._prefix import pack_shared, shared_logprobs

    policy = tiny()
    tok = policy.tokenizer
    a = (encode_prompt(tok, "1+1="), encode_completion(tok, "2"))
    b = (encode_prompt(tok, "10+10="), encode_completion(tok, "20"))
    packed = pack_shared([(a[0], a[1], None, 0.0, 1.0), (b[0], b[1], None, 0.0, 0.5)], tok.pad_id, policy.device)
    with torch.no_grad():
        both = shared_logprobs(policy, packed)
        for row, (prompt, completion), temperature in ((0, a, 1.0), (1, b, 0.5)):
            alone = policy.token_logprobs(torch.tensor([prompt + completion]), temperature=temperature)
            n = len(completion)
            assert torch.allclose(both[row, :n], alone[0, -n:], atol=1e-5)


def test_groups_of_one_size_are_broadcast_to_their_rows_with_the_same_numbers() -> None:
    """The prompt pass's keys and values reach a group's rows by a broadcast when every group has the same number of
    rows, in order (its gradient a sum, not index_select's scatter-add): the logprobs and the gradient are the
    same as by index; any other layout goes by index."""
    import dataclasses

    from actors.learner._prefix import pack_shared, shared_logprobs

    policy = tiny()
    tok = policy.tokenizer
    prompts = [encode_prompt(tok, f"{a}+{a}=") for a in (3, 14)]
    rows = [(p, encode_completion(tok, answer), None, 0.0, 1.0) for p in prompts for answer in ("6", "28", "7")]
    packed = pack_shared(rows, tok.pad_id, policy.device)
    assert packed.repeats == 3
    assert pack_shared(rows[:5], tok.pad_id, policy.device).repeats == 0  # groups of 3 and 2
    assert pack_shared([rows[0], rows[3], rows[1], rows[4]], tok.pad_id, policy.device).repeats == 0  # interleaved
    results = []
    for layout in (packed, dataclasses.replace(packed, repeats=0)):
        policy.module.zero_grad(set_to_none=True)
        logp = shared_logprobs(policy, layout)
        (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in policy.module.parameters() if p.grad is not None]))
    (broadcast, grads_b), (indexed, grads_i) = results
    assert torch.allclose(broadcast, indexed, atol=1e-6)
    assert len(grads_b) == len(grads_i) > 0
    for a, b in zip(grads_b, grads_i, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def _mixed_length_samples(policy: Policy, group: int = 1) -> list[TrainSample]:
    """12 rows from 6 to ~60 tokens (several length buckets); consecutive ``group`` rows share their prompt."""
    tok = policy.tokenizer
    rng = random.Random(3)
    samples: list[TrainSample] = []
    for i in range(12):
        prompt = (
            list(samples[-1].prompt_ids)
            if i % group
            else encode_prompt(tok, "".join(rng.choice("qwe") for _ in range(rng.randint(2, 30))) + "=")
        )
        completion = encode_completion(tok, "a" * rng.randint(1, 25))
        with torch.no_grad():
            behavior = policy.token_logprobs(torch.tensor([prompt + completion]))[0, -len(completion) :].tolist()
        samples.append(TrainSample(prompt, completion, behavior, advantage=(-1.0) ** i * (1 + i / 10), temperature=1.0))
    return samples


@pytest.mark.parametrize("aggregate", ["token-mean", "seq-mean"])
@pytest.mark.parametrize(
    ("groups", "model"),
    [(1, "builtin"), (4, "builtin"), (4, "hf")],
    ids=["distinct-prompts", "groups-of-4", "groups-of-4-hf-gpt2"],
)
def test_bucketed_step_has_the_gradient_of_one_padded_batch(
    aggregate: str, groups: int, model: str, tmp_path: Path
) -> None:
    """Length buckets and shared prompts are a speed-up only: the gradient is the whole batch's (token mean, or mean
    over completions of each one's token mean), as if every row were packed whole in one padded batch."""
    from actors.learner import decoupled_ppo_loss
    from actors.learner._trainer import pack

    if model == "hf":
        from actors.policy import write_tiny_hf_model

        policy = Policy.from_spec({"model": f"hf:{write_tiny_hf_model(tmp_path / 'm', n_layer=2, n_embd=32)}"})
    else:
        policy = tiny()
    samples = _mixed_length_samples(policy, groups)
    config = PPOConfig(aggregate=aggregate)  # type: ignore[arg-type]
    trainer = Trainer(policy, lr=1e-2, ppo=config, grad_clip=1e9)
    assert len(trainer._packed_buckets(samples)) > 1
    trainer.optimizer.step = lambda *a, **k: None  # type: ignore[method-assign]  # keep the weights, read the grads
    trainer.rl_step(samples)
    bucketed = [p.grad.clone() for p in trainer.params if p.grad is not None]

    packed = pack(
        [(s.prompt_ids, s.token_ids, s.behavior_logprobs, s.advantage, s.temperature) for s in samples],
        policy.tokenizer.pad_id,
        policy.device,
    )
    policy.module.zero_grad(set_to_none=True)
    current = row_logprobs(policy, packed.input_ids, packed.attention_mask, packed.temperatures)
    loss, _ = decoupled_ppo_loss(
        current, current.detach(), packed.behavior, packed.advantages, packed.loss_mask, config
    )
    loss.backward()
    whole = [p.grad.clone() for p in trainer.params if p.grad is not None]
    assert len(bucketed) == len(whole)
    for a, b in zip(bucketed, whole, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_several_updates_per_batch_measure_ratios_against_the_step_start() -> None:
    policy = tiny()
    samples = _mixed_length_samples(policy)
    stats = Trainer(policy, lr=3e-3, ppo=PPOConfig(), grad_clip=1.0, ppo_epochs=2, minibatches=2).rl_step(samples)
    assert stats.samples == len(samples) and stats.tokens == sum(len(s.token_ids) for s in samples)
    assert stats.ratio_mean != 1.0  # the second epoch sees weights moved away from the proximal ones
    assert abs(stats.iw_mean - 1.0) < 1e-4  # behavior = proximal: the samples were drawn from these weights


def test_dropout_of_a_hugging_face_model_stays_off_in_training(tmp_path: Path) -> None:
    """GPT-2 configs carry dropout; the learner's logprobs must be those of the policy the generators sample."""
    from actors.policy import write_tiny_hf_model

    model_dir = write_tiny_hf_model(tmp_path / "m", n_layer=1, n_embd=32, n_head=2)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["resid_pdrop"] > 0 and config["attn_pdrop"] > 0  # the premise: dropout is configured
    policy = Policy.from_spec({"model": f"hf:{model_dir}"})
    tok = policy.tokenizer
    prompt, completion = encode_prompt(tok, "2+2="), encode_completion(tok, "4")
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        behavior = policy.token_logprobs(ids)[0, -len(completion) :].tolist()
    trainer = Trainer(policy, lr=1e-12, ppo=PPOConfig(), grad_clip=1.0)
    stats = [
        trainer.rl_step([TrainSample(prompt, completion, behavior, advantage=1.0, temperature=1.0)]) for _ in range(3)
    ]
    # with dropout on, every step's logprobs (hence the importance weight) would be randomly off
    assert all(abs(s.iw_mean - 1.0) < 1e-5 and s.iw_max < 1.0 + 1e-5 for s in stats), stats
    losses = [trainer.sft_step(trainer.optimizer, [("2+2=", "4")]) for _ in range(3)]
    assert max(losses) - min(losses) < 1e-6 and not any(m.training for m in policy.module.modules())


def test_two_epochs_take_the_proximal_logprobs_from_the_first_forward() -> None:
    """ppo_epochs: 2 runs 2 forwards per bucket, not 3, and lands on the weights of the textbook step: proximal
    logprobs from a no-grad pass before any update, then two updates of the whole batch against them."""
    import copy
    import dataclasses

    from actors.learner import decoupled_ppo_loss
    from actors.learner._trainer import pack

    policy = tiny()
    samples = [
        dataclasses.replace(s, behavior_logprobs=[b - 0.3 for b in s.behavior_logprobs]) if i % 3 else s
        for i, s in enumerate(_mixed_length_samples(policy, group=2))
    ]  # some off-policy: iw ≠ 1
    textbook = copy.deepcopy(policy)
    config = PPOConfig(
        clip_low=0.05, clip_high=0.05
    )  # tight: the second epoch's ratios get clipped, proximal errors would show

    trainer = Trainer(policy, lr=3e-3, ppo=config, grad_clip=1e9, ppo_epochs=2)
    calls = 0
    forward = trainer._logprobs

    def counted(p: Policy, packed: object) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return forward(p, packed)  # type: ignore[arg-type]

    trainer._logprobs = counted  # type: ignore[method-assign]
    stats = trainer.rl_step(samples)
    assert calls == 2 * len(trainer._packed_buckets(samples))
    assert stats.clipped_frac > 0

    packed = pack(
        [(s.prompt_ids, s.token_ids, s.behavior_logprobs, s.advantage, s.temperature) for s in samples],
        textbook.tokenizer.pad_id,
        textbook.device,
    )
    params = [p for p in textbook.weights.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
    with torch.no_grad():
        proximal = row_logprobs(textbook, packed.input_ids, packed.attention_mask, packed.temperatures)
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        current = row_logprobs(textbook, packed.input_ids, packed.attention_mask, packed.temperatures)
        loss, _ = decoupled_ppo_loss(current, proximal, packed.behavior, packed.advantages, packed.loss_mask, config)
        loss.backward()
        optimizer.step()
    for (name, a), b in zip(policy.state_dict().items(), textbook.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=2e-5), name


def test_fused_adamw_takes_the_default_implementations_step() -> None:
    from actors.learner._trainer import adamw

    torch.manual_seed(0)
    start = [torch.randn(5, 3), torch.randn(7)]
    grads = [[torch.randn_like(t) for t in start] for _ in range(3)]
    results = []
    for make in (adamw, lambda ps, **kw: torch.optim.AdamW(ps, **kw)):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        optimizer = make(params, lr=1e-2, weight_decay=0.01)
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g.clone()
            optimizer.step()
        results.append(([p.detach() for p in params], optimizer.param_groups[0]["fused"]))
    (fused_params, fused), (default_params, _) = results
    assert fused is True  # torch has a fused CPU AdamW (2.4+): the trainer uses it
    for a, b in zip(fused_params, default_params, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_behavior_anchor_keeps_the_learner_near_a_held_behavior_policy() -> None:
    """The gate holds the served version μ: every step trains on μ's samples again. Without the anchor the learner
    walks away from μ step after step; with it, it stays near."""

    def drift(coef: float) -> float:
        policy = tiny()
        samples = _mixed_length_samples(policy)  # μ: the policy before any step
        trainer = Trainer(policy, lr=1e-2, ppo=PPOConfig(behavior_kl_coef=coef), grad_clip=1.0)
        stats = [trainer.rl_step(samples) for _ in range(25)]
        return stats[-1].behavior_kl  # k3 KL(μ ‖ learner) before the last step

    free, anchored = drift(0.0), drift(1.0)
    assert free > 0.3, free
    assert anchored < free / 2, (anchored, free)


def test_bfloat16_mixed_steps_keep_float32_weights_and_score_like_float32() -> None:
    """Autocast runs the matmuls in bfloat16 (emulated where the CPU lacks it: correct, only slower); the weights,
    their gradients and the optimizer stay float32, and the logprobs stay within bfloat16's rounding of float32's."""
    from actors.learner._prefix import pack_shared, shared_buckets

    torch.manual_seed(0)
    tok = tiny().tokenizer
    prompt = encode_prompt(tok, "12+30=")
    rows = [(prompt, encode_completion(tok, answer), None, adv, 1.0) for answer, adv in (("42", 1.0), ("41", -1.0))]
    samples = [TrainSample(p, c, None, a, t) for p, c, _, a, t in rows]
    plain = Trainer(tiny(), lr=1e-3, ppo=PPOConfig(), grad_clip=1.0)
    mixed = Trainer(tiny(), lr=1e-3, ppo=PPOConfig(), grad_clip=1.0, autocast=torch.bfloat16)
    (packed,) = [pack_shared(bucket, tok.pad_id, torch.device("cpu")) for bucket in shared_buckets(rows)]
    with torch.no_grad():
        exact, rounded = plain._logprobs(plain.policy, packed), mixed._logprobs(mixed.policy, packed)
    assert rounded.dtype == torch.float32
    assert 0 < float((exact - rounded).abs().max()) < 0.05  # computed in bfloat16, and close
    before = {n: p.detach().clone() for n, p in mixed.policy.weights.named_parameters()}
    stats = mixed.rl_step(samples)
    assert math.isfinite(stats.loss) and stats.grad_norm > 0
    for name, param in mixed.policy.weights.named_parameters():
        assert param.dtype == torch.float32, name
        assert param.grad is None or param.grad.dtype == torch.float32, name
    assert any(not torch.equal(before[n], p) for n, p in mixed.policy.weights.named_parameters())


def test_native_bfloat16_answers_for_the_device_at_hand() -> None:
    from actors.policy import native_bfloat16

    assert isinstance(native_bfloat16(torch.device("cpu")), bool)
    assert native_bfloat16(torch.device("meta")) is False
    if not torch.cuda.is_available():
        assert native_bfloat16(torch.device("cuda")) is False
