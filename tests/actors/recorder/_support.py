"""Payload builders, a spec and a stand-alone actor host shared by the recorder, joiner and replay tests."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from topology import Spec, load_spec

RECORDER_SPEC = """\
name: {name}
bus: {{embedded: true}}
runtime: local
policy: {{model: builtin:tiny-gpt}}
domains:
  arithmetic: {{source: builtin:arithmetic, verifier: math}}
actors:
  recorder: {{flush_every_s: {flush}, max_rows_per_file: {max_rows}}}
channels:
  traffic: {{external: true}}
  feedback: {{external: true}}
  scored: {{external: true}}
"""


def recorder_spec(directory: Path, *, flush: float = 0.2, max_rows: int = 100_000, name: str | None = None) -> Spec:
    path = directory / "spec.yaml"
    path.write_text(RECORDER_SPEC.format(name=name or f"rec-{uuid.uuid4().hex[:8]}", flush=flush, max_rows=max_rows))
    return load_spec(path)


def traffic(
    request_id: str,
    *,
    text: str = "42",
    domain: str | None = "arithmetic",
    version: int = 1,
    prompt: str = "What is 40+2?",
    temperature: float = 1.0,
    ts: float | None = None,
) -> dict[str, Any]:
    tokens = [ord(c) % 90 for c in text] or [1]
    return {
        "request_id": request_id,
        "ts": time.time() if ts is None else ts,
        "model": "flywheel",
        "route": "completions",
        "domain": domain,
        "prompt": prompt,
        "prompt_ids": [ord(c) % 90 for c in prompt],
        "completion": {
            "text": text,
            "token_ids": tokens,
            "logprobs": [-0.5] * len(tokens),
            "versions": [version] * len(tokens),
            "finish_reason": "stop",
        },
        "temperature": temperature,
        "max_tokens": 16,
        "generator": "generator/0",
        "latency_s": 0.01,
    }


def feedback(
    request_id: str, *, score: float = 1.0, label: str | None = None, ts: float | None = None, comment: str = ""
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "score": score,
        "label": label,
        "comment": comment,
        "ts": time.time() if ts is None else ts,
    }


def scored(task_id: str, *, rewards: tuple[float, ...] = (1.0, 0.0), domain: str = "arithmetic") -> dict[str, Any]:
    return {
        "task_id": task_id,
        "domain": domain,
        "prompt": "What is 1+1?",
        "prompt_ids": [1, 2, 3],
        "temperature": 1.0,
        "verifier_fields": {"answer": "2"},
        "completions": [
            {
                "text": "2" if r else "3",
                "token_ids": [5],
                "logprobs": [-0.1],
                "versions": [2],
                "finish_reason": "stop",
                "reward": r,
                "verdict": "pass" if r else "fail",
            }
            for r in rewards
        ],
    }
