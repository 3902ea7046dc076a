"""A warm-started Hugging Face model dir + a JSONL task + a spec: ``bench/learn.py --spec`` on users' kind of setup.

    .venv/bin/python bench/make_hf_task.py /tmp/hf-task            # model/, init/, train/heldout JSONL, spec.yaml
    .venv/bin/python bench/learn.py --spec /tmp/hf-task/spec.yaml --variants async,sync
    .venv/bin/python bench/trl_grpo.py /tmp/hf-task                 # the same model, task and reward under TRL

The model is a GPT-2 of about 0.8M parameters (4 layers, width 128; ``--arch llama``: a Llama of the same depth
and width, ~1M parameters, which runs on transformers' forward — the same warm start leaves it at ~11-14 % sampled
held-out accuracy) with a character-level
``PreTrainedTokenizerFast`` whose prompts start with ``<bos>``; the task is two-number addition, rows
``{"prompt": "37+58=", "answer": "95"}``, with a separate held-out file. ``init/`` is the random initialisation;
``model/`` is it after ``--warm-steps`` supervised steps on the training rows' answers (flywheel's own SFT step,
warmup + cosine to ``--warm-lr``, dropout off), so every trainer compared starts from the same weights: the spec
has ``warm_start.steps: 0``. Measured here: 1,250 of a 2,000-step schedule (the default) leave ~38 % greedy /
~22 % sampled held-out accuracy — room for RL to climb; the full 2,000 reach ~81 % / ~69 %; 2-digit addition is
learnt abruptly between steps 1,000 and 1,500. Where that jump falls depends on the machine's floating point: on
another 2-core machine the default left 7.6 % sampled (RL then gained nothing in 190 s), 2,000 of 2,000 left 8 %, and
``--warm-steps 2000 --warm-schedule 3500`` left 66 % greedy / 49 % sampled (2,400 of 3,500: 79 % / 76 %). Check the
post-warm-start round before comparing trainers; RL needs some reward to climb from. Point ``policy.model`` and the
domain's files at your own to compare with another trainer on your warm-start model, task and reward.
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
  model: hf:model           # already warm-started by make_hf_task.py (the same weights any other trainer gets)
  warm_start: {{steps: 0}}
domains:
  addition:
    source: jsonl:train.jsonl
    heldout: jsonl:heldout.jsonl
    verifier: math
    group_size: 8
    max_new_tokens: 5
actors:
  source: {{resources: {{num_cpus: 0}}, max_pending: 24, max_in_flight: 48}}  # 48 groups ahead of the learner:
  # with weights through the disk staleness stays under 1 version; 32 trained 620 samples/s, 48 622-668, 64 620-646
  generator: {{resources: {{num_cpus: 0.5}}, engine: torch, device: cpu, max_batch_size: 64, temperature: 1.0}}
  verify: {{resources: {{num_cpus: 0.5}}, sandbox: {{workers: 1}}}}
  learner:
    resources: {{num_cpus: 1}}
    device: cpu
    lr: 1.0e-4
    batch_size: 64
    ppo_epochs: 1              # measured (130-s runs): 1 pass 495-570 samples/s, 2 passes 388, same accuracy curve
    max_staleness: 4
    weight_transport: disk     # a safetensors dir in the run dir instead of the bus's object store: 551 -> 620
                               # samples/s, staleness 1.6 -> 0.6 versions (object store, every 4 steps: 551)
    publish_every_steps: 4     # each publish is a 3 MB copy and a swap in the generator: every 2 steps 486
                               # samples/s, every 4 steps 620 (disk); 495 vs 551 through the object store
    checkpoint_every_steps: 100
    eval_every_steps: 90       # ~10 s: held-out rounds are generation the training does not get
    eval_size: 200
    eval_temperature: 1.0      # sampled, as bench/trl_grpo.py also reports it (and greedy)
    eval_samples: 4            # 800 completions a round: ±1.5 points of noise
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


def warm_start_model(
    init: Path, out: Path, rows: list[dict[str, str]], *, steps: int, stop_at: int, lr: float, seed: int = 0
) -> float:
    """``stop_at`` steps of a ``steps``-step SFT schedule on ``rows``; saves the model (HF layout) to ``out``."""
    import shutil

    import torch

    from actors.learner import PPOConfig, Trainer
    from actors.learner._warmstart import lr_at
    from actors.policy import Policy

    policy = Policy.from_spec({"model": f"hf:{init}"})
    trainer = Trainer(policy, lr=lr, ppo=PPOConfig(), grad_clip=1.0)
    optimizer = torch.optim.AdamW(trainer.params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    loss = float("nan")
    for step in range(1, stop_at + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        loss = trainer.sft_step(optimizer, [(r["prompt"], r["answer"]) for r in rng.sample(rows, 32)])
        if step % 250 == 0 or step == stop_at:
            print(f"  warm start {step}/{stop_at}: loss {loss:.3f}", flush=True)
    policy.weights.save_pretrained(str(out))
    for tokenizer_file in init.glob("*token*"):
        shutil.copy(tokenizer_file, out / tokenizer_file.name)
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--train", type=int, default=5000)
    parser.add_argument("--heldout", type=int, default=200)
    parser.add_argument("--warm-steps", type=int, default=1250, help="supervised steps taken (0: model/ = init/)")
    parser.add_argument("--warm-schedule", type=int, default=2000, help="length of the lr schedule they follow")
    parser.add_argument("--warm-lr", type=float, default=3e-3)
    parser.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2", help="model architecture")
    args = parser.parse_args()

    import torch

    from actors.policy import write_tiny_hf_model

    torch.set_num_threads(2)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    shape = {"arch": args.arch, "n_layer": 4, "n_embd": 128, "n_head": 4, "max_positions": 64, "bos": True}
    write_tiny_hf_model(out / "init", **shape)
    every = rows(random.Random(0), args.train + args.heldout, args.digits)
    train, heldout = every[: args.train], every[args.train :]
    for name, part in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    if args.warm_steps > 0:
        warm_start_model(
            out / "init",
            out / "model",
            train,
            steps=max(args.warm_schedule, args.warm_steps),
            stop_at=args.warm_steps,
            lr=args.warm_lr,
        )
    else:
        write_tiny_hf_model(out / "model", **shape)
    (out / "spec.yaml").write_text(SPEC.format())
    print(
        f"wrote {out}/model (warm start: {args.warm_steps} steps), init/, train.jsonl ({args.train} rows), "
        f"heldout.jsonl ({args.heldout}), spec.yaml"
    )
    import transformers

    from bench.trl_grpo import heldout_accuracy  # the rule and decoding the TRL comparison evaluates with

    model = transformers.AutoModelForCausalLM.from_pretrained(str(out / "model"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out / "model"))
    greedy, sampled = (
        heldout_accuracy(model, tokenizer, heldout, temperature=t, samples=1, max_new_tokens=5) for t in (0.0, 1.0)
    )
    print(f"held-out accuracy of model/: {100 * greedy:.1f} % greedy, {100 * sampled:.1f} % sampled at T=1")
    if sampled < 0.15:
        print(
            "  warning: little reward for RL to climb from; the jump in this warm start falls at a different step "
            "on different machines: try more --warm-steps (or a longer --warm-schedule)"
        )


if __name__ == "__main__":
    main()
