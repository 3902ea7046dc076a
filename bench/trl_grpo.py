"""The same Hugging Face task trained by TRL's ``GRPOTrainer`` — the external baseline for ``bench/learn.py --spec``.

    .venv/bin/pip install trl accelerate datasets         # not a flywheel dependency
    .venv/bin/python bench/make_hf_task.py /tmp/hf-task    # warm-started model/, train/held-out JSONL, spec.yaml
    .venv/bin/python bench/trl_grpo.py /tmp/hf-task --duration 120
    .venv/bin/python bench/learn.py --spec /tmp/hf-task/spec.yaml --variants async --duration 120

Same warm-start model dir, same training rows, same held-out rows and the same reward (the ``math`` verifier's rule:
the completion, stripped, equals the answer as a number) as the flywheel run; prompts start with ``<bos>`` as
flywheel's do. The held-out evaluation is the one ``bench/learn.py`` reports: every ``--eval-every-s`` seconds of RL,
the first ``--eval-size`` held-out prompts, greedy and sampled at T=1 (``--eval-samples`` per prompt), with the
clock stopped while it runs — so "accuracy after N s of RL" means the same thing for both.

Writes ``bench/results/trl_grpo.json`` (held-out accuracy over RL seconds, samples/s) and prints a markdown table.
Non-goals: tuning TRL beyond its documented knobs (``--lr``, ``--prompts``, ``--group``); GPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import markdown_table, write_results  # noqa: E402


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def correct(completion: str, answer: str) -> bool:
    got, want = _number(completion), _number(answer)
    return got is not None and want is not None and abs(got - want) <= 1e-9 * max(1.0, abs(want))


def heldout_accuracy(
    model: Any, tokenizer: Any, rows: list[dict[str, str]], *, temperature: float, samples: int, max_new_tokens: int
) -> float:
    """Mean correctness over ``samples`` completions of each row (greedy when temperature is 0)."""
    model.eval()
    prompts = [tokenizer.bos_token + r["prompt"] for r in rows for _ in range(samples)]
    answers = [r["answer"] for r in rows for _ in range(samples)]
    tokenizer.padding_side = "left"
    good = 0
    with torch.inference_mode():
        for start in range(0, len(prompts), 256):
            batch = tokenizer(prompts[start : start + 256], return_tensors="pt", padding=True, add_special_tokens=False)
            kwargs: dict[str, Any] = {
                "do_sample": temperature > 0,
                "max_new_tokens": max_new_tokens,
                "pad_token_id": tokenizer.pad_token_id,
                "eos_token_id": tokenizer.eos_token_id,
            }
            if temperature > 0:
                kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
            out = model.generate(**batch, **kwargs)
            texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
            good += sum(correct(t, a) for t, a in zip(texts, answers[start : start + 256], strict=True))
    return good / max(len(prompts), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", type=Path, help="a dir written by bench/make_hf_task.py")
    parser.add_argument("--model", type=Path, help="model dir (default: TASK/model)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of RL (evaluation time excluded)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per optimizer step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--max-new-tokens", type=int, default=5)
    parser.add_argument("--eval-every-s", type=float, default=15.0)
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    try:
        import datasets
        import transformers
        import trl
    except ImportError as exc:
        sys.exit(f"bench/trl_grpo.py needs TRL: .venv/bin/pip install trl accelerate datasets ({exc})")

    # datasets fingerprints every table by pickling it with dill, which fails on some dill/pyarrow pairs
    # ("Can't pickle <class 'MonthDayNano'>"); fingerprints only name cache files, and nothing here is cached.
    datasets.disable_caching()
    datasets.fingerprint.Hasher.hash = classmethod(lambda _cls, _value: uuid.uuid4().hex)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    model_dir = args.model or args.task / "model"
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir))
    train = [json.loads(line) for line in (args.task / "train.jsonl").read_text().splitlines() if line.strip()]
    held = [json.loads(line) for line in (args.task / "heldout.jsonl").read_text().splitlines() if line.strip()][
        : args.eval_size
    ]
    dataset = datasets.Dataset.from_list(
        [{"prompt": tokenizer.bos_token + r["prompt"], "answer": r["answer"]} for r in train]
    )

    def reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [1.0 if correct(c, a) else 0.0 for c, a in zip(completions, answer, strict=True)]

    rows: list[dict[str, float]] = []
    clock = {"rl_s": 0.0, "since": time.perf_counter(), "samples": 0}

    def evaluate(step: int) -> None:
        clock["rl_s"] += time.perf_counter() - clock["since"]
        greedy = heldout_accuracy(
            model, tokenizer, held, temperature=0.0, samples=1, max_new_tokens=args.max_new_tokens
        )
        sampled = heldout_accuracy(
            model, tokenizer, held, temperature=1.0, samples=args.eval_samples, max_new_tokens=args.max_new_tokens
        )
        rows.append(
            {
                "rl_s": round(clock["rl_s"], 2),
                "step": step,
                "samples": clock["samples"],
                "greedy": greedy,
                "sampled": sampled,
            }
        )
        print(
            f"  rl {clock['rl_s']:6.1f} s  step {step:4d}  samples {clock['samples']:6d}  "
            f"held-out greedy {100 * greedy:5.1f} %  sampled {100 * sampled:5.1f} %",
            flush=True,
        )
        clock["since"] = time.perf_counter()

    class Clock(transformers.TrainerCallback):  # type: ignore[misc]
        last_eval = 0.0

        def on_step_end(self, _args: Any, state: Any, control: Any, **__: Any) -> Any:
            clock["samples"] = state.global_step * args.prompts * args.group
            elapsed = clock["rl_s"] + time.perf_counter() - clock["since"]
            if elapsed - self.last_eval >= args.eval_every_s:
                evaluate(state.global_step)
                self.last_eval = clock["rl_s"]
            if elapsed >= args.duration:
                control.should_training_stop = True
            return control

    config = trl.GRPOConfig(
        output_dir="/tmp/trl-grpo-out",
        learning_rate=args.lr,
        per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        num_iterations=1,
        max_steps=1_000_000,
        logging_steps=10**9,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        disable_dropout=True,
        dataloader_num_workers=0,
        seed=0,
        lr_scheduler_type="constant",
        warmup_steps=0,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    clock["since"] = time.perf_counter()
    evaluate(0)
    trainer.train()
    if rows[-1]["step"] != trainer.state.global_step:
        evaluate(trainer.state.global_step)

    first = rows[0]
    print(
        markdown_table(
            ["RL s", "samples", "greedy %", "sampled %", "Δ sampled pts"],
            [
                [
                    r["rl_s"],
                    r["samples"],
                    round(100 * r["greedy"], 1),
                    round(100 * r["sampled"], 1),
                    round(100 * (r["sampled"] - first["sampled"]), 1),
                ]
                for r in rows
            ],
        )
    )
    rate = rows[-1]["samples"] / max(rows[-1]["rl_s"], 1e-9)
    print(f"TRL {trl.__version__}: {rate:.0f} samples/s of RL, lr {args.lr}, {args.prompts} prompts x {args.group}")
    write_results(
        "trl_grpo",
        {
            "trainer": f"trl {trl.__version__}",
            "lr": args.lr,
            "prompts": args.prompts,
            "group": args.group,
            "samples_per_s": rate,
            "evals": rows,
        },
    )


if __name__ == "__main__":
    main()
