"""A small policy, a recorded run made with it (through the recorder's own writer), and other weights."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import orjson
from safetensors.torch import save_file

from actors.policy import GPTConfig, Policy
from actors.protocol import rows_of
from actors.recorder import ChannelWriter
from actors.replay import Replayer, ReplayItem
from topology import Spec, load_spec

POLICY = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 96}
PROMPTS = [f"{a}+{b}=" for a in range(3) for b in range(4)]


def replay_spec(tmp_path: Path, *, name: str | None = None, extra_actors: str = "", verifier: str = "exact") -> Spec:
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"name: {name or 'rp-' + uuid.uuid4().hex[:8]}\nbus: {{embedded: true}}\nruntime: local\n"
        f"policy: {{model: builtin:tiny-gpt, config: {orjson.dumps(POLICY).decode()}}}\n"
        f"domains:\n  echo: {{source: builtin:arithmetic, verifier: 'tests.actors.replay._verifier:{verifier}',"
        " max_new_tokens: 6}\n"
        f"actors:\n  recorder: {{}}\n{extra_actors}"
        "channels:\n  traffic: {external: true}\n  feedback: {external: true}\n  scored: {external: true}\n"
    )
    return load_spec(path)


def other_weights(path: Path, seed: int = 7) -> Path:
    """Weights of a differently initialised policy of the same shape, as a checkpoint file. Its block weights are
    scaled up: a freshly initialised tiny GPT with tied embeddings mostly repeats the last prompt character,
    whatever its seed; these weights do not."""
    policy = Policy.tiny_gpt(GPTConfig(**POLICY), seed=seed)
    tensors = {
        k: (v * 25 if v.ndim == 2 and k.startswith("blocks.") else v).contiguous()
        for k, v in policy.state_dict().items()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


async def record_run(spec: Spec, run_dir: Path, *, version: int = 1, temperature: float = 0.0) -> None:
    """What a run at ``version`` would have recorded: each prompt answered greedily by the spec's policy, and a
    verifier expecting exactly that answer. The weights are saved as ``<run_dir>/weights/v<version>``."""

    async def answers() -> list[str]:
        items = [
            ReplayItem(key=f"p{i}", source="scored", domain="echo", prompt=p, prompt_ids=_ids(p), temperature=0.0)
            for i, p in enumerate(PROMPTS)
        ]
        async with Replayer(spec) as replayer:
            save_file(
                {k: v.contiguous() for k, v in replayer.policy.state_dict().items()},
                str(_mkdir(run_dir / "weights" / f"v{version}") / "model.safetensors"),
            )
            run = await replayer.run(items, None, label="initial", version=version, greedy=True)
        by_key = {o.key: o.text for o in run.outcomes}
        return [by_key[f"p{i}"] for i in range(len(PROMPTS))]

    texts = await answers()
    writer = ChannelWriter(run_dir / "recordings", "scored")
    now = time.time()
    messages = {}
    for seq, (prompt, text) in enumerate(zip(PROMPTS, texts, strict=True), start=1):
        payload = {
            "task_id": f"task-{seq}",
            "domain": "echo",
            "prompt": prompt,
            "prompt_ids": _ids(prompt),
            "temperature": temperature,
            "verifier_fields": {"expected": text},
            "completions": [
                {
                    "text": text,
                    "token_ids": [1] * max(1, len(text)),
                    "logprobs": [0.0] * max(1, len(text)),
                    "versions": [version] * max(1, len(text)),
                    "finish_reason": "length",
                    "reward": 1.0,
                    "verdict": "pass",
                }
            ],
        }
        messages[seq] = (now, rows_of("scored", payload, seq=seq, id=f"s{seq}", ts=now, source="verify/0"))
    writer.write(messages)


def _ids(prompt: str) -> tuple[int, ...]:
    from actors.policy import CharTokenizer, encode_prompt

    return tuple(encode_prompt(CharTokenizer(), prompt))


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def record_many(run_dir: Path, count: int) -> None:
    """``count`` more scored samples in ``run_dir``'s recordings (after ``record_run``'s), each expecting a text no
    policy answers: a recording as long as a week of a service's training samples, written in a second."""
    writer = ChannelWriter(run_dir / "recordings", "scored")
    now = time.time()
    messages = {}
    for seq in range(len(PROMPTS) + 1, len(PROMPTS) + 1 + count):
        prompt = PROMPTS[seq % len(PROMPTS)]
        completion = {"text": "?", "token_ids": [1], "logprobs": [0.0], "versions": [1], "finish_reason": "length"}
        payload = {
            "task_id": f"many-{seq}",
            "domain": "echo",
            "prompt": prompt,
            "prompt_ids": _ids(prompt),
            "temperature": 1.0,
            "verifier_fields": {"expected": "?"},
            "completions": [{**completion, "reward": 1.0, "verdict": "pass"}],
        }
        messages[seq] = (now, rows_of("scored", payload, seq=seq, id=f"many-{seq}", ts=now, source="verify/0"))
    writer.write(messages)
