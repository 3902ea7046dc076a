import actors.policy


def test_public_names() -> None:
    assert set(actors.policy.__all__) == {
        "encode_completion",
        "encode_prompt",
        "strip_eos",
        "HF_CHARS",
        "PRESETS",
        "SPECIAL_TOKENS",
        "CharTokenizer",
        "GPTConfig",
        "HFTokenizer",
        "KVCache",
        "Policy",
        "StateDictError",
        "TinyGPT",
        "positions_from_mask",
        "read_safetensors",
        "write_tiny_hf_model",
    }
    for name in actors.policy.__all__:
        assert hasattr(actors.policy, name)
