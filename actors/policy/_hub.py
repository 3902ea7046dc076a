"""Hub ids in ``policy.model``: found in the local Hugging Face cache, never downloaded (light: no torch).

Contract: :func:`cached_hub_model` returns the cached snapshot directory of a hub id (``org/name`` or ``name``),
where ``huggingface-cli download`` (or any earlier ``from_pretrained``) put it — ``HF_HOME``/``HF_HUB_CACHE`` move
the cache — or None; :func:`model_directory` is where an ``hf:`` model loads from (the directory itself, else that
snapshot; else a one-line ``ValueError``). Nothing here touches the network (``local_files_only``).
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["cached_hub_model", "is_hub_id", "model_directory"]

_HUB_ID = re.compile(r"([A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")


def is_hub_id(model: str) -> bool:
    """Whether ``model`` reads as a hub id, ``org/name`` or an org-less ``name`` (``gpt2``); a relative path of one
    or two parts reads the same."""
    return bool(_HUB_ID.fullmatch(model)) and ".." not in model


def cached_hub_model(model: str) -> Path | None:
    """The local Hugging Face cache's snapshot of hub id ``model``, or None when it is not there (or ``model`` is no
    hub id, or huggingface_hub is not installed)."""
    if not is_hub_id(model):
        return None
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        return Path(snapshot_download(model, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None


def model_directory(path: str | Path, field: str = "policy.model") -> Path:
    """The directory to load ``path`` from: itself when it is one, else a hub id's cached snapshot; ``field`` names
    the spec key in the error."""
    directory = Path(path).expanduser()
    if directory.is_dir():
        return directory
    cached = cached_hub_model(str(path))
    if cached is not None:
        return cached
    if is_hub_id(str(path)):
        raise ValueError(
            f"{field}: {str(path)!r} is no directory here and not in the Hugging Face cache; nothing is "
            f"downloaded at run time: fetch it first (huggingface-cli download {path}) or give the model's directory"
        )
    raise ValueError(f"{field}: hf model directory {str(directory)!r} does not exist")
