"""The `recorder` actor kind: traffic, feedback and scored samples to hourly parquet files, exactly once.

Its config model lives in `actors.recorder._config`; the actor in `_actor`, the file layout and exactly-once index in
`_writer`. The columns of each channel are a contract with replay: `actors.protocol.schema`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topology import lazy_exports

if TYPE_CHECKING:
    from actors.recorder._writer import ChannelWriter as ChannelWriter
    from actors.recorder._writer import parse_range as parse_range
    from actors.recorder._writer import partition_of as partition_of

_EXPORTS = {
    "ChannelWriter": "_writer",
    "parse_range": "_writer",
    "partition_of": "_writer",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "ChannelWriter",
    "parse_range",
    "partition_of",
]
