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
    assert summary["domains"] == [
        {"domain": "math", "reward": 0.4, "heldout_acc": 0.3, "baseline": 0.3, "dropped": 2, "verifier_errors": 0.0}
    ]
    # later accuracy is shown against the first one seen (the post-warm-start evaluation)
    records[0].counters["heldout_acc.math"] = 0.55
    line = view.line(records)
    assert line is not None and "acc 55% (+25 pts)" in line and "v3" in line


def test_the_climb_is_measured_from_the_runs_first_round_not_the_first_look() -> None:
    """`flywheel status` looks once, and `up --resume` starts a new view: both showed '+0 pts' for a domain that had
    climbed from 30 % to 42 %. The learner's ``heldout_acc_start`` is the baseline."""
    counters = {"heldout_acc.math": 0.42, "heldout_acc_start.math": 0.3}
    line = LearningView().line([_status("learner", "learner", version=9, **counters)])
    assert line is not None and "acc 42% (+12 pts)" in line


def test_the_warm_start_shows_its_own_step_and_loss() -> None:
    """The warm start showed 'warmstart · v0 · step 0' for its whole length (its RL step is 0 all along), which reads
    as a stuck learner: its own step, of how many, and its loss are shown instead."""
    counters = {"warmstart_step": 37, "warmstart_steps": 200, "warmstart_loss": 1.25}
    line = LearningView().line([_status("learner", "learner", phase="warmstart", version=0, step=0, **counters)])
    assert line is not None and "warmstart · v0 · step 37/200 · loss 1.250" in line


def test_the_baseline_round_rl_waits_for_is_shown_at_step_0() -> None:
    """After the warm start the view showed 'rl · v1 · step 0 · 0 samples' while the learner waited for its held-out
    baseline round: it says so, and how many prompts are still out. Later rounds run beside training: not shown."""
    view = LearningView()
    line = view.line([_status("learner", "learner", phase="rl", version=1, step=0, samples_applied=0, eval_out=412)])
    assert line is not None and "step 0 · held-out baseline round: 412 prompts to score" in line
    line = view.line([_status("learner", "learner", phase="rl", version=9, step=20, samples_applied=9, eval_out=400)])
    assert line is not None and "held-out baseline" not in line


def test_the_headline_wraps_at_the_terminal_not_at_the_tables_width() -> None:
    """In `flywheel up`'s live view and `flywheel status` the headline was the domain table's title, wrapped at the
    table's width (about 64 columns) into two or three ragged lines on a 120-column terminal."""
    from rich.console import Console

    counters = {"reward.arithmetic": 0.4, "heldout_acc.arithmetic": 0.3, "staleness_mean": 1.5}
    records = [
        _status("learner", "learner", phase="rl", version=62, step=136, samples_applied=8705, **counters),
        _status("gen", "generator", tokens_per_s=3224.0, version=60),
    ]
    view = LearningView()
    headline = view.headline(view.summarize(records) or {})
    assert 64 < len(headline) < 120
    console = Console(width=120, record=True)
    console.print(view.renderable(records))
    assert headline in console.export_text().splitlines()


def test_no_learning_actors_means_no_view() -> None:
    assert LearningView().summarize([_status("src", "source", published=3)]) is None


def test_the_service_line_shows_serving_against_training_rates_feedback_and_the_gate(
    monkeypatch: object,
) -> None:
    import time

    from rich.console import Console

    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])  # type: ignore[attr-defined]
    view = LearningView()

    def records(requests: float) -> list[ReplicaStatus]:
        gate = _status("gate", "gate", serving_version=7)
        gate.counters["last_decision"] = "promote v7: mean reward 0.5 >= serving 0.4 - 0.02"
        return [
            _status("learner", "learner", version=12, samples_applied=10),
            _status("serving", "generator", version=7, serve_requests=40, tokens_per_s=10.0),
            _status("gateway", "gateway", requests=2 * requests, served=requests, feedback=30),  # requests: all HTTP
            _status("joiner", "joiner", feedback_waiting=4, feedback_score=0.625, **{"feedback.joined": 25}),
            gate,
        ]

    view.summarize(records(100))
    clock[0] += 2.0
    line = view.line(records(150))
    assert line is not None
    assert "service: serving v7 · training v12 · 25.0 req/s · feedback 25 joined, 4 waiting" in line
    assert "users' score 0.62" in line and "gate: promote v7: mean reward 0.5" in line
    assert "paused" not in line and "unmatched" not in line
    unmatched = records(150)
    unmatched[3].counters["feedback.unmatched"] = 2.0  # rated ids that were never served, once the window closed
    assert "feedback 25 joined, 4 waiting, 2 unmatched · users' score" in str(view.line(unmatched))
    console = Console(width=200, record=True)
    console.print(view.renderable(records(150)))
    assert "serving v7 · training v12" in console.export_text()
    paused = records(150)
    paused[-1].counters["paused"] = 1.0
    assert "gate paused (flywheel gate resume) · gate: promote v7" in str(view.line(paused))


def test_a_generator_kept_on_the_promoted_version_is_not_counted_as_a_training_generator_behind() -> None:
    """A service's serving generator (`follow: serving`) stays on the version the gate promoted, by design: the view
    showed "generators v1–v144" beside a learner at v148 as if a training generator were 140 versions behind."""
    records = [
        _status("learner", "learner", version=148, samples_applied=10),
        _status("gen", "generator", version=146, tokens_per_s=10.0),
        _status("serving", "generator", version=1, tokens_per_s=0.0),
        _status("gateway", "gateway", served=3),
    ]
    records[1].counters["follow"] = "current"
    records[2].counters["follow"] = "serving"
    summary = LearningView().summarize(records)
    assert summary is not None and summary["generator_versions"] == (146.0, 146.0)
    line = LearningView().line(records)
    assert line is not None and "generators v146 " in line and "serving v1 · training v148" in line
    assert "3 requests since the gateway started" in line  # one look: the gateway's count, not the run's


def test_the_sandbox_isolation_in_force_is_shown() -> None:
    records = [
        _status("learner", "learner", version=1, samples_applied=8),
        _status("verify", "verify", sandbox_queue=0.0),
    ]
    records[1].counters["isolation"] = "rlimits"
    line = LearningView().line(records)
    assert line is not None and "sandbox rlimits" in line


def test_answers_a_verifier_failed_on_are_shown_by_domain_with_where_to_read_why() -> None:
    """A user's verifier that raised on every answer looked like a domain stuck at reward 0 (only `flywheel status`
    carried a `verdict.internal_error` among its counters, not by domain): the view says so, per domain."""
    records = [
        _status("learner", "learner", version=1, samples_applied=8, **{"reward.mine": 0.0, "reward.math": 0.5}),
        _status("verify", "verify", **{"verifier_errors.mine": 900.0}),
        _status("verify", "verify", **{"verifier_errors.mine": 376.0}),
    ]
    view = LearningView()
    line = view.line(records)
    assert line is not None and "mine: acc — (—) reward 0.00 verifier errors 1,276" in line, line
    assert "math: acc — (—) reward 0.50 |" in line  # a domain without errors reads as before
    assert "logs/verify-*.log" in line
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(view.renderable(records))
    table = console.export_text()
    assert "verifier errors" in table and "1,276" in table and "logs/verify-*.log" in table
    clean = [_status("learner", "learner", version=1, samples_applied=8, **{"reward.math": 0.5})]
    assert "verifier errors" not in (view.line(clean) or "")


def test_a_generator_that_cannot_load_the_newest_version_says_why_and_where_to_read_more() -> None:
    """An SGLang server serving another model refused every version: the view showed `generators v0` and nothing
    else, the reason sat in the generator's log. It now names the replica, the version, the reason and the log."""
    reason = "v1: sglang server http://127.0.0.1:30000: POST /update_weights_from_disk failed (HTTP 400): mismatch"
    records = [
        _status("learner", "learner", version=1, step=0),
        _status("generator", "generator", version=0, tokens_per_s=0.0, weights_error=reason),  # type: ignore[arg-type]
    ]
    view = LearningView()
    line = view.line(records)
    assert line is not None and f"generator-0 cannot load {reason}" in line, line
    assert "logs/generator-0.log" in line
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(view.renderable(records))
    assert f"generator-0 cannot load {reason}" in console.export_text()
    healthy = [_status("learner", "learner", version=1), _status("generator", "generator", version=1)]
    assert "cannot load" not in (view.line(healthy) or "")


def test_a_gated_service_before_its_first_promotion_says_nothing_is_promoted() -> None:
    """The serving generator sits at v0 until the gate promotes a version, and the API answers 503 meanwhile: the
    view said "serving v0"."""
    records = [
        _status("learner", "learner", version=3, samples_applied=10),
        _status("serving", "generator", version=0, tokens_per_s=0.0),
        _status("gateway", "gateway", served=0),
    ]
    records[1].counters["follow"] = "serving"
    line = LearningView().line(records)
    assert line is not None and "serving v0" not in line, line
    assert "nothing promoted yet (the API answers 503 until the gate promotes a version) · training v3" in line
    records.append(_status("gate", "gate", serving_version=2))  # the gate's word, once it has one
    assert "serving v2 · training v3" in str(LearningView().line(records))
