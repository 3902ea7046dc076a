"""bench/domain_pace.py: per-domain rates and time in verify from a run's messages, and the variants' specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.protocol import domains_of
from bench.domain_pace import VARIANTS, code_tasks, pace, variant_spec
from topology import load_spec


def _scored(rollout_id: str, domain: str, ts: float, completions: int, verify_s: float) -> dict[str, object]:
    payload = {"domain": domain, "verify_s": verify_s, "completions": [{}] * completions}
    return {"id": f"{rollout_id}.s", "ts": ts, "payload": payload}


def test_pace_counts_each_domain_over_the_window_and_pairs_scores_with_their_rollouts() -> None:
    rollouts = [{"id": "a1", "ts": 100.0}, {"id": "a2", "ts": 149.0}, {"id": "c1", "ts": 90.0}]
    scored = [
        _scored("a1", "arithmetic", 100.5, 8, 0.001),  # before the window: not counted
        _scored("a2", "arithmetic", 149.5, 8, 0.001),
        _scored("c1", "code", 160.0, 8, 40.0),
    ]
    applied = [
        {"ts": 150.0, "domain": "arithmetic", "completions": 8},
        {"ts": 161.0, "domain": "code", "completions": 8},
        {"ts": 100.0, "domain": "code", "completions": 8},  # before the window
    ]
    figures = pace(rollouts, scored, applied, window_s=20.0)
    assert figures["arithmetic"]["groups"] == 1 and figures["arithmetic"]["scored_per_s"] == pytest.approx(8 / 20)
    assert figures["arithmetic"]["in_verify_s_p50"] == pytest.approx(0.5)
    assert figures["code"]["in_verify_s_p50"] == pytest.approx(70.0) and figures["code"]["verify_s_p50"] == 40.0
    assert figures["code"]["learner_took_per_s"] == pytest.approx(8 / 20)
    assert pace(rollouts, [], applied, window_s=20.0) == {}


def test_every_variant_is_a_valid_spec(tmp_path: Path) -> None:
    import json

    import yaml

    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in code_tasks(10)))
    for variant in VARIANTS:
        path = tmp_path / f"{variant}.yaml"
        path.write_text(yaml.safe_dump(variant_spec(variant, data), sort_keys=False))
        expected = {"fast": {"arithmetic"}, "slow": {"code"}}.get(variant, {"arithmetic", "code"})
        assert set(domains_of(load_spec(path))) == expected
