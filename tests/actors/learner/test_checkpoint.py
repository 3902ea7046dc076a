"""Learner checkpoints load safely: every pickled entry is loaded with ``weights_only`` before torchsnapshot restores
anything, so a checkpoint file replaced by a pickle that runs code is refused, not executed. A staged copy (what the
learner writes in the background) holds the state as it was when copied, and restores like the objects'."""

from __future__ import annotations

import asyncio
import gc
import io
import pickle
from pathlib import Path

import pytest
import torch

from actors.learner._checkpoint import Checkpointer, learner_state, staged


class _Payload:
    """Pickles to a call of ``Path.touch`` on a marker file: what a poisoned checkpoint would smuggle in."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.marker,))


def state() -> dict[str, object]:
    model = torch.nn.Linear(2, 2)
    return learner_state(model, torch.optim.AdamW(model.parameters()), None, meta='{"step": 1}', ledger="a\nb")


def test_torch_is_at_least_2_6() -> None:
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    assert (major, minor) >= (2, 6)


def test_a_checkpoint_file_holding_code_is_refused_not_run(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path / "checkpoints")
    path = checkpoints.save(1, state())
    poisoned = next(p for p in path.rglob("*") if p.is_file() and p.parent.name == "0" and "param_groups" in str(p))
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save(_Payload(marker), buffer)
    poisoned.write_bytes(buffer.getvalue())
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        checkpoints.restore(path, state())
    assert not marker.exists()
    # refused before torchsnapshot started its reads: none is left suspended, to be torn down in a later test
    suspended = [t for t in gc.get_objects() if issubclass(type(t), asyncio.Task) and not t.done()]
    assert suspended == []


def test_a_checkpoint_round_trips(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path / "checkpoints")
    saved = state()
    checkpoints.save(3, saved)
    restored = state()
    checkpoints.restore(checkpoints.latest() or tmp_path, restored)
    assert str(restored["extra"]["meta"]) == '{"step": 1}' and str(restored["extra"]["ledger"]) == "a\nb"  # type: ignore[index]
    model_saved, model_restored = saved["model"], restored["model"]
    assert isinstance(model_saved, torch.nn.Module) and isinstance(model_restored, torch.nn.Module)
    for a, b in zip(model_saved.state_dict().values(), model_restored.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(3, 2)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_a_staged_copy_is_written_as_it_was_when_copied_and_restores_into_the_live_objects(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, optimizer)
    live = learner_state(model, optimizer, None, meta='{"step": 1}', ledger="a")
    copy = staged(live)
    then_weights = {k: v.clone() for k, v in model.state_dict().items()}
    then_moments = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    _step(model, optimizer)  # training goes on while the copy is written
    assert not torch.equal(model.weight, then_weights["weight"])
    checkpoints = Checkpointer(tmp_path / "checkpoints")
    checkpoints.save(1, copy)

    fresh_model = torch.nn.Linear(2, 2)
    fresh_optimizer = torch.optim.AdamW(fresh_model.parameters(), lr=0.1)
    for _ in range(3):  # (an optimizer with state to fill, as a learner's is, at another step count)
        _step(fresh_model, fresh_optimizer)
    restored = learner_state(fresh_model, fresh_optimizer, None, meta="", ledger="")
    checkpoints.restore(checkpoints.latest() or tmp_path, restored)
    for name, value in fresh_model.state_dict().items():
        assert torch.equal(value, then_weights[name])
    for name, value in fresh_optimizer.state_dict()["state"][0].items():
        assert torch.equal(value, then_moments[name])
    assert float(fresh_optimizer.state_dict()["state"][0]["step"]) == 1.0
    assert str(restored["extra"]["meta"]) == '{"step": 1}'  # type: ignore[index]
    with pytest.raises(TypeError, match="restore into the live objects"):
        copy["model"].load_state_dict({})


def test_a_second_checkpoint_at_one_step_supersedes_the_first_without_removing_it_first(tmp_path: Path) -> None:
    """A learner checkpoints at a step it already checkpointed (groups consumed without a step): the new one gets a
    name of its own and becomes the latest; the earlier one is never removed before it is in place (a crash in
    between must not leave an older checkpoint as the latest)."""
    checkpoints = Checkpointer(tmp_path / "checkpoints", keep=3)
    checkpoints.save(2, state())
    first = checkpoints.save(3, state())
    later = learner_state(
        torch.nn.Linear(2, 2),
        torch.optim.AdamW(torch.nn.Linear(2, 2).parameters()),
        None,
        meta='{"step": 3}',
        ledger="a\nb\nc",
    )
    second = checkpoints.save(3, later)
    assert first.name == "ckpt-000000003" and second.name == "ckpt-000000003-1"
    assert [path.name for _, path in checkpoints.checkpoints()] == [
        "ckpt-000000002",
        "ckpt-000000003",
        "ckpt-000000003-1",
    ]
    assert checkpoints.latest() == second
    restored = state()
    checkpoints.restore(second, restored)
    assert str(restored["extra"]["ledger"]) == "a\nb\nc"  # type: ignore[index]
    third = checkpoints.save(4, state())  # keep=3: the oldest goes, once a newer one is in place
    assert [path for _, path in checkpoints.checkpoints()] == [first, second, third]
