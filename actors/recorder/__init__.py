"""The `recorder` actor kind: traffic, feedback and scored samples to hourly parquet files, exactly once.

Its config model lives in `actors.recorder._config` (imported by `actors`); the actor in `_actor`, the file
layout and exactly-once index in `_writer`, the columns of each channel in `_schema` (see ``schema()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors._lazy import lazy_exports

if TYPE_CHECKING:
    from ._schema import read_recordings as read_recordings
    from ._schema import schema as schema
    from ._writer import ChannelWriter as ChannelWriter
    from ._writer import parse_range as parse_range
    from ._writer import partition_of as partition_of

_EXPORTS = {
    "ChannelWriter": "_writer",
    "parse_range": "_writer",
    "partition_of": "_writer",
    "read_recordings": "_schema",
    "schema": "_schema",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "ChannelWriter",
    "parse_range",
    "partition_of",
    "read_recordings",
    "schema",
]
