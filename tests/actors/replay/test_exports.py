"""The recorder, joiner and replay packages export exactly their public surface."""

import actors.gate
import actors.joiner
import actors.recorder
import actors.replay


def test_public_names() -> None:
    assert set(actors.recorder.__all__) == {"ChannelWriter", "parse_range", "partition_of", "read_recordings", "schema"}
    assert set(actors.joiner.__all__) == {
        "REVIEW_SOURCE",
        "JoinState",
        "joined_sample",
        "kv_key",
        "selected_for_review",
    }
    assert set(actors.replay.__all__) == {
        "Decision",
        "Outcome",
        "ReplayItem",
        "ReplayRun",
        "Replayer",
        "ResolvedWeights",
        "WeightsNotFound",
        "build_report",
        "decide",
        "decisions_path",
        "load_items",
        "mean_reward",
        "promote",
        "read_decisions",
        "record",
        "request_seed",
        "resolve_weights",
        "rollback",
        "serving_manifest",
        "write_report",
    }
    assert actors.gate.__all__ == []
    for module in (actors.recorder, actors.joiner, actors.replay):
        for name in module.__all__:
            assert getattr(module, name) is not None


def test_schema_is_documented_per_channel() -> None:
    schema = actors.recorder.schema()
    assert set(schema) == {"traffic", "feedback", "scored"}
    for columns in schema.values():
        assert list(columns)[:4] == ["_seq", "_id", "_ts", "_source"]
