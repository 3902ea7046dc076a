"""A Hugging Face model dir + a JSONL task + a spec, to run ``bench/learn.py --spec`` on users' own kind of setup.

    .venv/bin/python bench/make_hf_task.py /tmp/hf-task            # writes model/, train.jsonl, heldout.jsonl, spec.yaml
    .venv/bin/python bench/learn.py --spec /tmp/hf-task/spec.yaml --variants async,sync

The model is a randomly initialised GPT-2 of about 0.8M parameters (4 layers, width 128) with a character-level
``PreTrainedTokenizerFast`` whose prompts start with ``<bos>``; the task is two-number addition, rows
``{"prompt": "37+58=", "answer": "95"}``, with a separate held-out file. The spec warm-starts the model on the
rows' answers, then trains it with the embedded default's actors and learner settings. Point ``policy.model`` and
the domain's files at your own to compare with another trainer on the same warm-start model, task and reward.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SPEC = """\
# Written by bench/make_hf_task.py: a local Hugging Face model dir and a JSONL task, on the embedded default's
# actors and learner settings (specs/embedded.yaml).
name: hf-addition
bus: {{embedded: true}}
runtime: {{kind: local, run_dir: runs}}
policy:
  model: hf:model
  warm_start: {{steps: {warm_steps}, lr: 2.0e-3, batch_size: 32}}
domains:
  addition:
    source: jsonl:train.jsonl
    heldout: jsonl:heldout.jsonl
    verifier: math
    group_size: 8
    max_new_tokens: 5
actors:
  source: {{resources: {{num_cpus: 0}}, max_pending: 24, max_in_flight: 32}}
  generator: {{resources: {{num_cpus: 0.5}}, engine: torch, device: cpu, max_batch_size: 64, temperature: 1.0}}
  verify: {{resources: {{num_cpus: 0.5}}, sandbox: {{workers: 1}}}}
  learner:
    resources: {{num_cpus: 1}}
    device: cpu
    lr: 1.0e-4
    batch_size: 64
    max_staleness: 4
    publish_every_steps: 2
    checkpoint_every_steps: 20
    eval_every_steps: 20
    eval_size: 200
"""


def rows(rng: random.Random, n: int, digits: int) -> list[dict[str, str]]:
    top = 10**digits
    seen: set[str] = set()
    out = []
    while len(out) < n:
        a, b = rng.randrange(top), rng.randrange(top)
        prompt = f"{a}+{b}="
        if prompt not in seen:
            seen.add(prompt)
            out.append({"prompt": prompt, "answer": str(a + b)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--train", type=int, default=5000)
    parser.add_argument("--heldout", type=int, default=200)
    parser.add_argument("--warm-steps", type=int, default=300)
    args = parser.parse_args()

    from actors.policy._testing import write_tiny_hf_model

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    write_tiny_hf_model(out / "model", n_layer=4, n_embd=128, n_head=4, max_positions=64, bos=True)
    every = rows(random.Random(0), args.train + args.heldout, args.digits)
    for name, part in (("train.jsonl", every[: args.train]), ("heldout.jsonl", every[args.train:])):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    (out / "spec.yaml").write_text(SPEC.format(warm_steps=args.warm_steps))
    print(f"wrote {out}/model, train.jsonl ({args.train} rows), heldout.jsonl ({args.heldout}), spec.yaml")


if __name__ == "__main__":
    main()
