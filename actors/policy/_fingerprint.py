"""What a run records of its model beyond the spec's text, and what a resume makes of it (light: no torch).

Contract: :func:`record_policy` is the policy section's record (``run.json``'s ``records.policy``): for an ``hf:``
model found on this machine (a directory, or a hub id in the local cache), the directory and a hash of its
``config.json``'s content (keys sorted; the ``transformers_version`` and ``_``-prefixed keys a re-save rewrites left
out) — cheap, the weights are not read. :func:`resume_policy` refuses a resume whose model's
``config.json`` hash is not the recorded one (a model directory replaced under the same path: the learner would
restore its checkpoint into another shape at every restart), naming ``policy.model`` and the directory.

Non-goals: telling apart two models with the same ``config.json`` (their weights fit the run's checkpoints shape for
shape, and the learner restores its own); builtin models (their shape is the spec's own ``policy.config``); a model
not found here (served only by an HTTP engine elsewhere): nothing is recorded, nothing checked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from actors.policy._hub import model_directory
from actors.protocol import PolicySpec
from topology import KeyPath, ResumeConflict

__all__ = ["record_policy", "resume_policy"]

# keys of a config.json that say which tool wrote it, not what the model is: a model saved again by a newer
# transformers (same weights) is the same model
_BOOKKEEPING = frozenset({"transformers_version"})


def record_policy(path: KeyPath, policy: PolicySpec) -> dict[str, Any]:
    """``{"model_dir", "model_config"}`` of an ``hf:`` model found here (``model_config``: a hash of its
    config.json); empty otherwise."""
    if not policy.model.startswith("hf:"):
        return {}
    try:
        directory = model_directory(policy.model[3:])
        config = json.loads((directory / "config.json").read_bytes())
    except (ValueError, OSError):
        return {}
    if isinstance(config, dict):  # what says the model, not which tool wrote the file last
        config = {key: value for key, value in config.items() if key not in _BOOKKEEPING and not key.startswith("_")}
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    return {"model_dir": str(directory), "model_config": digest}


def resume_policy(path: KeyPath, recorded: Mapping[str, Any], policy: PolicySpec) -> Sequence[str]:
    """Refuse (`ResumeConflict`) a model whose config.json hash is not the one recorded when the run last started."""
    now = record_policy(path, policy)
    before = recorded.get("model_config")
    if before is None or now.get("model_config") in (None, before):
        return []
    key = ".".join(str(part) for part in (*path, "model"))
    raise ResumeConflict(
        f"{key} is another model than the run started with: the config.json in {now['model_dir']} changed since then "
        f"(hash {before} → {now['model_config']}; the run started with {recorded.get('model_dir', '?')}); the run's "
        "checkpoints hold the weights of the model it started with"
    )
