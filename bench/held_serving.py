"""The learner while the gate holds the served version: does it stay close to what users are served?

When the gate rejects every candidate, every sample the learner gets comes from the one version still serving. This
bench reproduces that without a service, so settings can be compared on the same data in minutes:

* μ, the served policy, is frozen: the warm-started checkpoint bench/users.py serves first (the same cache);
* it answers the production prompts users ask (``specs/data/production.jsonl``, training split, Zipf popularity, at
  T=1 and 8 tokens like ``bench/users.py``'s users); the math verifier's verdict is the user's thumbs up / down;
* a learner built with ``specs/service.yaml``'s learner settings (lr, batch size, loss) trains on those single
  samples with the per-domain running baseline, as the service's learner does on joined feedback — and on nothing
  else: never on its own answers;
* every ``--eval-every`` steps: the learner's ``behavior_kl`` (its own metric: k3 KL(μ ‖ learner) per token) and the
  accuracy of its weights, sampled at T=1, on a replay set drawn like users' traffic (what the gate scores a
  candidate on) and on the held-out production prompts; μ's own accuracy on both is the line to stay above.

Each ``--coefs`` value of ``behavior_kl_coef`` runs on the same answers in the same order (same seed).

    python bench/held_serving.py --quick            # 2 settings, 120 steps
    python bench/held_serving.py                    # 0, 0.1, 0.3, 1.0; 400 steps

Writes bench/results/held_serving.json and .png and prints a markdown table. What it does not model: the served
version changing (promotion is what ends the drift in the service) and the task domains' data (the ``mixed``
variant), which is on-policy and anchors the learner by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._common import RESULTS_DIR, markdown_table, write_results  # noqa: E402
from bench.users import DOMAIN, SERVICE, correct, production_rows, warm_checkpoint, zipf_weights  # noqa: E402

MAX_NEW_TOKENS = 8


def learner_settings() -> Any:
    from actors.learner import LearnerConfig
    from topology import load_spec

    config = load_spec(SERVICE).actors["learner"].config
    assert isinstance(config, LearnerConfig)
    return config


async def answer(engine: Any, prompts: list[list[int]], seed: int) -> list[Any]:
    from actors.engines import GenerationRequest, SamplingParams

    requests = [
        GenerationRequest(f"r{seed}-{i}", tuple(ids), SamplingParams(MAX_NEW_TOKENS, temperature=1.0, seed=seed + i))
        for i, ids in enumerate(prompts)
    ]
    completions: list[Any] = await engine.generate(requests)
    return completions


def accuracy(completions: list[Any], answers: list[str]) -> float:
    return sum(correct(c.text, a) for c, a in zip(completions, answers, strict=True)) / max(len(answers), 1)


def run(opts: argparse.Namespace) -> dict[str, Any]:
    import torch

    from actors.engines import TorchEngine
    from actors.learner import AdvantageEstimator, Trainer, TrainSample
    from actors.policy import Policy, encode_prompt
    from actors.protocol import policy_of
    from topology import load_spec

    torch.set_num_threads(opts.threads)
    checkpoint = warm_checkpoint(opts.warm_steps)
    policy_spec = policy_of(load_spec(SERVICE))
    settings = learner_settings()
    rows, _ = production_rows(SERVICE)
    from actors.domains import domains_from_spec

    heldout_tasks = domains_from_spec(load_spec(SERVICE), [DOMAIN])[DOMAIN].source.heldout()
    heldout = [(t.prompt, str(t.verifier_fields["answer"])) for t in heldout_tasks] * opts.heldout_samples
    rng = random.Random(opts.seed)
    cum = zipf_weights(len(rows), 1.0)
    replay = rng.choices(rows, cum_weights=cum, k=opts.replay)
    traffic = rng.choices(rows, cum_weights=cum, k=opts.steps * settings.batch_size)

    def load() -> Policy:
        policy = Policy.from_spec(policy_spec)
        policy.load_file(checkpoint)
        return policy

    async def main() -> dict[str, Any]:
        served = TorchEngine(load(), max_batch_size=128, seed=opts.seed)
        tok = served.tokenizer
        started = time.perf_counter()
        answered = await answer(served, [encode_prompt(tok, p) for p, _ in traffic], opts.seed)
        reference = {
            "replay": accuracy(
                await answer(served, [encode_prompt(tok, p) for p, _ in replay], 10**6), [a for _, a in replay]
            ),
            "heldout": accuracy(
                await answer(served, [encode_prompt(tok, p) for p, _ in heldout], 2 * 10**6), [a for _, a in heldout]
            ),
            "traffic": accuracy(answered, [a for _, a in traffic]),
        }
        print(
            f"held_serving: μ answered {len(answered)} requests in {time.perf_counter() - started:.0f} s; {reference}"
        )
        runs: dict[str, Any] = {}
        for coef in opts.coefs:
            policy = load()
            trainer = Trainer(
                policy,
                lr=settings.lr,
                weight_decay=settings.weight_decay,
                grad_clip=settings.grad_clip,
                ppo=dataclasses.replace(settings.ppo(), behavior_kl_coef=coef),
                ppo_epochs=settings.ppo_epochs,
                minibatches=settings.minibatches,
            )
            estimator = AdvantageEstimator(normalize=settings.normalize, decay=settings.baseline_decay)
            candidate = TorchEngine(load(), max_batch_size=128, seed=opts.seed)
            curve: list[dict[str, float]] = []
            window: list[float] = []
            begun = time.perf_counter()
            for step in range(1, opts.steps + 1):
                batch = range((step - 1) * settings.batch_size, step * settings.batch_size)
                samples = []
                for i in batch:
                    c = answered[i]
                    reward = float(correct(c.text, traffic[i][1]))
                    advantage = estimator.single(DOMAIN, reward)
                    samples.append(TrainSample(c.prompt_ids, c.token_ids, c.logprobs, advantage, 1.0))
                stats = await asyncio.to_thread(trainer.rl_step, samples)
                window.append(stats.behavior_kl)
                if step % opts.eval_every == 0 or step == opts.steps:
                    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
                    await candidate.update_weights(step, state)
                    point = {
                        "step": step,
                        "behavior_kl": round(sum(window) / len(window), 4),
                        "iw_mean": round(stats.iw_mean, 4),
                        "replay": accuracy(
                            await answer(candidate, [encode_prompt(tok, p) for p, _ in replay], 10**6),
                            [a for _, a in replay],
                        ),
                        "heldout": accuracy(
                            await answer(candidate, [encode_prompt(tok, p) for p, _ in heldout], 2 * 10**6),
                            [a for _, a in heldout],
                        ),
                    }
                    window = []
                    curve.append(point)
                    print(f"held_serving[{coef:g}]: {point}", flush=True)
            await candidate.close()
            runs[f"{coef:g}"] = {"behavior_kl_coef": coef, "curve": curve, "train_s": time.perf_counter() - begun}
        await served.close()
        return {"served": reference, "runs": runs}

    return asyncio.run(main())


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    for name, r in result["runs"].items():
        steps = [p["step"] for p in r["curve"]]
        axes[0].plot(steps, [max(p["behavior_kl"], 1e-4) for p in r["curve"]], marker="o", label=f"β_μ = {name}")
        axes[1].plot(steps, [p["replay"] for p in r["curve"]], marker="o", label=f"β_μ = {name}")
        axes[2].plot(steps, [p["heldout"] for p in r["curve"]], marker="o", label=f"β_μ = {name}")
    for ax, key in ((axes[1], "replay"), (axes[2], "heldout")):
        ax.axhline(result["served"][key], color="black", ls="--", label="μ (served)")
    axes[0].set(title="behavior_kl: k3 KL(μ ‖ learner)", xlabel="learner steps", ylabel="nats / token", yscale="log")
    axes[1].set(title="learner on a replay of users' traffic (the gate's test)", xlabel="learner steps")
    axes[2].set(title="learner on held-out production prompts", xlabel="learner steps")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("bench/held_serving.py — every sample from one held version μ")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coefs", default="0,0.1,0.3,1", help="behavior_kl_coef values, comma-separated")
    parser.add_argument("--steps", type=int, default=400, help="learner steps on the held version's answers")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--replay", type=int, default=512, help="replayed requests per evaluation")
    parser.add_argument("--heldout-samples", type=int, default=4, help="samples per held-out prompt")
    parser.add_argument("--warm-steps", type=int, default=450)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="0 and 0.3, 120 steps")
    opts = parser.parse_args()
    if opts.quick:
        opts.coefs, opts.steps, opts.eval_every, opts.replay, opts.heldout_samples = "0,0.3", 120, 40, 256, 2
    opts.coefs = [float(c) for c in opts.coefs.split(",") if c.strip()]
    result = run(opts)
    path = write_results("held_serving", {"settings": vars(opts), **result})
    plot(result, RESULTS_DIR / "held_serving.png")
    rows = []
    for name, r in result["runs"].items():
        last = r["curve"][-1]
        peak = max(p["behavior_kl"] for p in r["curve"])
        rows.append(
            [
                name,
                f"{peak:.3g}",
                f"{last['behavior_kl']:.3g}",
                f"{100 * last['replay']:.1f}%",
                f"{100 * last['heldout']:.1f}%",
            ]
        )
    served = result["served"]
    rows.append(["μ (served)", "—", "—", f"{100 * served['replay']:.1f}%", f"{100 * served['heldout']:.1f}%"])
    print(
        markdown_table(
            ["behavior_kl_coef", "behavior_kl max", "last", "replay acc (last)", "held-out acc (last)"], rows
        )
    )
    print(f"wrote {path} and {RESULTS_DIR / 'held_serving.png'}")


if __name__ == "__main__":
    main()
