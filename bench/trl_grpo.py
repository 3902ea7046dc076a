"""The same Hugging Face task trained by TRL's ``GRPOTrainer`` at its best: the external baseline for bench/learn.py.

    .venv/bin/pip install trl accelerate datasets "torch==<the installed one>"   # not a flywheel dependency
    .venv/bin/python bench/make_hf_task.py /tmp/hf-task    # warm-started model/, train/held-out JSONL, spec.yaml
    .venv/bin/python bench/trl_grpo.py /tmp/hf-task         # lr sweep (short runs), then a run at the best lr
    .venv/bin/python bench/trl_grpo.py /tmp/hf-task --lr 5e-5 --duration 200   # one run at a given lr

Same warm-start model dir, same training rows, same held-out rows and the same reward (the ``math`` verifier's rule:
the completion, stripped, equals the answer as a number) as the flywheel run; prompts start with ``<bos>`` as
flywheel's do. The peer runs at its best, not handicapped:

- Position ids: TRL's logprob forward passes the attention mask but no position ids, and GPT-2 (absolute positions)
  then counts left padding as positions, scoring completions at other positions than ``generate`` sampled them at
  (``generate`` derives positions from the mask). :func:`positions_from_mask` patches the model's forward to derive
  them from the mask when none are given — what flywheel's learner does (reference/ALGORITHMS.md, "Left padding").
- Learning rate: ``--lr`` with several values sweeps them on ``--sweep-duration``-second runs and runs the full
  ``--duration`` at the best (highest mean greedy accuracy over each short run's last 3 evaluations). The default
  range, 2e-5 to 4e-4, brackets the rates the HF task's sweeps have picked (bench/RESULTS.md); a best at either end
  of the range is reported (``best_at_edge`` in the JSON, and by ``vs_trl.py``): the peer's optimum may lie beyond it.

The held-out evaluation: every ``--eval-every-s`` seconds of RL, the first ``--eval-size`` held-out prompts, greedy
(what a served model answers) and sampled at T=1 (``--eval-samples`` per prompt), with the clock stopped while it
runs — so "accuracy after N s of RL" means the same thing for both trainers.

Writes ``bench/results/trl_grpo.json`` (the sweep, the settings, held-out accuracy over RL seconds, samples/s) and
prints a markdown table. Non-goals: tuning TRL beyond its documented knobs (``--lr``, ``--prompts``, ``--group``);
GPUs.
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


def positions_from_mask(model: Any) -> Any:
    """Patch ``model.forward`` to derive position ids from a 2-D attention mask when the caller gives none (the
    positions ``generate`` uses: ``cumsum(mask) − 1``, the last ``input_ids.shape[1]`` of them). Calls that pass
    position ids (``generate`` does) are unchanged. Returns the model."""
    forward = model.forward

    def patched(*args: Any, **kwargs: Any) -> Any:
        mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids")
        if kwargs.get("position_ids") is None and ids is not None and mask is not None and mask.dim() == 2:
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
            kwargs["position_ids"] = positions[:, -ids.shape[1] :]
        return forward(*args, **kwargs)

    model.forward = patched
    return model


def read_rows(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train(args: argparse.Namespace, lr: float, duration: float) -> dict[str, Any]:
    """One GRPO run of ``duration`` seconds of RL at ``lr`` from the task's model dir; its held-out curve."""
    import datasets
    import transformers
    import trl

    model_dir = args.model or args.task / "model"
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = positions_from_mask(transformers.AutoModelForCausalLM.from_pretrained(str(model_dir)))
    held = read_rows(args.task / "heldout.jsonl")[: args.eval_size]
    dataset = datasets.Dataset.from_list(
        [
            {"prompt": tokenizer.bos_token + r["prompt"], "answer": r["answer"]}
            for r in read_rows(args.task / "train.jsonl")
        ]
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
            f"  lr {lr:g}  rl {clock['rl_s']:6.1f} s  step {step:4d}  samples {clock['samples']:6d}  "
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
            if elapsed >= duration:
                control.should_training_stop = True
            return control

    config = trl.GRPOConfig(
        output_dir="/tmp/trl-grpo-out",
        learning_rate=lr,
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
    return {
        "lr": lr,
        "duration_s": duration,
        "samples_per_s": rows[-1]["samples"] / max(rows[-1]["rl_s"], 1e-9),
        "evals": rows,
        "trl_config": {
            "learning_rate": lr,
            "per_device_train_batch_size": config.per_device_train_batch_size,
            "num_generations": config.num_generations,
            "loss_type": getattr(config, "loss_type", None),
            "scale_rewards": getattr(config, "scale_rewards", None),
            "max_grad_norm": config.max_grad_norm,
            "beta": config.beta,
            "num_iterations": config.num_iterations,
            "temperature": config.temperature,
            "epsilon": getattr(config, "epsilon", None),
            "position_ids": "from the attention mask (positions_from_mask)",
        },
    }


def tail_mean(evals: list[dict[str, float]], key: str = "greedy", last: int = 3) -> float:
    """Mean ``key`` accuracy over the last ``last`` evaluations."""
    points = [r[key] for r in evals[-last:]]
    return sum(points) / len(points)


def best_at_edge(rates: list[float], best: float) -> bool:
    """Whether a sweep's ``best`` rate is its lowest or its highest: the optimum may then lie outside the range."""
    return len(rates) > 1 and best in (min(rates), max(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", type=Path, help="a dir written by bench/make_hf_task.py")
    parser.add_argument("--model", type=Path, help="model dir (default: TASK/model)")
    parser.add_argument("--duration", type=float, default=200.0, help="seconds of RL (evaluation time excluded)")
    parser.add_argument(
        "--lr", default="2e-5,5e-5,1e-4,2e-4,4e-4", help="a learning rate, or several to sweep (comma-separated)"
    )
    parser.add_argument("--sweep-duration", type=float, default=90.0, help="seconds of RL of each sweep run")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per optimizer step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--max-new-tokens", type=int, default=5)
    parser.add_argument("--eval-every-s", type=float, default=15.0)
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--eval-samples", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    try:
        import datasets
        import transformers
        import trl
    except ImportError as exc:
        sys.exit(f"bench/trl_grpo.py needs TRL: .venv/bin/pip install trl accelerate datasets ({exc})")
    rates = [float(x) for x in args.lr.split(",") if x.strip()]
    if not rates:
        sys.exit("--lr: expected one learning rate or several, comma-separated")

    # datasets fingerprints every table by pickling it with dill, which fails on some dill/pyarrow pairs
    # ("Can't pickle <class 'MonthDayNano'>"); fingerprints only name cache files, and nothing here is cached.
    datasets.disable_caching()
    datasets.fingerprint.Hasher.hash = classmethod(lambda _cls, _value: uuid.uuid4().hex)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()

    sweep: list[dict[str, Any]] = []
    if len(rates) > 1:
        for lr in rates:
            print(f"sweep: lr {lr:g} for {args.sweep_duration:.0f} s of RL", flush=True)
            run = train(args, lr, args.sweep_duration)
            sweep.append(
                {
                    "lr": lr,
                    "greedy_last3": tail_mean(run["evals"]),
                    "sampled_last3": tail_mean(run["evals"], "sampled"),
                    "evals": run["evals"],
                }
            )
        print(
            markdown_table(
                ["lr", "greedy % (last 3)", "sampled % (last 3)"],
                [
                    [f"{r['lr']:g}", round(100 * r["greedy_last3"], 1), round(100 * r["sampled_last3"], 1)]
                    for r in sweep
                ],
            )
        )
    best = max(sweep, key=lambda r: r["greedy_last3"])["lr"] if sweep else rates[0]
    at_edge = best_at_edge(rates, best)
    if sweep:
        edge = ", at an end of the swept range: TRL's best may lie beyond it" if at_edge else ""
        print(f"best lr {best:g}{edge}: the full run", flush=True)
    result = train(args, best, args.duration)
    rows = result["evals"]
    first = rows[0]
    print(
        markdown_table(
            ["RL s", "samples", "greedy %", "sampled %", "Δ greedy pts"],
            [
                [
                    r["rl_s"],
                    r["samples"],
                    round(100 * r["greedy"], 1),
                    round(100 * r["sampled"], 1),
                    round(100 * (r["greedy"] - first["greedy"]), 1),
                ]
                for r in rows
            ],
        )
    )
    rate = result["samples_per_s"]
    print(f"TRL {trl.__version__}: {rate:.0f} samples/s of RL, lr {best:g}, {args.prompts} prompts x {args.group}")
    write_results(
        "trl_grpo",
        {
            "trainer": f"trl {trl.__version__}",
            "task": str(args.task),
            "lr": best,
            "lr_chosen_by": "sweep" if sweep else "given",
            "best_at_edge": at_edge,
            "sweep": sweep,
            "prompts": args.prompts,
            "group": args.group,
            "eval_size": len(read_rows(args.task / "heldout.jsonl")[: args.eval_size]),
            "eval_samples": args.eval_samples,
            **result,
        },
    )


if __name__ == "__main__":
    main()
