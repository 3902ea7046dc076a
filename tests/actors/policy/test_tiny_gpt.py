import pytest
import torch

from actors.policy import PRESETS, GPTConfig, TinyGPT, positions_from_mask


def _model(seed: int = 0) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(GPTConfig(n_layer=2, n_embd=64, n_head=4)).eval()


def test_presets_span_one_to_a_hundred_million_parameters() -> None:
    counts = {}
    for name, preset in PRESETS.items():
        with torch.device("meta"):
            model = TinyGPT(GPTConfig(**preset))
        counts[name] = sum(p.numel() for p in model.parameters())
    assert 0.8e6 <= counts["tiny"] <= 1.2e6
    assert 8e6 <= counts["small"] <= 12e6
    assert 80e6 <= counts["medium"] <= 110e6


def test_incremental_cache_matches_full_forward() -> None:
    model = _model()
    ids = torch.randint(0, 101, (2, 12))
    full, _ = model(ids)
    logits_a, cache = model(ids[:, :7], use_cache=True)
    pieces = [logits_a]
    for t in range(7, 12):
        step, cache = model(ids[:, t : t + 1], attention_mask=torch.ones(2, t + 1), cache=cache, use_cache=True)
        pieces.append(step)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)


def test_left_padding_does_not_change_a_rows_logits() -> None:
    model = _model()
    ids = torch.randint(4, 101, (1, 9))
    alone, _ = model(ids)
    padded = torch.cat((torch.zeros(1, 4, dtype=torch.long), ids), dim=1)
    mask = torch.cat((torch.zeros(1, 4), torch.ones(1, 9)), dim=1)
    batched, _ = model(padded, attention_mask=mask)
    torch.testing.assert_close(batched[:, 4:], alone, atol=1e-5, rtol=1e-5)


def test_positions_count_real_tokens_only() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert positions_from_mask(mask, 5).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert positions_from_mask(mask, 2).tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_embd": 65, "n_head": 4}, "not divisible"),
        ({"n_embd": 12, "n_head": 4}, "must be even"),
        ({"n_layer": 0}, "n_layer"),
    ],
)
def test_config_errors_name_the_field(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GPTConfig(**kwargs)
