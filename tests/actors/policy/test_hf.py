import threading
from pathlib import Path

import pytest
import torch

from actors.policy import HFTokenizer, Policy, write_tiny_hf_model


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def hf_policy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Policy:
    directory = write_tiny_hf_model(tmp_path_factory.mktemp("hf") / request.param, arch=request.param)
    return Policy.from_spec({"model": f"hf:{directory}"})


def test_loads_a_local_directory(hf_policy: Policy) -> None:
    assert hf_policy.kind == "hf"
    assert isinstance(hf_policy.tokenizer, HFTokenizer)
    assert hf_policy.tokenizer.decode(hf_policy.tokenizer.encode("1 + 2 = 3")) == "1 + 2 = 3"
    assert hf_policy.max_context == 256
    names = list(hf_policy.state_dict())
    assert not any(n.startswith("hf.") for n in names)  # the model's own names, as in its safetensors


def test_cache_matches_full_forward(hf_policy: Policy) -> None:
    ids = torch.tensor([hf_policy.tokenizer.encode("hello world")])
    full, _ = hf_policy.forward(ids)
    first, cache = hf_policy.forward(ids[:, :6], use_cache=True)
    rest, _ = hf_policy.forward(ids[:, 6:], torch.ones(1, ids.shape[1]), cache=cache, use_cache=True)
    torch.testing.assert_close(torch.cat((first, rest), dim=1), full, atol=1e-5, rtol=1e-5)


def test_left_padded_logprobs_equal_single_rows(hf_policy: Policy) -> None:
    short = torch.tensor([hf_policy.tokenizer.encode("1+1=2")])
    pad = 6
    padded = torch.cat((torch.zeros(1, pad, dtype=torch.long), short), dim=1)
    mask = torch.cat((torch.zeros(1, pad), torch.ones(1, short.shape[1])), dim=1)
    torch.testing.assert_close(
        hf_policy.token_logprobs(padded, mask)[:, pad:], hf_policy.token_logprobs(short), atol=1e-5, rtol=1e-5
    )


def test_directory_without_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json"):
        Policy.from_spec({"model": f"hf:{tmp_path}"})


def test_hf_config_keys_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown key 'n_layer' for hf models"):
        Policy.from_spec({"model": f"hf:{tmp_path}", "config": {"n_layer": 2}})


def hub_cache_with(root: Path, repo: str) -> Path:
    """A Hugging Face hub cache laid out as ``huggingface-cli download`` leaves it, holding a tiny model as ``repo``."""
    org, name = repo.split("/")
    entry = root / f"models--{org}--{name}"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text("0123abcd")
    write_tiny_hf_model(entry / "snapshots" / "0123abcd", arch="gpt2")
    return root


def test_a_hub_id_loads_from_the_local_cache_and_one_not_there_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache_with(tmp_path / "hub", "tiny/adder")))
    monkeypatch.chdir(tmp_path)  # no directory named tiny/adder here
    policy = Policy.from_spec({"model": "hf:tiny/adder"})
    assert policy.kind == "hf" and policy.num_parameters() > 0
    with pytest.raises(
        ValueError,
        match=r"'tiny/other' is no directory here and not in the Hugging Face cache.*"
        r"huggingface-cli download tiny/other",
    ):
        Policy.from_spec({"model": "hf:tiny/other"})


def test_the_gateway_finds_a_hub_ids_tokenizer_in_the_cache_and_an_orgless_id_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway (and an HTTP engine's generator) loads only the tokenizer, through `load_tokenizer`: a hub id must
    resolve there as for the learner (it looked under the spec's folder only). An org-less id (``gpt2``) is a hub id
    too."""
    import huggingface_hub.constants

    from actors.policy import load_tokenizer

    cache = hub_cache_with(tmp_path / "hub", "tiny/adder")
    write_tiny_hf_model(cache / "models--adder" / "snapshots" / "0123abcd", arch="gpt2")
    (cache / "models--adder" / "refs").mkdir()
    (cache / "models--adder" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)

    class Spec:
        def __init__(self, model: str) -> None:
            self.model = model
            self.tokenizer = None

    tokenizer = load_tokenizer(Spec("hf:tiny/adder"), tmp_path / "specs")
    assert isinstance(tokenizer, HFTokenizer) and tokenizer.decode(tokenizer.encode("1+2=3")) == "1+2=3"
    assert Policy.from_spec({"model": "hf:adder"}).kind == "hf"


def test_policy_tokenizer_replaces_the_models_own_everywhere_it_is_loaded(tmp_path: Path) -> None:
    """``policy.tokenizer`` is the tokenizer the learner, the generators and the gateway use (it was accepted and never
    read). The model's own tokenizer has ``<bos>`` (id 2, every id after it one higher); the other one has none."""
    from actors.policy import load_tokenizer

    model = write_tiny_hf_model(tmp_path / "model", bos=True)
    other = write_tiny_hf_model(tmp_path / "other", bos=False)
    own = Policy.from_spec({"model": f"hf:{model}"}).tokenizer
    spec = {"model": f"hf:{model}", "tokenizer": str(other)}
    for tokenizer in (Policy.from_spec(spec).tokenizer, load_tokenizer(spec)):
        assert tokenizer.bos_id is None and own.bos_id == 2
        assert tokenizer.encode("1+1") == [i - 1 for i in own.encode("1+1")]
    relative = load_tokenizer({"model": f"hf:{model}", "tokenizer": "other"}, base_dir=tmp_path)
    assert relative.bos_id is None


def test_a_tokenizer_larger_than_the_models_embeddings_or_one_for_a_builtin_model_is_a_clear_error(
    tmp_path: Path,
) -> None:
    from actors.policy import load_tokenizer

    model = write_tiny_hf_model(tmp_path / "model", bos=False)
    larger = write_tiny_hf_model(tmp_path / "larger", bos=True)
    with pytest.raises(ValueError, match=r"^policy\.tokenizer: the tokenizer has \d+ tokens, more than the model's"):
        Policy.from_spec({"model": f"hf:{model}", "tokenizer": str(larger)})
    with pytest.raises(ValueError, match=r"^policy\.tokenizer: hf model directory .*nowhere' does not exist"):
        Policy.from_spec({"model": f"hf:{model}", "tokenizer": str(tmp_path / "nowhere")})
    for load in (Policy.from_spec, load_tokenizer):
        with pytest.raises(ValueError, match=r"^policy\.tokenizer: builtin models have their own character tokenizer"):
            load({"model": "builtin:tiny-gpt", "tokenizer": str(larger)})


def test_threads_of_one_process_load_at_once(tmp_path: Path) -> None:
    # --single-process: the learner and a generator each load the policy in a worker thread of the same process; a
    # load beside another got meta tensors ("Cannot copy out of meta tensor") or no AutoModelForCausalLM at all
    directory = write_tiny_hf_model(tmp_path / "m")
    errors: list[str] = []

    def load() -> None:
        try:
            policy = Policy.from_spec({"model": f"hf:{directory}"})
            policy.to("cpu")
            assert not any(t.is_meta for t in policy.state_dict().values())
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=load) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
