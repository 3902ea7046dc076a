"""The application's names on the bus, built once (the framework's rules are `topology._names`).

- ``fw_<topology>_weights`` (`weights_bucket`): the KV bucket of weight versions. Key `CURRENT` holds the manifest
  of the newest version the learner published; `SERVING` the version the gateway's generators serve (moved by the
  gate, ``flywheel promote`` and ``rollback``); ``served.<actor>.<replica>`` (`served_key`) what each generator
  replica swapped in last, put right after the swap.
- ``fw_<topology>_<what>`` (`join_bucket`): the joiner's state buckets.
- ``fw_<topology>_feedback_rated`` (`rated_bucket`): the record of the first rating each request got through a gateway
  or ``flywheel review`` (a digest of it: `actors.protocol._ratings`), so that a second one is answered as a duplicate.
- `REVIEW_SOURCE`: the envelope source (and the feedback ``key_id``) of labels given through ``flywheel review``.
- `RECORDED_CHANNELS`: the channels with a recorded schema (`actors.protocol._recordings`), here without its imports
  so that a spec check can name them.
"""

from __future__ import annotations

from topology import bucket_name

__all__ = [
    "CURRENT",
    "RECORDED_CHANNELS",
    "REVIEW_SOURCE",
    "SERVING",
    "join_bucket",
    "rated_bucket",
    "served_key",
    "weights_bucket",
]

CURRENT = "current"
SERVING = "serving"
REVIEW_SOURCE = "review"
RECORDED_CHANNELS = ("traffic", "feedback", "scored")  # the keys of CHANNEL_MODELS


def weights_bucket(topology: str) -> str:
    """The KV bucket of weight versions (see the module docstring)."""
    return bucket_name(topology, "weights")


def served_key(actor: str, replica: int) -> str:
    """Key in the weights bucket where a generator replica puts ``{"version": v}`` right after each swap (the
    source's sync mode waits on it: heartbeats lag by up to a heartbeat period)."""
    return f"served.{actor}.{replica}"


def join_bucket(topology: str, what: str) -> str:
    """One of the joiner's KV buckets (``traffic``, ``feedback``, ``applied``…)."""
    return bucket_name(topology, what)


def rated_bucket(topology: str) -> str:
    """The KV bucket of the first rating each request got (see the module docstring)."""
    return bucket_name(topology, "feedback_rated")
