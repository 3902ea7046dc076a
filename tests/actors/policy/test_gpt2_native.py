"""The native GPT-2 forward (``actors.policy._gpt2``) computes what transformers' GPT2LMHeadModel does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from actors.policy import Policy, write_tiny_hf_model

TOL = {"atol": 2e-5, "rtol": 2e-5}


def pair(directory: Path) -> tuple[Policy, Policy]:
    """The same weights twice: through the native forward, and through transformers' forward."""
    native = Policy.from_spec({"model": f"hf:{directory}"})
    reference = Policy.from_spec({"model": f"hf:{directory}", "config": {"native_forward": False}})
    return native, reference


def model_dir(tmp_path: Path, **config: Any) -> Path:
    directory = write_tiny_hf_model(tmp_path / "m", arch="gpt2", n_layer=2, n_embd=32, n_head=4, seed=3)
    if config:
        path = directory / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return directory


def left_padded_batch(policy: Policy) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [policy.tokenizer.encode(text) for text in ("12+7=", "3*4=12", "x")]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@pytest.mark.parametrize(
    "config",
    [{}, {"activation_function": "relu"}, {"scale_attn_weights": False}],
    ids=["default", "relu", "unscaled"],
)
def test_prefill_and_decode_match_transformers(tmp_path: Path, config: dict[str, Any]) -> None:
    native, reference = pair(model_dir(tmp_path, **config))
    assert native.module.native_unsupported is None and reference.module.native_unsupported == "turned off"
    ids, mask = left_padded_batch(native)
    with torch.no_grad():
        got, cache_n = native.forward(ids, mask, use_cache=True)
        want, cache_r = reference.forward(ids, mask, use_cache=True)
        real = mask.bool()
        torch.testing.assert_close(got[real], want[real], **TOL)
        for step in range(3):  # decode, each side continuing from the *other* side's cache: same layout
            token = torch.full((3, 1), 5 + step)
            mask = torch.cat((mask, torch.ones(3, 1, dtype=mask.dtype)), dim=1)
            got, new_n = native.forward(token, mask, cache=cache_r, use_cache=True)
            want, new_r = reference.forward(token, mask, cache=cache_n, use_cache=True)
            torch.testing.assert_close(got, want, **TOL)
            cache_n, cache_r = new_n, new_r


def test_gradients_match_transformers(tmp_path: Path) -> None:
    native, reference = pair(model_dir(tmp_path))
    ids, mask = left_padded_batch(native)
    grads = []
    for policy in (native, reference):
        policy.module.zero_grad()
        (policy.token_logprobs(ids, mask) * mask[:, 1:]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in policy.weights.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], **TOL, msg=name)


def test_unsupported_configs_and_other_architectures_use_transformers(tmp_path: Path) -> None:
    inverse = Policy.from_spec({"model": f"hf:{model_dir(tmp_path, scale_attn_by_inverse_layer_idx=True)}"})
    assert inverse.module.native_unsupported == "scale_attn_by_inverse_layer_idx"
    llama = Policy.from_spec({"model": f"hf:{write_tiny_hf_model(tmp_path / 'llama', arch='llama')}"})
    assert llama.module.native_unsupported == "not a GPT2LMHeadModel (LlamaForCausalLM)"
    ids, mask = left_padded_batch(inverse)
    with torch.no_grad():
        assert torch.isfinite(inverse.forward(ids, mask)[0]).all()


def test_train_mode_runs_transformers_with_its_dropout(tmp_path: Path) -> None:
    native, _ = pair(model_dir(tmp_path))
    ids, mask = left_padded_batch(native)
    native.module.train()
    with torch.no_grad():
        first, second = native.forward(ids, mask)[0], native.forward(ids, mask)[0]
    assert not torch.equal(first, second)  # GPT2Config's dropout (0.1) is live: the native path was not used
    native.module.eval()
    with torch.no_grad():
        assert torch.equal(native.forward(ids, mask)[0], native.forward(ids, mask)[0])


def test_native_forward_must_be_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"policy\.config\.native_forward: expected true or false, got 'no'"):
        Policy.from_spec({"model": f"hf:{model_dir(tmp_path)}", "config": {"native_forward": "no"}})
