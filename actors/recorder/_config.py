"""Config of the `recorder` actor kind (light module; registers the kind on import).

The recorder writes traffic, feedback and scored samples to parquet files partitioned by time, for
replay and evaluation of weight versions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from topology import ActorKind, SpecModel, register_actor_kind


class RecorderConfig(SpecModel):
    """Fields of a `recorder` actor block (besides kind/replicas/resources/consumes/publishes)."""

    directory: str = "recordings"  # parquet root; relative paths are inside the run directory
    partition: Literal["hour", "day"] = "hour"  # one folder per hour or per day
    flush_every_s: float = Field(default=10.0, gt=0)  # write buffered rows at least this often
    max_rows_per_file: int = Field(default=100_000, ge=1)  # start a new file after this many rows
    compression: Literal["zstd", "snappy", "lz4", "none"] = "zstd"  # parquet compression of the files written


register_actor_kind(
    ActorKind(
        name="recorder",
        config=RecorderConfig,
        factory="actors.recorder._actor:RecorderActor",
        consumes=("traffic", "feedback", "scored"),
        publishes=(),
        summary="records traffic, feedback and scored samples to parquet for replay",
    )
)

__all__ = ["RecorderConfig"]
