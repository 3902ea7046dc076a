"""The `gate` actor kind: the promotion gate (its config model lives in `actors.gate._config`).

The actor is in `_actor` (imported lazily by the runtime), the tally of users' feedback by served version its
rollback decides on in `_feedback`; the rule and the moves of the ``serving`` key are in :mod:`actors.replay`.
"""

__all__: list[str] = []
