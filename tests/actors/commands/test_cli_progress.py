"""The learning view of `flywheel up` summarizes heartbeat counters by domain, with a baseline."""

from __future__ import annotations

from actors.commands._live import LearningView
from topology.runtime import ReplicaStatus


def _status(actor: str, kind: str, **counters: float) -> ReplicaStatus:
    return ReplicaStatus(
        actor=actor,
        replica=0,
        kind=kind,
        state="running",
        pid=1,
        restarts=0,
        started_at=0.0,
        ts=0.0,
        counters=dict(counters),
    )


def test_summary_reads_learner_and_generator_counters() -> None:
    view = LearningView()
    records = [
        _status(
            "learner",
            "learner",
            version=3,
            step=6,
            samples_applied=384,
            phase=1,
            staleness_mean=0.5,
            **{"reward.math": 0.4, "heldout_acc.math": 0.3, "dropped_stale.math": 2},
        ),
        _status("gen", "generator", tokens_per_s=100.0, version=2),
        _status("gen", "generator", tokens_per_s=50.0, version=3),
    ]
    summary = view.summarize(records)
    assert summary is not None
    assert summary["phase"] == "rl" and summary["tokens_per_s"] == 150.0
    assert summary["generator_versions"] == (2.0, 3.0)
    assert summary["domains"] == [{"domain": "math", "reward": 0.4, "heldout_acc": 0.3, "baseline": 0.3, "dropped": 2}]
    # later accuracy is shown against the first one seen (the post-warm-start evaluation)
    records[0].counters["heldout_acc.math"] = 0.55
    line = view.line(records)
    assert line is not None and "acc 55% (+25 pts)" in line and "v3" in line


def test_no_learning_actors_means_no_view() -> None:
    assert LearningView().summarize([_status("src", "source", published=3)]) is None


def test_the_sandbox_isolation_in_force_is_shown() -> None:
    records = [
        _status("learner", "learner", version=1, samples_applied=8),
        _status("verify", "verify", sandbox_queue=0.0),
    ]
    records[1].counters["isolation"] = "rlimits"
    line = LearningView().line(records)
    assert line is not None and "sandbox rlimits" in line
