"""bench/trl_grpo.py: the peer's position-id fix makes a left-padded row score as it would unpadded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from actors.policy import write_tiny_hf_model
from bench.trl_grpo import best_at_edge, correct, positions_from_mask, tail_mean

transformers = pytest.importorskip("transformers")


def _logprobs(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]


def test_a_left_padded_row_scores_its_tokens_as_unpadded_once_positions_come_from_the_mask(tmp_path: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(write_tiny_hf_model(tmp_path / "m", arch="gpt2", max_positions=32, bos=True))
    ).eval()
    row = torch.tensor([[2, 10, 11, 12, 13, 14]])
    padded = torch.cat([torch.zeros((1, 3), dtype=torch.long), row], dim=1)
    padded_mask = torch.cat([torch.zeros((1, 3), dtype=torch.long), torch.ones_like(row)], dim=1)
    with torch.no_grad():
        alone = _logprobs(model, row, torch.ones_like(row))
        unfixed = _logprobs(model, padded, padded_mask)[:, 3:]
        fixed = _logprobs(positions_from_mask(model), padded, padded_mask)[:, 3:]
    assert (unfixed - alone).abs().max() > 1e-3  # the handicap the fix removes: GPT-2 counted the padding
    torch.testing.assert_close(fixed, alone, atol=1e-5, rtol=1e-5)


def test_the_reward_rule_compares_numbers() -> None:
    assert correct(" 95", "95") and correct("95.0", "95")
    assert not correct("9", "95") and not correct("", "95") and not correct("nan", "95")


def test_the_sweep_ranks_runs_by_their_last_three_greedy_rounds() -> None:
    evals = [{"greedy": g, "sampled": 0.0} for g in (0.1, 0.9, 0.5, 0.6, 0.7)]
    assert tail_mean(evals) == pytest.approx(0.6)


def test_a_sweeps_best_rate_at_either_end_of_its_range_is_flagged() -> None:
    rates = [2e-5, 5e-5, 1e-4, 2e-4, 4e-4]
    assert not best_at_edge(rates, 2e-4)
    assert best_at_edge(rates, 4e-4) and best_at_edge(rates, 2e-5)
    assert best_at_edge([4e-4, 1e-4, 2e-4], 4e-4)  # in the order given, not sorted
    assert not best_at_edge([1e-4], 1e-4)  # one rate given: nothing was swept
