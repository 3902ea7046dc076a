"""The check of a spec's ``policy`` section, run by the framework's spec checker (light: no torch).

Contract: an ``hf:<dir>`` whose relative dir holds a ``config.json`` beside the spec file that set it becomes that
absolute dir, like every path in a spec; anything else stays as written (a hub id, or a path on the machines that
serve the model) with a warning when it is no model directory here. A relative ``checkpoint`` becomes absolute.

Non-goals: loading the model (the learner and generators do, and say what is wrong with ``policy.config`` then).
"""

from __future__ import annotations

from pathlib import Path

from actors.protocol import PolicySpec
from topology import KeyPath, SectionCheck

__all__ = ["check_policy"]


def check_policy(check: SectionCheck, path: KeyPath, policy: PolicySpec) -> PolicySpec:
    """Resolve the policy's paths against the spec file that set them; warn about a model dir that is not here."""
    update: dict[str, str] = {}
    if policy.model.startswith("hf:"):
        given = Path(policy.model[3:]).expanduser()
        at = (*path, "model")
        candidate = given if given.is_absolute() else (check.base_dir(at) / given).resolve()
        if (candidate / "config.json").is_file():
            update["model"] = f"hf:{candidate}"
        else:
            check.error(
                at,
                f"expected a Hugging Face model directory with a config.json, but {candidate} is none on this "
                "machine: fine for a hub id or a path that exists where the model is served (an HTTP engine's "
                "server), an error for the builtin torch engine and the learner",
                warning=True,
            )
    if policy.checkpoint and not Path(policy.checkpoint).is_absolute():
        update["checkpoint"] = str((check.base_dir((*path, "checkpoint")) / policy.checkpoint).resolve())
    return policy.model_copy(update=update) if update else policy
