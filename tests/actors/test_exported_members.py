"""Each package of the application exports exactly its public surface, and every exported name resolves."""

from __future__ import annotations

import importlib

import pytest

SURFACES: dict[str, set[str]] = {
    "actors.protocol": {
        "CHANNEL_MODELS", "CompletionRecord", "FEEDBACK_LABELS", "FeedbackMsg", "PromptMsg", "RolloutMsg",
        "SERVE_PROTOCOL_VERSION", "SERVE_QUEUE", "SOLVED_SUBJECT", "ScoredCompletion", "ScoredMsg", "TrafficMsg",
        "frame", "ping_subject", "read_recordings", "rows_of", "schema", "serve_subject",
    },
    "actors.engines": {
        "Broadcaster", "Completion", "DistributedWeights", "Engine", "EngineClosedError", "EngineHTTPError",
        "FinishReason", "GenerationRequest", "SGLangEngine", "SamplingParams", "StepHook", "Tokenizer", "TorchEngine",
        "VLLMEngine", "WeightBroadcaster", "WeightGroup", "WeightSource", "WeightUpdateError", "parse_dtype",
        "receive_weights",
    },
    "actors.domains": {
        "ArithmeticOptions", "BUILTIN_SOURCES", "BuiltinSource", "Domain", "DomainSampler", "DomainSource",
        "DomainVerifier", "ExtractOptions", "JsonlSource", "PyExprOptions", "Scorer", "SourceError", "Task", "Verifier",
        "VerifierError", "VerifyResult", "build_verifier", "domains_from_spec", "heldout_bucket", "open_source",
        "read_jsonl_tasks", "score", "task_id", "verifier_names",
    },
    "actors.sandbox": {
        "Isolation", "IsolationRefused", "PoolStatistics", "SandboxLimits", "SandboxPool", "SandboxResult", "Verdict",
    },
    "actors.testing": {"AppServer", "FakeSGLangServer", "FakeVLLMServer", "free_port"},
    "actors.recorder": {"ChannelWriter", "parse_range", "partition_of"},
    "actors.replay": {
        "Decision", "Outcome", "ReplayItem", "ReplayRun", "Replayer", "ResolvedWeights", "WeightsNotFound",
        "build_report", "decide", "decisions_path", "load_items", "mean_reward", "promote", "read_decisions", "record",
        "request_seed", "resolve_weights", "rollback", "serving_manifest", "write_report",
    },
    "actors.source": set(),
    "actors.generator": set(),
    "actors.verify": set(),
    "actors.gate": set(),
    "actors.commands": set(),
}  # fmt: skip


@pytest.mark.parametrize("package", sorted(SURFACES))
def test_exports_are_exactly_the_public_surface(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == SURFACES[package]
    for name in module.__all__:
        assert getattr(module, name) is not None, name


def test_recorded_schema_is_documented_per_channel() -> None:
    from actors.protocol import schema

    columns_by_channel = schema()
    assert set(columns_by_channel) == {"traffic", "feedback", "scored"}
    for columns in columns_by_channel.values():
        assert list(columns)[:4] == ["_seq", "_id", "_ts", "_source"]
