"""The `joiner` actor kind: late feedback joined to served traffic by request id, published to `scored`.

Its config model lives in `actors.joiner._config` (imported by `actors`); the actor in `_actor`, its KV state
in `_state`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topology import lazy_exports

if TYPE_CHECKING:
    from actors.joiner._actor import joined_sample as joined_sample
    from actors.joiner._actor import selected_for_review as selected_for_review
    from actors.joiner._state import JoinState as JoinState
    from actors.joiner._state import kv_key as kv_key

_EXPORTS = {
    "JoinState": "_state",
    "joined_sample": "_actor",
    "kv_key": "_state",
    "selected_for_review": "_actor",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "JoinState",
    "joined_sample",
    "kv_key",
    "selected_for_review",
]
