"""Export of the learner's weights as a Hugging Face style directory: ``model.safetensors`` + ``config.json``.

- ``hf:`` policies: ``save_pretrained`` of the underlying transformers model (safetensors), plus its tokenizer
  when it can save itself — loadable by transformers, SGLang and vLLM.
- the builtin tiny GPT: its parameters under their ``named_parameters`` names (what ``Policy.load_file`` and the
  weight transports use) and a ``config.json`` with ``model_type: flywheel-tiny-gpt`` and the ``GPTConfig``;
  ``Policy.from_spec({"model": "builtin:tiny-gpt", "config": …, "checkpoint": dir})`` loads it back.

The directory is written under a temporary name and renamed into place (replacing an older export).

Non-goals: conversion of the builtin model to a transformers architecture.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from actors.policy import Policy

__all__ = ["export_safetensors"]


def export_safetensors(policy: Policy, out_dir: Path, *, extra: dict[str, Any] | None = None) -> Path:
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        if policy.kind == "hf":
            policy.weights.save_pretrained(str(tmp), safe_serialization=True)  # type: ignore[operator]
            inner = getattr(policy.tokenizer, "hf", None)
            if inner is not None and hasattr(inner, "save_pretrained"):
                inner.save_pretrained(str(tmp))
        else:
            from safetensors.torch import save_file

            tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in policy.state_dict().items()}
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            gpt_config = getattr(policy.module, "config", None)
            config = {
                "model_type": "flywheel-tiny-gpt",
                "architectures": ["TinyGPT"],
                "tokenizer": "char",
                "torch_dtype": str(next(iter(tensors.values())).dtype).removeprefix("torch."),
                **(gpt_config.as_dict() if gpt_config is not None else {}),
            }
            (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if extra:
            (tmp / "flywheel.json").write_text(json.dumps(extra, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
