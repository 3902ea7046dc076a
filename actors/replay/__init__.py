"""Replay and promotion: re-issue recorded prompts against a weight version, score them, compare, report;
the promotion gate's rule and the moves of the ``serving`` key (promote, rollback) with their log.

Importing this package imports torch (the engine and the weights); the CLI imports it only when invoked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topology import lazy_exports

if TYPE_CHECKING:
    from actors.replay._items import RecordingsTail as RecordingsTail
    from actors.replay._items import ReplayItem as ReplayItem
    from actors.replay._items import items_from_scored as items_from_scored
    from actors.replay._items import items_from_traffic as items_from_traffic
    from actors.replay._items import load_items as load_items
    from actors.replay._promote import (
        Decision as Decision,
    )
    from actors.replay._promote import (
        DecisionLog as DecisionLog,
    )
    from actors.replay._promote import (
        decide as decide,
    )
    from actors.replay._promote import (
        decisions_path as decisions_path,
    )
    from actors.replay._promote import (
        hold as hold,
    )
    from actors.replay._promote import (
        pause_gate as pause_gate,
    )
    from actors.replay._promote import (
        promote as promote,
    )
    from actors.replay._promote import (
        read_decisions as read_decisions,
    )
    from actors.replay._promote import (
        record as record,
    )
    from actors.replay._promote import (
        release as release,
    )
    from actors.replay._promote import (
        resume_gate as resume_gate,
    )
    from actors.replay._promote import (
        rollback as rollback,
    )
    from actors.replay._promote import (
        serving_manifest as serving_manifest,
    )
    from actors.replay._report import build_report as build_report
    from actors.replay._report import mean_reward as mean_reward
    from actors.replay._report import write_report as write_report
    from actors.replay._run import Outcome as Outcome
    from actors.replay._run import Replayer as Replayer
    from actors.replay._run import ReplayRun as ReplayRun
    from actors.replay._run import request_seed as request_seed
    from actors.replay._weights import ResolvedWeights as ResolvedWeights
    from actors.replay._weights import WeightsNotFound as WeightsNotFound
    from actors.replay._weights import resolve_weights as resolve_weights

_EXPORTS = {
    "Decision": "_promote",
    "DecisionLog": "_promote",
    "Outcome": "_run",
    "RecordingsTail": "_items",
    "ReplayItem": "_items",
    "ReplayRun": "_run",
    "Replayer": "_run",
    "ResolvedWeights": "_weights",
    "WeightsNotFound": "_weights",
    "build_report": "_report",
    "decide": "_promote",
    "decisions_path": "_promote",
    "hold": "_promote",
    "items_from_scored": "_items",
    "items_from_traffic": "_items",
    "load_items": "_items",
    "mean_reward": "_report",
    "pause_gate": "_promote",
    "promote": "_promote",
    "read_decisions": "_promote",
    "resume_gate": "_promote",
    "record": "_promote",
    "release": "_promote",
    "request_seed": "_run",
    "resolve_weights": "_weights",
    "rollback": "_promote",
    "serving_manifest": "_promote",
    "write_report": "_report",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "Decision",
    "DecisionLog",
    "Outcome",
    "RecordingsTail",
    "ReplayItem",
    "ReplayRun",
    "Replayer",
    "ResolvedWeights",
    "WeightsNotFound",
    "build_report",
    "decide",
    "decisions_path",
    "hold",
    "items_from_scored",
    "items_from_traffic",
    "load_items",
    "mean_reward",
    "pause_gate",
    "promote",
    "read_decisions",
    "record",
    "release",
    "request_seed",
    "resolve_weights",
    "resume_gate",
    "rollback",
    "serving_manifest",
    "write_report",
]
