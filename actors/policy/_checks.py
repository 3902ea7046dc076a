"""The check of a spec's ``policy`` section, run by the framework's spec checker (light: no torch).

Contract: an ``hf:<dir>`` whose relative dir holds a ``config.json`` beside the spec file that set it becomes that
absolute dir, like every path in a spec; anything else stays as written (a hub id, or a path on the machines that
serve the model) with a warning when it is no model directory here and no hub id in this machine's Hugging Face
cache. A ``tokenizer`` (another tokenizer for an ``hf:`` model; none for a builtin one) resolves the same way: a
directory with tokenizer files, else a cached hub id (an error on the local runtime when it is neither). A relative
``checkpoint`` becomes absolute, and it must be a safetensors file or a directory holding some, as
the learner and generators load it (otherwise both crash-loop at start): an error on the local runtime, a
warning on a cluster (it may be on the nodes), not checked where a replica re-reads the spec. Where the spec is about
to run here (``flywheel up``, local runtime) its weights must also fit the model, name by name and shape by shape
(`checkpoint_problem`: safetensors headers, and a builtin model built to read its names — the one place this check
loads torch). ``policy.config`` may
hold only the keys the model takes (`BUILTIN_CONFIG_KEYS`, `HF_CONFIG_KEYS`), with values it takes: a builtin's
``preset`` one of its named sizes, its sizes what `GPTConfig` accepts (`config_problems`, the preset merged in), a
``dtype`` one of `DTYPE_NAMES`.

Non-goals: loading the model (an ``hf:`` model's own config.json is read by the learner and generators, which say
then what is wrong with it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.policy._gpt_config import (
    BUILTIN_CONFIG_KEYS,
    DEFAULT_PRESET,
    DTYPE_NAMES,
    HF_CONFIG_KEYS,
    PRESETS,
    GPTConfig,
    config_problems,
)
from actors.policy._hub import cached_hub_model, is_hub_id
from actors.policy._shapes import shape_mismatch
from actors.protocol import PolicySpec
from topology import KeyPath, SectionCheck, show

__all__ = ["check_policy"]


def check_policy(check: SectionCheck, path: KeyPath, policy: PolicySpec) -> PolicySpec:
    """Resolve the policy's paths against the spec file that set them; warn about a model dir that is not here."""
    builtin = policy.model.startswith("builtin:")
    allowed = BUILTIN_CONFIG_KEYS if builtin else HF_CONFIG_KEYS
    for key in policy.config:
        if key not in allowed:
            check.unknown_key((*path, "config", key), allowed)
    preset = policy.config.get("preset")
    if builtin and "preset" in policy.config and not (isinstance(preset, str) and preset in PRESETS):
        check.error((*path, "config", "preset"), f"expected a preset ({', '.join(PRESETS)}), got {show(preset)}")
    _check_config_values(check, path, policy.config, builtin)
    update: dict[str, str] = {}
    if policy.model.startswith("hf:"):
        given = Path(policy.model[3:]).expanduser()
        at = (*path, "model")
        candidate = given if given.is_absolute() else (check.base_dir(at) / given).resolve()
        if (candidate / "config.json").is_file():
            update["model"] = f"hf:{candidate}"
        elif cached_hub_model(policy.model[3:]) is None:
            model = policy.model[3:]
            if is_hub_id(model):
                found = f"{candidate} is no directory here and this machine's Hugging Face cache has no {model}"
                fetch = f" (`huggingface-cli download {model}` puts it in the cache)"
            else:
                found, fetch = f"{candidate} is none on this machine", ""
            check.error(
                at,
                f"expected a Hugging Face model directory with a config.json or a cached hub id, but {found}: fine "
                "where the model is only served by an HTTP engine's server; the builtin torch engine, the learner "
                "and the gateway (its tokenizer) load it from a directory or the cache of the machine they run on "
                f"and never download it{fetch}",
                warning=True,
            )
    if policy.tokenizer is not None:
        _check_tokenizer(check, (*path, "tokenizer"), policy, update)
    if policy.checkpoint:
        at = (*path, "checkpoint")
        checkpoint = Path(policy.checkpoint).expanduser()
        if not checkpoint.is_absolute():
            checkpoint = (check.base_dir(at) / checkpoint).resolve()
            update["checkpoint"] = str(checkpoint)
        present = checkpoint.is_file() or (checkpoint.is_dir() and any(checkpoint.glob("*.safetensors")))
        if check.thorough and not present:
            what = "holds no *.safetensors file" if checkpoint.is_dir() else "does not exist"
            elsewhere = (
                "" if check.local else " here (fine if it is there on the nodes the learner and generators run on)"
            )
            check.error(
                at,
                f"expected a safetensors file or a directory holding some, got {show(policy.checkpoint)} "
                f"({checkpoint} {what}{elsewhere})",
                warning=not check.local,
            )
        elif present and check.starting and check.local:  # what the learner and generators would refuse in a moment
            problem = checkpoint_problem(checkpoint, update.get("model", policy.model), policy.config)
            if problem is not None:
                check.error(at, problem)
    return policy.model_copy(update=update) if update else policy


def checkpoint_problem(checkpoint: Path, model: str, config: dict[str, Any]) -> str | None:
    """Why the safetensors weights at ``checkpoint`` (a file, or a directory of them) would not load into ``model``
    built with ``config``, or None: every weight name and shape is the model's. Reads the files' headers, not their
    tensors; a builtin model is built to read its names (it is small), an ``hf:`` model's are read from its
    directory's safetensors headers (none there, or a hub id: not checked). Dtypes are not compared."""
    found = _safetensors_shapes(checkpoint)
    if isinstance(found, str):
        return found
    expected = _model_shapes(model, config)
    if expected is None:
        return None
    problem = shape_mismatch(expected, found)
    return None if problem is None else f"expected weights of {model}, but {checkpoint}: {problem}"


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]] | str:
    """Name → shape of each tensor in the safetensors file(s) at ``path`` (headers only), or why they cannot be read."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(path.glob("*.safetensors")) if path.is_dir() else [path]:
        try:
            with safe_open(str(file), framework="pt") as weights:
                for name in weights.keys():  # noqa: SIM118  (a safe_open handle is no mapping)
                    shapes[name] = tuple(weights.get_slice(name).get_shape())
        except Exception as exc:  # safetensors raises its own errors (and OSError) for a file that is none
            return f"expected a safetensors file, but {file} cannot be read as one ({type(exc).__name__}: {exc})"
    return shapes


def _model_shapes(model: str, config: dict[str, Any]) -> dict[str, tuple[int, ...]] | None:
    """Name → shape of the weights ``model`` loads (the names `Policy.load_file` expects), or None when they cannot be
    known here without loading the model (a hub id, a model dir without safetensors) or its config is refused (said
    already, at its own key)."""
    if model.startswith("builtin:"):
        from actors.policy._policy import Policy

        try:
            policy = Policy.from_spec({"model": model, "config": {k: v for k, v in config.items() if k != "dtype"}})
        except (ValueError, TypeError):
            return None
        return {name: tuple(tensor.shape) for name, tensor in policy.state_dict().items()}
    directory = Path(model.removeprefix("hf:"))
    if not directory.is_dir() or not any(directory.glob("*.safetensors")):
        return None
    shapes = _safetensors_shapes(directory)
    return None if isinstance(shapes, str) else shapes


def _check_tokenizer(check: SectionCheck, at: KeyPath, policy: PolicySpec, update: dict[str, str]) -> None:
    """``policy.tokenizer``: only for an ``hf:`` model; a relative directory with tokenizer files beside the spec file
    that set it becomes absolute; anything else must be a hub id in this machine's cache (a warning, as for the
    model: it may be on the nodes that run it)."""
    given = str(policy.tokenizer)
    if policy.model.startswith("builtin:"):
        check.error(at, f"expected null: a builtin model has its own character tokenizer, got {show(given)}")
        return
    candidate = Path(given).expanduser()
    if not candidate.is_absolute():
        candidate = (check.base_dir(at) / candidate).resolve()
    if any((candidate / name).is_file() for name in _TOKENIZER_FILES):
        update["tokenizer"] = str(candidate)
    elif cached_hub_model(given) is None:
        check.error(
            at,
            f"expected a directory with a Hugging Face tokenizer ({' or '.join(_TOKENIZER_FILES)}) or a cached hub "
            f"id, got {show(given)} ({candidate} has none on this machine; nothing is downloaded at run time)",
            warning=not check.local,
        )


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def _check_config_values(check: SectionCheck, path: KeyPath, config: dict[str, Any], builtin: bool) -> None:
    """The values in ``policy.config`` that the model would refuse when built (the learner and every generator would
    crash-loop at start): a builtin's sizes with its preset merged in, ``seed``, ``dtype``, ``native_forward``."""
    at = (*path, "config")
    if "dtype" in config and config["dtype"] not in DTYPE_NAMES:
        check.error((*at, "dtype"), f"expected one of {', '.join(DTYPE_NAMES)}, got {show(config['dtype'])}")
    if not builtin:
        if "native_forward" in config and not isinstance(config["native_forward"], bool):
            check.error((*at, "native_forward"), f"expected true or false, got {show(config['native_forward'])}")
        return
    seed = config.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        check.error((*at, "seed"), f"expected an integer, got {show(seed)}")
    preset = config.get("preset", DEFAULT_PRESET)
    sizes: dict[str, Any] = dict(PRESETS.get(preset, {})) if isinstance(preset, str) else {}
    sizes.update({key: value for key, value in config.items() if key in GPTConfig.field_names()})
    for field, message in config_problems(sizes):
        if not field:  # two fields together: the one the spec wrote
            field = next((name for name in ("n_embd", "n_head") if name in config), "")
        check.error((*at, field) if field in config else at, message)
