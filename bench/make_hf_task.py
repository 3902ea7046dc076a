"""A warm-started Hugging Face model dir + a JSONL task + a spec: ``bench/learn.py --spec`` on users' kind of setup.

    .venv/bin/python bench/make_hf_task.py /tmp/hf-task            # model/, init/, train/heldout JSONL, spec.yaml
    .venv/bin/python bench/learn.py --spec /tmp/hf-task/spec.yaml --variants async
    .venv/bin/python bench/trl_grpo.py /tmp/hf-task                 # the same model, task and reward under TRL

The setup is the one an outside user would try (issue 24): a GPT-2 of about 0.8M parameters (4 layers, width 128;
``--arch llama``: a Llama of the same depth and width, ~1M parameters, on transformers' forward; ``--layers`` and
``--width`` make it larger) with a
character-level ``PreTrainedTokenizerFast`` whose prompts start with ``<bos>``; two-operand addition with operands in
[0, 10^digits), rows ``{"prompt": "37+58=", "answer": "95"}``, and a separate held-out file (500 rows by default).
``init/`` is the random initialisation; ``model/`` is it after ``--warm-steps`` supervised steps on the training
rows' answers (flywheel's own SFT step, warmup + cosine to ``--warm-lr``, dropout off), so every trainer compared
starts from the same weights. The defaults aim at a start with room to climb (about a third right, greedy); the
supervised curve has a steep jump whose step depends on the machine's floating point, so the script measures the
result with ``bench/trl_grpo.py``'s rule and says when RL has little to climb from, or little left to learn
(``--seed`` draws another task and initialisation: a variant nobody tuned on).

``spec.yaml`` names only what such a user would: the model dir, the JSONL domain (``verifier: math``,
``group_size: 8``, ``max_new_tokens: 5``), the four actors, and a greedy held-out evaluation of every held-out prompt
every 100 steps. Everything else is flywheel's default, so the comparison measures the defaults (bench/RESULTS.md
has the runs). Point ``policy.model`` and the domain's files at your own to compare with another trainer on your
warm-start model, task and reward.
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
# Written by bench/make_hf_task.py: a local Hugging Face model dir and a JSONL task; every other setting is
# flywheel's default.
name: hf-addition
policy:
  model: hf:model           # already warm-started by make_hf_task.py (the same weights any other trainer gets)
domains:
  addition:
    source: jsonl:train.jsonl
    heldout: jsonl:heldout.jsonl
    verifier: math
    group_size: 8
    max_new_tokens: 5
actors:
  source: {{}}
  generator: {{}}
  verify: {{}}
  learner:
    eval_every_steps: 100   # greedy (the default decoding) held-out accuracy of every held-out prompt
    eval_size: {heldout}
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
    init: Path,
    out: Path,
    rows: list[dict[str, str]],
    heldout: list[dict[str, str]],
    *,
    steps: int,
    lr: float,
    target: float | None,
    seed: int = 0,
) -> tuple[int, float]:
    """SFT on ``rows`` along a ``steps``-step schedule, stopped once the greedy held-out accuracy
    (``bench/trl_grpo.py``'s rule) reaches ``target`` (never stopped early when None); saves the model (HF layout) to
    ``out``. Returns the steps taken and the last greedy accuracy measured."""
    import shutil

    import torch
    import transformers

    from actors.learner import PPOConfig, Trainer
    from actors.learner._warmstart import lr_at
    from actors.policy import Policy
    from bench.trl_grpo import heldout_accuracy  # the rule and decoding the TRL comparison evaluates with

    policy = Policy.from_spec({"model": f"hf:{init}"})
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(init))
    trainer = Trainer(policy, lr=lr, ppo=PPOConfig(), grad_clip=1.0)
    optimizer = torch.optim.AdamW(trainer.params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    loss, greedy, step = float("nan"), 0.0, 0
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, lr)
        loss = trainer.sft_step(optimizer, [(r["prompt"], r["answer"]) for r in rng.sample(rows, 32)])
        # the climb is steep near the target (a few points per 10 steps): look often there, rarely before
        if target is not None and step % (10 if greedy >= target / 2 else 50) == 0:
            greedy = heldout_accuracy(policy.weights, tokenizer, heldout, temperature=0.0, samples=1, max_new_tokens=5)
            if greedy >= target:
                break
        if step % 250 == 0:
            print(f"  warm start {step}/{steps}: loss {loss:.3f}, greedy held-out {100 * greedy:.1f} %", flush=True)
    print(f"  warm start stopped at {step}/{steps}: loss {loss:.3f}", flush=True)
    policy.weights.save_pretrained(str(out))
    for tokenizer_file in init.glob("*token*"):
        shutil.copy(tokenizer_file, out / tokenizer_file.name)
    return step, greedy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--train", type=int, default=5000)
    parser.add_argument("--heldout", type=int, default=500)
    parser.add_argument("--warm-steps", type=int, default=4000, help="length of the supervised lr schedule (0: none)")
    parser.add_argument(
        "--target",
        type=float,
        default=0.38,
        help="stop the warm start once greedy held-out accuracy reaches this (0: run the whole schedule)",
    )
    parser.add_argument("--warm-lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0, help="seed of the task rows, the initialisation and the SFT")
    parser.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2", help="model architecture")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks")
    parser.add_argument("--width", type=int, default=128, help="hidden size (heads of 32 dimensions each)")
    args = parser.parse_args()

    import torch

    from actors.policy import write_tiny_hf_model

    torch.set_num_threads(2)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.width % 32:
        parser.error(f"--width must be a multiple of 32 (heads of 32 dimensions), got {args.width}")
    shape = {
        "arch": args.arch,
        "n_layer": args.layers,
        "n_embd": args.width,
        "n_head": args.width // 32,
        "max_positions": 64,
        "bos": True,
    }
    write_tiny_hf_model(out / "init", seed=args.seed, **shape)
    every = rows(random.Random(args.seed), args.train + args.heldout, args.digits)
    train, heldout = every[: args.train], every[args.train :]
    for name, part in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    steps = 0
    if args.warm_steps > 0:
        steps, _ = warm_start_model(
            out / "init",
            out / "model",
            train,
            heldout,
            steps=args.warm_steps,
            lr=args.warm_lr,
            target=args.target or None,
            seed=args.seed,
        )
    else:
        write_tiny_hf_model(out / "model", seed=args.seed, **shape)
    (out / "spec.yaml").write_text(SPEC.format(heldout=args.heldout))
    print(
        f"wrote {out}/model (warm start: {steps} of {args.warm_steps} steps), init/, train.jsonl ({args.train} rows), "
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
    if greedy < 0.15:
        print("  warning: little reward for RL to climb from: try a larger --warm-steps or --target")
    elif greedy > 0.6:
        print("  warning: little left for RL to learn: the warm start overshot --target (try another --seed)")


if __name__ == "__main__":
    main()
