"""What a resumed run makes of a domain whose held-out split changed (pure Python).

Contract: :func:`record_domain` is the domains section's record of one domain (``run.json``'s ``records.domains``):
its source, held-out setting and source options, paths absolute as the spec check resolved them.
:func:`resume_domain` compares them with the domain now; when they changed, it opens the task source both ways and
counts the tasks now held out that the run's source drew for training before (the old source finds the task and does
not hold it out): the held-out accuracy from then on is measured partly on tasks the run may have trained on. That
is a warning, one line naming the domain and the count, not a refusal: the weights are sound and the spec may change
(a larger held-out set of a file is a reasonable edit); only the figure is no longer clean, and a new run's is.

Non-goals: knowing which tasks were actually drawn (the count is of those the old split left to training); a task
file edited in place (both splits are read from the file as it is now); a source that no longer opens (nothing is
said: the spec check reports it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from actors.domains._domains import open_source
from actors.domains._task import SourceError
from actors.protocol import DomainSpec
from topology import KeyPath

__all__ = ["record_domain", "resume_domain"]


def record_domain(path: KeyPath, domain: DomainSpec) -> dict[str, Any]:
    """What decides the domain's held-out split: ``source``, ``heldout`` and ``source_options``."""
    return {"source": domain.source, "heldout": domain.heldout, "source_options": dict(domain.source_options)}


def resume_domain(path: KeyPath, recorded: Mapping[str, Any], domain: DomainSpec) -> Sequence[str]:
    """A warning when tasks the run's split left to training before are held out now (see the module docstring)."""
    name = str(path[-1])
    if dict(recorded) == orjson.loads(orjson.dumps(record_domain(path, domain), default=str)):  # as run.json has it
        return []
    try:
        before = open_source(
            recorded["source"], domain=name, heldout=recorded["heldout"], options=recorded["source_options"]
        )
        now = open_source(domain.source, domain=name, heldout=domain.heldout, options=domain.source_options)
    except (SourceError, KeyError, TypeError):
        return []
    held = now.heldout()
    moved = [task for task in held if (was := before.find(task.prompt)) is not None and not before.is_heldout(was)]
    if not moved:
        return []
    return [
        f"{'.'.join(map(str, path))}: {len(moved)} of its {len(held)} held-out tasks were training tasks before this "
        "resume (its heldout, source or source_options changed): the run may have trained on them, so its held-out "
        "accuracy from here on is measured partly on training data; start a new run for a clean measure"
    ]
