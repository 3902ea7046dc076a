"""Learner checkpoints load safely: every pickled entry is loaded with ``weights_only`` before torchsnapshot restores
anything, so a checkpoint file replaced by a pickle that runs code is refused, not executed."""

from __future__ import annotations

import asyncio
import gc
import io
import pickle
from pathlib import Path

import pytest
import torch

from actors.learner._checkpoint import Checkpointer, learner_state


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
