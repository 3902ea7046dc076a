"""A source replica's place in its task stream, saved and restored (the actor's own test covers a restart)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from actors.source import _position
from actors.source._position import SequencePosition


def test_the_stream_goes_on_from_the_saved_state_and_a_failed_save_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_position, "SAVE_EVERY_S", 0.0)
    rng = random.Random(5)
    position = SequencePosition(tmp_path, rng, 5)
    assert position.restore() == "fresh"
    [rng.random() for _ in range(10)]
    assert position.save_if_due() is None
    expected = [rng.random() for _ in range(3)]
    again = random.Random(5)
    assert SequencePosition(tmp_path, again, 5).restore() == "restored"
    assert [again.random() for _ in range(3)] == expected

    position.path.unlink()
    position.path.mkdir()  # where the file goes, something that cannot be replaced by it: the write fails
    error = position.save_if_due()
    assert error is not None and error.startswith("IsADirectoryError")  # reported, not raised: publishing goes on
