"""What actor kinds share: the contracts they meet on, and nothing else.

Kinds never import each other; what one publishes and another consumes is defined here once: the payloads of the
durable channels (`PromptMsg` … `FeedbackMsg`), the serve protocol between gateway and serving generators, the
recorded parquet schema that the recorder writes and replay reads. Light on import (pydantic only; the recordings
schema loads polars on first use). Everything here may be imported by kinds, libraries and application commands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.protocol._messages import FEEDBACK_LABELS as FEEDBACK_LABELS
from actors.protocol._messages import SOLVED_SUBJECT as SOLVED_SUBJECT
from actors.protocol._messages import CompletionRecord as CompletionRecord
from actors.protocol._messages import FeedbackMsg as FeedbackMsg
from actors.protocol._messages import PromptMsg as PromptMsg
from actors.protocol._messages import RolloutMsg as RolloutMsg
from actors.protocol._messages import ScoredCompletion as ScoredCompletion
from actors.protocol._messages import ScoredMsg as ScoredMsg
from actors.protocol._messages import TrafficMsg as TrafficMsg
from actors.protocol._serve import SERVE_PROTOCOL_VERSION as SERVE_PROTOCOL_VERSION
from actors.protocol._serve import SERVE_QUEUE as SERVE_QUEUE
from actors.protocol._serve import ping_subject as ping_subject
from actors.protocol._serve import serve_subject as serve_subject
from topology import lazy_exports

if TYPE_CHECKING:
    from actors.protocol._recordings import CHANNEL_MODELS as CHANNEL_MODELS
    from actors.protocol._recordings import frame as frame
    from actors.protocol._recordings import read_recordings as read_recordings
    from actors.protocol._recordings import rows_of as rows_of
    from actors.protocol._recordings import schema as schema

_EXPORTS = {
    "CHANNEL_MODELS": "_recordings",
    "frame": "_recordings",
    "read_recordings": "_recordings",
    "rows_of": "_recordings",
    "schema": "_recordings",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "CHANNEL_MODELS",
    "FEEDBACK_LABELS",
    "SERVE_PROTOCOL_VERSION",
    "SERVE_QUEUE",
    "SOLVED_SUBJECT",
    "CompletionRecord",
    "FeedbackMsg",
    "PromptMsg",
    "RolloutMsg",
    "ScoredCompletion",
    "ScoredMsg",
    "TrafficMsg",
    "frame",
    "ping_subject",
    "read_recordings",
    "rows_of",
    "schema",
    "serve_subject",
]
