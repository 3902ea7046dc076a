"""The names of `actors.protocol._names` agree with what they name elsewhere."""

from __future__ import annotations

from actors.protocol import CHANNEL_MODELS, RECORDED_CHANNELS


def test_the_recorded_channels_are_those_with_a_recorded_schema() -> None:
    assert set(RECORDED_CHANNELS) == set(CHANNEL_MODELS)
