"""Each package of the application exports exactly its public surface, and every exported name resolves."""

from __future__ import annotations

import importlib

import pytest

SURFACES: dict[str, set[str]] = {
    "actors.protocol": {
        "BUILTIN_MODELS", "cancel_subject", "CHANNEL_MODELS", "CompletionRecord", "CORRECT", "CURRENT", "domains_of",
        "channel_dir", "count_removed_domain", "DomainSpec", "failed_groups_of", "FEEDBACK_LABELS", "FeedbackMsg",
        "frame", "join_bucket", "LearnerPace", "LearnerStatus", "LearningRate", "ping_subject", "one_copy_per_seq",
        "partition_end", "partitions", "only_torch_engines", "policy_of", "PolicySpec", "PromptMsg", "read_recordings",
        "RECORDED_CHANNELS",
        "REVIEW_SOURCE", "RolloutMsg", "VERIFIER_ERROR",
        "rows_of",
        "schema", "ScoredCompletion", "ScoredMsg", "SERVE_PROTOCOL_VERSION", "SERVE_QUEUE", "serve_subject",
        "served_key", "SERVING", "TASK_OUTCOMES", "TaskOutcomes", "task_outcomes_wanted", "TrafficMsg", "WarmStartSpec",
        "weights_bucket",
        "HasDevice", "HasEngine",
        "ServesUsers", "SyncsWeights", "cuda_missing_here", "runs_on_cpu", "serving_replicas", "weight_receivers",
        "feedback_join", "JoinsFeedback", "rated_bucket", "FirstRatings", "rating_digest",
    },
    "actors.engines": {
        "Broadcaster", "Completion", "DistributedWeights", "Engine", "EngineClosedError", "EngineHTTPError",
        "FinishReason", "GenerationRequest", "RequestError", "parse_dtype", "receive_weights", "SamplingParams",
        "SGLangEngine", "StepHook", "Tokenizer", "TorchEngine", "VLLMEngine", "WeightBroadcaster", "WeightGroup",
        "WeightSource", "WeightUpdateError", "UnsupportedServerError",
    },
    "actors.domains": {
        "ArithmeticOptions", "build_verifier", "BUILTIN_SOURCES", "BuiltinSource", "Domain", "domains_from_spec",
        "DomainSampler", "DomainSource", "DomainVerifier", "ExtractOptions", "find_task", "heldout_bucket",
        "JsonlSource", "open_source", "PyExprOptions", "read_jsonl_tasks", "score", "Scorer", "SourceError", "Task",
        "task_id", "Verifier", "verifier_names", "VerifierError", "VerifyResult",
    },
    "actors.sandbox": {
        "Isolation", "IsolationRefused", "PoolStatistics", "SandboxLimits", "SandboxPool", "SandboxResult",
        "Verdict",
    },
    "actors.policy": {
        "all_finite", "CharTokenizer", "check_policy", "encode_completion", "encode_prompt", "GPTConfig",
        "HF_CHARS", "HFTokenizer", "KVCache", "load_tokenizer", "model_directory", "native_bfloat16", "Policy",
        "positions_from_mask",
        "PRESETS", "read_safetensors", "SPECIAL_TOKENS", "StateDictError", "strip_eos", "TinyGPT",
        "write_tiny_hf_model",
    },
    "actors.weights": {
        "advertise_address", "check_state_dict", "CollectiveTransport", "describe", "DistributedTransport",
        "ObjectStoreTransport", "SafetensorsDirTransport", "SharedMemoryTransport", "SharedTensors", "shm_root",
        "SlotSpaceError",
        "TensorInfo", "weight_transports",
        "WeightManifest", "WeightPayloadError", "WeightPayloadGone", "WeightPublisher", "WeightSubscriber",
        "WeightTransport",
    },
    "actors.replay": {
        "build_report", "decide", "Decision", "DecisionLog", "decisions_path", "hold", "items_from_scored",
        "items_from_traffic",
        "load_items", "mean_reward", "Outcome", "pause_gate", "promote", "read_decisions", "RecordingsTail", "record",
        "release", "Replayer", "ReplayItem", "ReplayRun", "request_seed", "resolve_weights", "resume_gate",
        "ResolvedWeights", "rollback", "serving_manifest", "WeightsNotFound", "write_report",
    },
    "actors.testing": {
        "actor_context", "AppServer", "FakeSGLangServer", "FakeVLLMServer", "free_port", "running_actor",
    },
    "actors.recorder": {
        "ChannelWriter", "parse_range", "partition_of",
    },
    "actors.joiner": {
        "joined_sample", "JoinState", "kv_key", "selected_for_review",
    },
    "actors.learner": {
        "AdvantageEstimator", "AppliedLedger", "auto_lr", "Checkpointer", "decoupled_ppo_loss", "DomainBatcher",
        "effective_applied", "eval_message_id", "EvalResult", "EvalTracker", "export_safetensors",
        "importance_weights", "is_stale",
        "k3_kl", "LearnerConfig", "LossStats", "MetricsWriter", "plot_heldout", "PPOConfig", "read_metrics",
        "reference_pairs", "RunningStats", "sampling_sd", "staleness", "StepStats", "Trainer", "TrainSample",
        "warm_start", "warm_start_lr", "WarmStartResult",
    },
    "actors.gateway": {
        "ApiError", "ApiKeys", "CallCancelled", "Gateway", "GatewayActor", "GatewayConfig", "GenerationError",
        "GeneratorsBusy", "NoGenerators", "generated_api_key", "read_api_keys", "ServeCall", "ServeClient",
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
