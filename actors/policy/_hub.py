"""Hub ids in ``policy.model``: found in the local Hugging Face cache, never downloaded (light: no torch).

Contract: :func:`cached_hub_model` returns the cached snapshot directory of a hub id (``org/name`` or ``name``),
where ``huggingface-cli download`` (or any earlier ``from_pretrained``) put it — ``HF_HOME``/``HF_HUB_CACHE`` move
the cache — or None. Nothing here touches the network (``local_files_only``).
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["cached_hub_model", "is_hub_id"]

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
