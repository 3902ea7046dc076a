import actors.generator


def test_public_names() -> None:
    assert set(actors.generator.__all__) == {
        "Broadcaster",
        "Completion",
        "DistributedWeights",
        "EngineHTTPError",
        "GeneratorActor",
        "SGLangEngine",
        "VLLMEngine",
        "WeightBroadcaster",
        "Engine",
        "EngineClosedError",
        "FinishReason",
        "GenerationRequest",
        "SamplingParams",
        "StepHook",
        "Tokenizer",
        "TorchEngine",
        "WeightSource",
        "WeightUpdateError",
    }
    for name in actors.generator.__all__:
        assert getattr(actors.generator, name) is not None
