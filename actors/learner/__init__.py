"""The `learner` actor kind: off-policy RL from `scored`, warm start, checkpoints, metrics, export.

Importing this package imports torch; the light config module is `actors.learner._config`.
"""

from actors.learner._advantages import AdvantageEstimator, RunningStats, is_stale, staleness
from actors.learner._batcher import DomainBatcher
from actors.learner._checkpoint import Checkpointer
from actors.learner._config import LearnerConfig
from actors.learner._eval import EvalResult, EvalTracker, eval_message_id
from actors.learner._export import export_safetensors
from actors.learner._ledger import AppliedLedger
from actors.learner._loss import LossStats, PPOConfig, decoupled_ppo_loss, importance_weights, k3_kl
from actors.learner._metrics import MetricsWriter, plot_heldout, read_metrics
from actors.learner._trainer import StepStats, Trainer, TrainSample
from actors.learner._warmstart import WarmStartResult, reference_pairs, warm_start

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
    "decoupled_ppo_loss",
    "eval_message_id",
    "export_safetensors",
    "importance_weights",
    "is_stale",
    "k3_kl",
    "plot_heldout",
    "read_metrics",
    "reference_pairs",
    "staleness",
    "warm_start",
]
