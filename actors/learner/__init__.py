"""The `learner` actor kind: off-policy RL from `scored`, warm start, checkpoints, metrics, export.

Importing this package imports torch; the light config module is `actors.learner._config`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topology import lazy_exports

if TYPE_CHECKING:
    from actors.learner._advantages import AdvantageEstimator as AdvantageEstimator
    from actors.learner._advantages import RunningStats as RunningStats
    from actors.learner._advantages import is_stale as is_stale
    from actors.learner._advantages import staleness as staleness
    from actors.learner._batcher import DomainBatcher as DomainBatcher
    from actors.learner._checkpoint import Checkpointer as Checkpointer
    from actors.learner._config import LearnerConfig as LearnerConfig
    from actors.learner._config import auto_lr as auto_lr
    from actors.learner._config import warm_start_lr as warm_start_lr
    from actors.learner._eval import EvalResult as EvalResult
    from actors.learner._eval import EvalTracker as EvalTracker
    from actors.learner._eval import eval_message_id as eval_message_id
    from actors.learner._export import export_safetensors as export_safetensors
    from actors.learner._ledger import AppliedLedger as AppliedLedger
    from actors.learner._loss import LossStats as LossStats
    from actors.learner._loss import PPOConfig as PPOConfig
    from actors.learner._loss import decoupled_ppo_loss as decoupled_ppo_loss
    from actors.learner._loss import importance_weights as importance_weights
    from actors.learner._loss import k3_kl as k3_kl
    from actors.learner._metrics import MetricsWriter as MetricsWriter
    from actors.learner._metrics import effective_applied as effective_applied
    from actors.learner._metrics import plot_heldout as plot_heldout
    from actors.learner._metrics import read_metrics as read_metrics
    from actors.learner._metrics import sampling_sd as sampling_sd
    from actors.learner._trainer import StepStats as StepStats
    from actors.learner._trainer import Trainer as Trainer
    from actors.learner._trainer import TrainSample as TrainSample
    from actors.learner._warmstart import WarmStartResult as WarmStartResult
    from actors.learner._warmstart import reference_pairs as reference_pairs
    from actors.learner._warmstart import warm_start as warm_start

_EXPORTS = {
    "AdvantageEstimator": "_advantages",
    "AppliedLedger": "_ledger",
    "Checkpointer": "_checkpoint",
    "DomainBatcher": "_batcher",
    "EvalResult": "_eval",
    "EvalTracker": "_eval",
    "LearnerConfig": "_config",
    "LossStats": "_loss",
    "MetricsWriter": "_metrics",
    "PPOConfig": "_loss",
    "RunningStats": "_advantages",
    "StepStats": "_trainer",
    "TrainSample": "_trainer",
    "Trainer": "_trainer",
    "WarmStartResult": "_warmstart",
    "auto_lr": "_config",
    "warm_start_lr": "_config",
    "decoupled_ppo_loss": "_loss",
    "effective_applied": "_metrics",
    "eval_message_id": "_eval",
    "export_safetensors": "_export",
    "importance_weights": "_loss",
    "is_stale": "_advantages",
    "k3_kl": "_loss",
    "plot_heldout": "_metrics",
    "read_metrics": "_metrics",
    "sampling_sd": "_metrics",
    "reference_pairs": "_warmstart",
    "staleness": "_advantages",
    "warm_start": "_warmstart",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = [
    "AdvantageEstimator",
    "AppliedLedger",
    "Checkpointer",
    "DomainBatcher",
    "EvalResult",
    "EvalTracker",
    "LearnerConfig",
    "LossStats",
    "MetricsWriter",
    "PPOConfig",
    "RunningStats",
    "StepStats",
    "TrainSample",
    "Trainer",
    "WarmStartResult",
    "auto_lr",
    "decoupled_ppo_loss",
    "effective_applied",
    "eval_message_id",
    "export_safetensors",
    "importance_weights",
    "is_stale",
    "k3_kl",
    "plot_heldout",
    "read_metrics",
    "reference_pairs",
    "sampling_sd",
    "staleness",
    "warm_start",
    "warm_start_lr",
]
