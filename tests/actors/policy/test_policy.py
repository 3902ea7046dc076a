from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from actors.policy import CharTokenizer, GPTConfig, Policy, StateDictError

SMALL = {"n_layer": 2, "n_embd": 64, "n_head": 4}


def test_from_spec_builds_the_builtin_model() -> None:
    policy = Policy.from_spec({"model": "builtin:tiny-gpt", "config": {**SMALL, "block_size": 128}})
    assert policy.kind == "builtin"
    assert isinstance(policy.tokenizer, CharTokenizer)
    assert policy.max_context == 128
    assert policy.vocab_size == policy.tokenizer.vocab_size


def test_from_spec_accepts_attribute_objects_and_presets() -> None:
    class Spec:
        def __init__(self) -> None:
            self.model = "builtin:tiny-gpt"
            self.config = {"preset": "tiny"}
            self.checkpoint = None

    assert 0.8e6 < Policy.from_spec(Spec()).num_parameters() < 1.2e6


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"model": "gpt5"}, "expected 'builtin:tiny-gpt' or 'hf:<model dir>'"),
        ({"config": {"n_layers": 2}}, "unknown key 'n_layers'"),
        ({"config": {"preset": "huge"}}, "policy.config.preset"),
        ({"config": {"dtype": "int8"}}, "policy.config.dtype"),
        ({"model": "hf:/nonexistent/dir"}, "does not exist"),
    ],
)
def test_from_spec_errors_are_one_line(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        Policy.from_spec(spec)
    assert "\n" not in str(info.value)


def test_state_dict_round_trip_and_checkpoint_file(tmp_path: Path) -> None:
    a = Policy.tiny_gpt(GPTConfig(**SMALL), seed=1)
    b = Policy.tiny_gpt(GPTConfig(**SMALL), seed=2)
    ids = torch.tensor([a.tokenizer.encode("abc")])
    assert not torch.equal(a.forward(ids)[0], b.forward(ids)[0])
    save_file({k: v.contiguous() for k, v in a.state_dict().items()}, str(tmp_path / "model.safetensors"))
    c = Policy.from_spec({"config": SMALL, "checkpoint": str(tmp_path / "model.safetensors")})
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b.forward(ids)[0], a.forward(ids)[0])
    torch.testing.assert_close(c.forward(ids)[0], a.forward(ids)[0])


def _bad_payloads(policy: Policy) -> dict[str, tuple[dict[str, torch.Tensor], str]]:
    good = {k: v.clone() for k, v in policy.state_dict().items()}
    first = next(iter(good))
    missing = dict(good)
    del missing[first]
    renamed = dict(good)
    renamed["blocks.9.fc.weight"] = renamed.pop(first)
    shape = dict(good)
    shape[first] = torch.zeros(3, 3)
    dtype = dict(good)
    dtype[first] = good[first].double()
    nan = dict(good)
    nan[first] = good[first].clone()
    nan[first][0, 0] = float("nan")
    return {
        "missing": (missing, "1 missing"),
        "renamed": (renamed, "unexpected"),
        "shape": (shape, "shape"),
        "dtype": (dtype, "dtype"),
        "nan": (nan, "NaN"),
    }


@pytest.mark.parametrize("case", ["missing", "renamed", "shape", "dtype", "nan"])
def test_bad_state_dicts_are_rejected_before_anything_is_copied(case: str) -> None:
    policy = Policy.tiny_gpt(GPTConfig(**SMALL), seed=1)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    payload, message = _bad_payloads(policy)[case]
    with pytest.raises(StateDictError, match=message):
        policy.load_state_dict(payload)
    for name, value in policy.state_dict().items():
        assert torch.equal(value, before[name])


def test_token_logprobs_left_padded_batch_equals_single_rows() -> None:
    policy = Policy.tiny_gpt(GPTConfig(**SMALL), seed=3)
    texts = ["1+2=3", "a longer sequence of text"]
    rows = [torch.tensor([policy.tokenizer.encode(t)]) for t in texts]
    width = max(r.shape[1] for r in rows)
    ids = torch.stack([torch.cat((torch.zeros(width - r.shape[1], dtype=torch.long), r[0])) for r in rows])
    mask = torch.stack([torch.cat((torch.zeros(width - r.shape[1]), torch.ones(r.shape[1]))) for r in rows])
    batched = policy.token_logprobs(ids, mask, temperature=0.7)
    for i, r in enumerate(rows):
        single = policy.token_logprobs(r, temperature=0.7)[0]
        torch.testing.assert_close(batched[i, width - r.shape[1] :], single, atol=1e-5, rtol=1e-5)
        assert torch.all(batched[i, : width - r.shape[1]] == 0)


def test_token_logprobs_carries_gradients() -> None:
    policy = Policy.tiny_gpt(GPTConfig(**SMALL))
    ids = torch.tensor([policy.tokenizer.encode("hello")])
    policy.token_logprobs(ids).sum().backward()  # type: ignore[no-untyped-call]
    assert policy.module.wte.weight.grad is not None  # type: ignore[union-attr]


def test_all_finite_sees_every_nan_and_inf_and_survives_an_overflowing_sum() -> None:
    from actors.policy import all_finite

    big = torch.full((1000,), 3e38)  # finite values whose sum overflows float32
    assert all_finite(big)
    assert all_finite(torch.full((10,), 60000.0, dtype=torch.float16))
    for bad in (float("nan"), float("inf"), float("-inf")):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            values = torch.zeros(257, dtype=dtype)
            values[131] = bad
            assert not all_finite(values), (bad, dtype)
