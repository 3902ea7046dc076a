"""What actor kinds share: the contracts they meet on, and nothing else.

Kinds never import each other; what one publishes and another consumes is defined here once: the payloads of the
durable channels (`PromptMsg` … `FeedbackMsg`), the serve protocol between gateway and serving generators, the
application's spec sections (`PolicySpec`, `DomainSpec`; read them with `policy_of` / `domains_of`), the recorded
parquet schema that the recorder writes and replay reads, the ledger of each request's first rating
(`FirstRatings`). Light on import (pydantic only; the recordings schema loads polars on first use, the ratings ledger
the bus client). Everything here may be imported by kinds, libraries and application commands; nothing
here imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.protocol._messages import CORRECT as CORRECT
from actors.protocol._messages import FEEDBACK_LABELS as FEEDBACK_LABELS
from actors.protocol._messages import VERIFIER_ERROR as VERIFIER_ERROR
from actors.protocol._messages import CompletionRecord as CompletionRecord
from actors.protocol._messages import FeedbackMsg as FeedbackMsg
from actors.protocol._messages import PromptMsg as PromptMsg
from actors.protocol._messages import RolloutMsg as RolloutMsg
from actors.protocol._messages import ScoredCompletion as ScoredCompletion
from actors.protocol._messages import ScoredMsg as ScoredMsg
from actors.protocol._messages import TrafficMsg as TrafficMsg
from actors.protocol._names import CURRENT as CURRENT
from actors.protocol._names import RECORDED_CHANNELS as RECORDED_CHANNELS
from actors.protocol._names import REVIEW_SOURCE as REVIEW_SOURCE
from actors.protocol._names import SERVING as SERVING
from actors.protocol._names import join_bucket as join_bucket
from actors.protocol._names import rated_bucket as rated_bucket
from actors.protocol._names import served_key as served_key
from actors.protocol._names import weights_bucket as weights_bucket
from actors.protocol._roles import HasDevice as HasDevice
from actors.protocol._roles import HasEngine as HasEngine
from actors.protocol._roles import JoinsFeedback as JoinsFeedback
from actors.protocol._roles import ServesUsers as ServesUsers
from actors.protocol._roles import SyncsWeights as SyncsWeights
from actors.protocol._roles import cuda_missing_here as cuda_missing_here
from actors.protocol._roles import feedback_join as feedback_join
from actors.protocol._roles import only_torch_engines as only_torch_engines
from actors.protocol._roles import runs_on_cpu as runs_on_cpu
from actors.protocol._roles import serving_replicas as serving_replicas
from actors.protocol._roles import weight_receivers as weight_receivers
from actors.protocol._serve import SERVE_PROTOCOL_VERSION as SERVE_PROTOCOL_VERSION
from actors.protocol._serve import SERVE_QUEUE as SERVE_QUEUE
from actors.protocol._serve import cancel_subject as cancel_subject
from actors.protocol._serve import ping_subject as ping_subject
from actors.protocol._serve import serve_subject as serve_subject
from actors.protocol._spec import BUILTIN_MODELS as BUILTIN_MODELS
from actors.protocol._spec import DomainSpec as DomainSpec
from actors.protocol._spec import LearningRate as LearningRate
from actors.protocol._spec import PolicySpec as PolicySpec
from actors.protocol._spec import WarmStartSpec as WarmStartSpec
from actors.protocol._spec import count_removed_domain as count_removed_domain
from actors.protocol._spec import domains_of as domains_of
from actors.protocol._spec import failed_groups_of as failed_groups_of
from actors.protocol._spec import policy_of as policy_of
from actors.protocol._status import TASK_OUTCOMES as TASK_OUTCOMES
from actors.protocol._status import LearnerPace as LearnerPace
from actors.protocol._status import LearnerStatus as LearnerStatus
from actors.protocol._status import TaskOutcomes as TaskOutcomes
from actors.protocol._status import task_outcomes_wanted as task_outcomes_wanted
from topology import lazy_exports

if TYPE_CHECKING:
    from actors.protocol._ratings import FirstRatings as FirstRatings
    from actors.protocol._ratings import rating_digest as rating_digest
    from actors.protocol._recordings import CHANNEL_MODELS as CHANNEL_MODELS
    from actors.protocol._recordings import channel_dir as channel_dir
    from actors.protocol._recordings import frame as frame
    from actors.protocol._recordings import one_copy_per_seq as one_copy_per_seq
    from actors.protocol._recordings import partition_end as partition_end
    from actors.protocol._recordings import partitions as partitions
    from actors.protocol._recordings import read_recordings as read_recordings
    from actors.protocol._recordings import rows_of as rows_of
    from actors.protocol._recordings import schema as schema

_EXPORTS = {
    "FirstRatings": "_ratings",
    "rating_digest": "_ratings",
    "CHANNEL_MODELS": "_recordings",
    "channel_dir": "_recordings",
    "frame": "_recordings",
    "one_copy_per_seq": "_recordings",
    "partition_end": "_recordings",
    "partitions": "_recordings",
    "read_recordings": "_recordings",
    "rows_of": "_recordings",
    "schema": "_recordings",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "BUILTIN_MODELS",
    "CHANNEL_MODELS",
    "CORRECT",
    "CURRENT",
    "FEEDBACK_LABELS",
    "RECORDED_CHANNELS",
    "REVIEW_SOURCE",
    "SERVE_PROTOCOL_VERSION",
    "SERVE_QUEUE",
    "SERVING",
    "TASK_OUTCOMES",
    "VERIFIER_ERROR",
    "CompletionRecord",
    "DomainSpec",
    "FeedbackMsg",
    "FirstRatings",
    "HasDevice",
    "HasEngine",
    "JoinsFeedback",
    "LearnerPace",
    "LearnerStatus",
    "LearningRate",
    "PolicySpec",
    "PromptMsg",
    "RolloutMsg",
    "ScoredCompletion",
    "ScoredMsg",
    "ServesUsers",
    "SyncsWeights",
    "TaskOutcomes",
    "TrafficMsg",
    "WarmStartSpec",
    "cancel_subject",
    "channel_dir",
    "count_removed_domain",
    "cuda_missing_here",
    "domains_of",
    "failed_groups_of",
    "feedback_join",
    "frame",
    "join_bucket",
    "one_copy_per_seq",
    "only_torch_engines",
    "partition_end",
    "partitions",
    "ping_subject",
    "policy_of",
    "rated_bucket",
    "rating_digest",
    "read_recordings",
    "rows_of",
    "runs_on_cpu",
    "schema",
    "serve_subject",
    "served_key",
    "serving_replicas",
    "task_outcomes_wanted",
    "weight_receivers",
    "weights_bucket",
]
