"""What a run records of its model beyond the spec's text, and what a resume makes of it (light: no torch).

Contract: :func:`policy_as_resumed` is the policy section's resume view: the spec's ``policy`` with a builtin model's
``config`` read for what it makes of the weights (`resolved_config`: the preset merged in, the default preset when
none is named, GPTConfig's defaults and the dtype filled in; ``preset`` itself dropped) and an ``hf:`` model's dtype
filled in, so that a resume compares what the keys mean: ``preset: tiny`` written out, or replaced by the sizes it
stands for, is the same model (the change is logged), other sizes are refused at the key that differs. This reads
the spec a run recorded before records were kept the same way.

:func:`record_policy` is the policy section's record (``run.json``'s ``records.policy``): for a builtin model, its
resolved config (``builtin_config``); for an ``hf:`` model found on this machine (a directory, or a hub id in the
local cache), the directory and a hash of its ``config.json``'s content (keys sorted; the ``transformers_version`` and
``_``-prefixed keys a re-save rewrites left out), and the tokenizer's directory (``policy.tokenizer``, else the
model's) and a hash of its vocabulary (`vocabulary_hash`: each id's token and the special tokens' ids, not what a
re-save rewrites) — cheap, the weights are not read. :func:`resume_policy` refuses a resume whose model's
``config.json`` hash is not the recorded one (a model directory replaced under the same path: the learner would
restore its checkpoint into another shape at every restart), naming ``policy.model`` and the directory; one whose
tokenizer's vocabulary is not the recorded one (the checkpoint's weights would go on training on other token ids),
naming ``policy.tokenizer`` or ``policy.model`` and the directory; and one whose builtin config resolves to other
weights than the recorded ones though the spec reads the same (flywheel's presets or defaults changed since).
``policy.tokenizer`` itself is judged by the vocabulary it names, not by how it is written: naming the model's own
directory, or a copy of its tokenizer, where the run started with none resumes; only where a vocabulary cannot be
read (on either side) is the key's text compared, and a change refused.

Non-goals: telling apart two models with the same ``config.json`` (their weights fit the run's checkpoints shape for
shape, and the learner restores its own); a model not found here (served only by an HTTP engine elsewhere): nothing
is recorded, nothing checked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from actors.policy._gpt_config import CONFIG_ON_RESUME, DEFAULT_DTYPE, resolved_config
from actors.policy._hub import model_directory
from actors.policy._vocabulary import vocabulary_hash
from actors.protocol import PolicySpec
from topology import KeyPath, ResumeConflict

__all__ = ["policy_as_resumed", "record_policy", "resume_policy"]

# keys of a config.json that say which tool wrote it, not what the model is: a model saved again by a newer
# transformers (same weights) is the same model
_BOOKKEEPING = frozenset({"transformers_version"})


def policy_as_resumed(policy: Mapping[str, Any]) -> Mapping[str, Any]:
    """The spec's ``policy`` (as run.json holds it) with its ``config`` read for what it makes of the weights (see the
    module docstring); as it is when it makes no model (the spec check says why)."""
    model, config = policy.get("model"), policy.get("config") or {}
    if not isinstance(model, str) or not isinstance(config, Mapping):
        return policy
    if model.startswith("builtin:"):
        try:
            resolved = resolved_config(config)
        except (ValueError, TypeError):
            return policy
        rest = {key: value for key, value in config.items() if key not in resolved and key != "preset"}
        return {**policy, "config": {**rest, **resolved}}
    return {**policy, "config": {"dtype": DEFAULT_DTYPE, **config}}


def record_policy(path: KeyPath, policy: PolicySpec) -> dict[str, Any]:
    """``{"builtin_config"}`` of a builtin model (its resolved config); of an ``hf:`` model, ``{"tokenizer"}`` (the key
    as written) and, found here, ``{"model_dir", "model_config"}`` (``model_config``: a hash of its config.json) and
    ``{"tokenizer_dir", "tokenizer_vocab"}`` where its tokenizer's vocabulary can be read; empty otherwise."""
    if policy.model.startswith("builtin:"):
        try:
            return {"builtin_config": resolved_config(policy.config)}
        except (ValueError, TypeError):
            return {}
    if not policy.model.startswith("hf:"):
        return {}
    record: dict[str, Any] = {"tokenizer": policy.tokenizer}  # as written: compared when a vocabulary is unreadable
    directory: Path | None = None
    try:
        directory = model_directory(policy.model[3:])
        config = json.loads((directory / "config.json").read_bytes())
    except (ValueError, OSError):
        pass
    else:
        if isinstance(config, dict):  # what says the model, not which tool wrote the file last
            config = {k: v for k, v in config.items() if k not in _BOOKKEEPING and not k.startswith("_")}
        digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
        record.update(model_dir=str(directory), model_config=digest)
    try:
        tokenizer = model_directory(policy.tokenizer, "policy.tokenizer") if policy.tokenizer else directory
    except ValueError:
        tokenizer = None
    vocabulary = vocabulary_hash(tokenizer) if tokenizer is not None else None
    if vocabulary is not None:
        record.update(tokenizer_dir=str(tokenizer), tokenizer_vocab=vocabulary)
    return record


def resume_policy(path: KeyPath, recorded: Mapping[str, Any], policy: PolicySpec) -> Sequence[str]:
    """Refuse (`ResumeConflict`) a model whose config.json hash is not the one recorded when the run last started, or
    a builtin one whose config now resolves to other weights than it did then."""
    now = record_policy(path, policy)
    _same_builtin_weights(path, recorded.get("builtin_config"), now.get("builtin_config"))
    before = recorded.get("model_config")
    if before is not None and now.get("model_config") not in (None, before):
        key = ".".join(str(part) for part in (*path, "model"))
        raise ResumeConflict(
            f"{key} is another model than the run started with: the config.json in {now['model_dir']} changed since "
            f"then (hash {before} → {now['model_config']}; the run started with {recorded.get('model_dir', '?')}); "
            "the run's checkpoints hold the weights of the model it started with"
        )
    before = recorded.get("tokenizer_vocab")
    if before is not None and now.get("tokenizer_vocab") is not None:
        if now["tokenizer_vocab"] != before:
            key = ".".join(str(part) for part in (*path, "tokenizer" if policy.tokenizer else "model"))
            raise ResumeConflict(
                f"{key} has another tokenizer than the run started with: the vocabulary in {now['tokenizer_dir']} (its "
                f"tokens' ids or its special tokens) changed since then (hash {before} → {now['tokenizer_vocab']}; the "
                f"run started with {recorded.get('tokenizer_dir', '?')}); the run's checkpoints hold weights trained "
                "on the token ids of the tokenizer it started with"
            )
    elif "tokenizer" in recorded and recorded["tokenizer"] != policy.tokenizer:  # nothing to compare but the text
        key = ".".join(str(part) for part in (*path, "tokenizer"))
        raise ResumeConflict(
            f"{key} changed since the run last started ({recorded['tokenizer']!r} → {policy.tokenizer!r}) and the "
            "vocabularies cannot be read here to tell whether the token ids are the same; the run's checkpoints hold "
            "weights trained on the token ids of the tokenizer it started with"
        )
    return []


def _same_builtin_weights(path: KeyPath, before: Any, now: Any) -> None:
    """Refuse a builtin model whose resolved config differs, in a key that shapes its weights, from the recorded one:
    the spec's keys read the same as when the run started (they were compared first), what they stand for did not."""
    if not isinstance(before, Mapping) or not isinstance(now, Mapping):
        return
    for key, why in CONFIG_ON_RESUME.items():
        if why is not None and key in before and key in now and before[key] != now[key]:
            at = ".".join(str(part) for part in (*path, "config", key))
            raise ResumeConflict(
                f"{at} is {now[key]!r} as the spec resolves now, {before[key]!r} when the run started: the spec "
                f"reads the same, but what it stands for changed (flywheel's presets or defaults); {why}"
            )
