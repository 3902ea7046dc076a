"""Config of the `learner` actor kind (light module: no torch; registers the kind on import).

The learner trains the policy off-policy from `scored` (decoupled PPO with truncated importance weights,
GRPO group advantages, per-domain baselines; see reference/ALGORITHMS.md) and publishes new weights. It also
triggers the held-out evaluation: every `eval_every_steps` it publishes held-out prompts to `prompts`
(greedy unless `eval_temperature` > 0, `heldout: true`) and reads their scores back from `scored` — it never trains on
them.

`mode: sync` is the synchronous baseline (what the async loop is measured against): staleness is forced to 0,
the learner trains on exactly one batch per weights version, and the source publishes one batch of prompts per
version (see `actors.source._actor`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from topology import ActorKind, SpecModel, register_actor_kind


class LearnerConfig(SpecModel):
    """Fields of a `learner` actor block (besides kind/replicas/resources/consumes/publishes)."""

    mode: Literal["async", "sync"] = "async"  # sync: one batch per version, max_staleness forced to 0 (baseline)
    lr: float = Field(default=1e-4, gt=0)  # RL learning rate (bench/RESULTS.md has the sweeps behind the default)
    weight_decay: float = Field(default=0.0, ge=0)  # AdamW weight decay of the RL optimizer
    batch_size: int = Field(default=64, ge=1)  # completions per optimizer step
    ppo_epochs: int = Field(
        default=1, ge=1
    )  # passes over each batch (ratio current/proximal moves off 1 after the first)
    minibatches: int = Field(default=1, ge=1)  # optimizer steps per pass (the batch split by completions)
    max_staleness: int = Field(default=4, ge=0)  # drop samples older than this many versions; 0 = synchronous
    publish_every_steps: int = Field(default=1, ge=1)  # publish new weights every K optimizer steps...
    publish_min_interval_s: float = Field(default=0.25, ge=0)  # ...and no sooner than this after the previous
    #   version: a floor that only binds when steps are fast (tiny models), where each version costs the generators
    #   a weight swap and a KV-cache rebuild; 0 = exactly every K steps. Sync mode publishes after every step.
    checkpoint_every_steps: int = Field(default=50, ge=1)  # checkpoint (then ack what it covers) every K steps
    eval_every_steps: int = Field(default=20, ge=0)  # held-out evaluation cadence in steps; 0 = off
    eval_size: int = Field(default=64, ge=1)  # held-out prompts per domain per evaluation (the first N, fixed)
    # 0: greedy (what a served model answers); > 0: sampled at this temperature (the generators' measures the very
    #   policy RL trains — greedy decoding of a tiny model can lag far behind it); a list: one round per decoding
    #   (e.g. [0, 1]: greedy and sampled side by side), the first one the headline in the live view
    eval_temperature: float | tuple[float, ...] = 0.0
    eval_samples: int = Field(default=1, ge=1)  # completions per held-out prompt when sampled; accuracy is their mean
    # completions per prompt in the post-warm-start round, the one every gain is measured from (its noise lands on
    # every gain); null: eval_samples, at least 4, when sampled, 1 when greedy (greedy completions are all the same)
    eval_baseline_samples: int | None = Field(default=None, ge=1)
    clip_low: float = Field(default=0.2, gt=0, lt=1)  # PPO clip below: ratio >= 1 - clip_low
    clip_high: float = Field(default=0.28, gt=0)  # PPO clip above ("clip-higher"): ratio <= 1 + clip_high
    iw_cap: float = Field(default=3.0, ge=1)  # truncation C of the importance weight proximal/behavior
    kl_beta: float = Field(default=0.0, ge=0)  # weight of the k3 KL to the post-warm-start policy; 0 = off
    grad_clip: float = Field(default=1.0, gt=0)  # max global gradient norm
    loss_aggregation: Literal["token-mean", "seq-mean"] = "token-mean"  # token-mean: every token weighs the same;
    #   seq-mean: every completion does (domains of very different lengths share the gradient) — see _loss.py
    normalize: Literal["domain", "group", "none"] = "domain"  # advantage scale: each domain's reward units,
    #   the group's std (classic GRPO) or raw centred rewards — see actors/learner/_advantages.py
    failed_groups: Literal["skip", "reference"] = "skip"  # a group with no correct completion: skip it when it
    #   carries no signal (all 0), or add the task's reference answer as one more completion with reward 1
    #   (off-policy guidance: importance weight 1, the failed completions get a negative advantage; partial
    #   credit counts as failed) — see _actor.py `_guidance`; a domain's own `failed_groups` overrides this
    baseline_decay: float = Field(default=0.99, gt=0, lt=1)  # running baseline of single (non-group) samples per domain
    buffer_size: int = Field(default=4096, ge=1)  # completions held un-applied; beyond it the consumer waits
    fill_wait_s: float = Field(default=2.0, ge=0)  # wait this long for a short domain before filling from others
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when present
    weight_transport: Literal["auto", "object-store", "disk", "distributed"] = "auto"  # how generators get weights;
    #   auto: disk on the local runtime (every replica shares the run dir: no bus round trip), the bus's object store
    #   on ray (nodes need not share a filesystem) — see `transport_name`
    domains: tuple[str, ...] | None = None  # learn only from these domains; null: every domain (and production)
    metrics_flush_s: float = Field(default=5.0, gt=0)  # metrics rows are written to a parquet part this often
    plot_every_s: float = Field(default=30.0, gt=0)  # held-out accuracy PNG refresh period (and at stop)
    warm_start_log_every: int = Field(default=20, ge=1)  # log the supervised loss every N warm-start steps

    @field_validator("eval_temperature")
    @classmethod
    def _check_temperatures(cls, value: float | tuple[float, ...]) -> float | tuple[float, ...]:
        temperatures = value if isinstance(value, tuple) else (value,)
        if not temperatures or any(t < 0 for t in temperatures) or len(set(temperatures)) != len(temperatures):
            raise ValueError(f"expected a temperature >= 0 or a list of distinct ones, got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> LearnerConfig:
        if self.buffer_size < self.batch_size:
            raise ValueError(f"expected buffer_size >= batch_size ({self.batch_size}), got {self.buffer_size}")
        sampled = any(t > 0 for t in self.eval_temperatures)
        if self.eval_samples > 1 and not sampled:
            raise ValueError(
                "eval_samples > 1 needs eval_temperature > 0 (greedy completions of a prompt are all "
                f"the same), got eval_samples {self.eval_samples} with eval_temperature 0"
            )
        if (self.eval_baseline_samples or 1) > 1 and not sampled:
            raise ValueError(
                "eval_baseline_samples > 1 needs eval_temperature > 0 (greedy completions of a prompt "
                f"are all the same), got {self.eval_baseline_samples} with eval_temperature 0"
            )
        if self.minibatches > self.batch_size:
            raise ValueError(f"expected minibatches <= batch_size ({self.batch_size}), got {self.minibatches}")
        return self

    @property
    def effective_max_staleness(self) -> int:
        return 0 if self.mode == "sync" else self.max_staleness

    @property
    def eval_temperatures(self) -> tuple[float, ...]:
        """``eval_temperature`` as a tuple: the decodings of each held-out round, the headline first."""
        value = self.eval_temperature
        return value if isinstance(value, tuple) else (value,)

    def eval_samples_at(self, temperature: float, *, baseline: bool = False) -> int:
        """Completions per held-out prompt decoded at ``temperature``: 1 greedy; sampled, ``eval_samples`` (the
        post-warm-start round: ``eval_baseline_samples``, null meaning ``eval_samples``, at least 4)."""
        if temperature <= 0:
            return 1
        if baseline:
            return self.eval_baseline_samples or max(4, self.eval_samples)
        return self.eval_samples

    @property
    def baseline_samples(self) -> int:
        """Completions per prompt of the post-warm-start round at the first decoding (``eval_baseline_samples``
        resolved)."""
        return self.eval_samples_at(self.eval_temperatures[0], baseline=True)

    def transport_name(self, runtime_kind: str) -> str:
        """The weight transport this learner publishes through: ``weight_transport``, with ``auto`` resolved by where
        the replicas run (``disk`` when they share the run dir, i.e. the local runtime; else ``object-store``)."""
        if self.weight_transport != "auto":
            return self.weight_transport
        return "disk" if runtime_kind == "local" else "object-store"


def _channels(config: LearnerConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    # held-out prompts are published by the learner itself (it knows when a version is worth evaluating)
    return ("scored",), (("prompts",) if config.eval_every_steps > 0 else ())


register_actor_kind(
    ActorKind(
        name="learner",
        config=LearnerConfig,
        factory="actors.learner._actor:LearnerActor",
        consumes=("scored",),
        publishes=("prompts",),
        summary="off-policy policy-gradient learner; publishes new weight versions and held-out eval prompts",
        references={"domains": "domains"},
        channels=_channels,
    )
)

__all__ = ["LearnerConfig"]
