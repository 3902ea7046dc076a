"""Config of the `recorder` actor kind (light module; registers the kind on import).

The recorder writes traffic, feedback and scored samples to parquet files partitioned by time, for
replay and evaluation of weight versions.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from actors.protocol import RECORDED_CHANNELS
from topology import ActorKind, ActorSpec, KeyPath, SectionCheck, Spec, SpecModel, register_actor_kind, show


class RetainDays(SpecModel):
    """How many days of each channel's recordings to keep (``null``: forever); whole partitions older than that are
    deleted once their hour/day is over by that long. Users' requests and their feedback are the product's data and
    are kept unless an operator says otherwise. ``scored`` holds every training sample at the learner's full rate,
    which is what fills disks: a week covers the gate's replay window (``recent_window_s``, a day by default) and
    leaves days to look into what a version was trained on; the learner itself reads the bus, never these files."""

    traffic: float | None = Field(default=None, gt=0)
    feedback: float | None = Field(default=None, gt=0)
    scored: float | None = Field(default=7.0, gt=0)


class RecorderConfig(SpecModel):
    """Fields of a `recorder` actor block (besides kind/replicas/resources/consumes/publishes)."""

    directory: str = "recordings"  # parquet root; relative paths are inside the run directory
    partition: Literal["hour", "day"] = "hour"  # one folder per hour or per day
    flush_every_s: float = Field(default=10.0, gt=0)  # write buffered rows at least this often
    max_rows_per_file: int = Field(default=100_000, ge=1)  # start a new file after this many rows
    compression: Literal["zstd", "snappy", "lz4", "none"] = "zstd"  # parquet compression of the files written
    # a partition's files are merged into few (of at most max_rows_per_file rows) once its hour/day has been over
    # this long; rows published before the partition ended but recorded later land in a new file, merged next time
    merge_after_s: float = Field(default=600.0, ge=0)
    upkeep_every_s: float = Field(default=60.0, gt=0)  # how often merges and retention are looked at
    retain_days: RetainDays = RetainDays()  # per channel: delete recordings older than this (see RetainDays)


def _check(check: SectionCheck, path: KeyPath, actor: ActorSpec, spec: Spec) -> BaseModel:
    if actor.replicas != 1:  # two writers of one directory would each write every message
        check.error((*path, "replicas"), f"expected 1 (one writer per recordings directory), got {actor.replicas}")
    for index, channel in enumerate(actor.consumes):
        if channel not in RECORDED_CHANNELS:
            check.error(
                (*path, "consumes", index),
                f"expected a channel with a recorded schema ({', '.join(RECORDED_CHANNELS)}), got {show(channel)}",
            )
    return actor.config


register_actor_kind(
    ActorKind(
        name="recorder",
        config=RecorderConfig,
        factory="actors.recorder._actor:RecorderActor",
        consumes=("traffic", "feedback", "scored"),
        publishes=(),
        summary="records traffic, feedback and scored samples to parquet for replay",
        check=_check,
    )
)

__all__ = ["RecorderConfig", "RetainDays"]
