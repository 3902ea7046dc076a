"""The vocabulary hash of a tokenizer directory (`actors.policy._vocabulary`): what gives its ids their meaning, and
nothing a re-save rewrites."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from actors.policy import write_tiny_hf_model
from actors.policy._vocabulary import vocabulary_hash


def test_a_tokenizer_saved_again_by_another_transformers_has_the_same_vocabulary(tmp_path: Path) -> None:
    """Loaded and saved again, or rewritten as transformers 4 writes it (its tokenizer_class, the
    added_tokens_decoder and special_tokens_map.json that 5 no longer writes, the special tokens as AddedToken
    objects, tokenizer.json laid out otherwise): the same ids, the same hash."""
    import transformers

    directory = write_tiny_hf_model(tmp_path / "hf")
    before = vocabulary_hash(directory)
    assert before is not None
    transformers.AutoTokenizer.from_pretrained(str(directory)).save_pretrained(str(tmp_path / "again"))
    assert vocabulary_hash(tmp_path / "again") == before

    fast = json.loads((directory / "tokenizer.json").read_text())
    added = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in fast["added_tokens"]}
    config = json.loads((directory / "tokenizer_config.json").read_text())

    def token(content: str) -> dict[str, Any]:
        return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}

    v4 = tmp_path / "v4"
    v4.mkdir()
    (v4 / "tokenizer.json").write_text(json.dumps(dict(reversed(fast.items())), indent=4, sort_keys=True))
    (v4 / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "added_tokens_decoder": added,
                "clean_up_tokenization_spaces": False,
                "eos_token": config["eos_token"],
                "extra_special_tokens": {},
                "model_max_length": 1000000000000000019884624838656,
                "pad_token": config["pad_token"],
                "tokenizer_class": "PreTrainedTokenizerFast",
            },
            indent=2,
        )
    )
    (v4 / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": token(config["eos_token"]), "pad_token": token(config["pad_token"])})
    )
    assert vocabulary_hash(v4) == before


def test_other_ids_or_special_tokens_are_another_vocabulary(tmp_path: Path) -> None:
    """A token added in front (every id moves), or another eos token named over the same vocabulary (in
    special_tokens_map.json, which overrides tokenizer_config.json): another hash. No tokenizer file: none."""
    directory = write_tiny_hf_model(tmp_path / "hf")
    before = vocabulary_hash(directory)
    assert vocabulary_hash(write_tiny_hf_model(tmp_path / "bos", bos=True)) not in (None, before)
    (directory / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<pad>"}))
    assert vocabulary_hash(directory) not in (None, before)
    (directory / "special_tokens_map.json").unlink()
    assert vocabulary_hash(directory) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    assert vocabulary_hash(empty) is None


def test_a_slow_tokenizers_vocabulary_reads_as_the_fast_one_made_from_it(tmp_path: Path) -> None:
    """A BPE tokenizer's vocab.json (a slow tokenizer's files) and the tokenizer.json a fast one writes of the same
    vocabulary give the same ids: saving a slow tokenizer again as a fast one is the same tokenizer."""
    from tokenizers import Tokenizer, models

    vocab = {"<eos>": 0, "a": 1, "b": 2, "ab": 3}
    slow, fast = tmp_path / "slow", tmp_path / "fast"
    slow.mkdir()
    fast.mkdir()
    (slow / "vocab.json").write_text(json.dumps(vocab))
    (slow / "merges.txt").write_text("#version: 0.2\na b\n")
    Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")])).save(str(fast / "tokenizer.json"))
    for directory in (slow, fast):
        (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    assert vocabulary_hash(slow) == vocabulary_hash(fast) is not None


def test_tokenizer_files_it_cannot_read_give_no_hash_rather_than_an_error(tmp_path: Path) -> None:
    """The hash is taken at every `flywheel up`: a tokenizer.json of a shape it does not know (an added token without
    its id, an empty Unigram entry) left the start with a KeyError or an IndexError instead of recording nothing."""
    for name, data in {
        "no-id": {"model": {"vocab": {"a": 0}}, "added_tokens": [{"content": "<eos>"}]},
        "unigram": {"model": {"vocab": [["a", 0.0], []]}},
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text(json.dumps(data))
        assert vocabulary_hash(tmp_path / name) is None
