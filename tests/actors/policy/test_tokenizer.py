from actors.policy import SPECIAL_TOKENS, CharTokenizer


def test_char_tokenizer_round_trips_printable_text() -> None:
    tok = CharTokenizer()
    text = "def f(x):\n\treturn {'a': x ** 2}  # ~`|\\"
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text


def test_char_tokenizer_layout_is_fixed() -> None:
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.vocab_size == len(SPECIAL_TOKENS) + 2 + 95
    assert tok.encode("\n") == [4]
    assert tok.encode(" ") == [6]


def test_decode_skips_special_tokens_and_marks_unknown() -> None:
    tok = CharTokenizer()
    ids = [tok.bos_id or 0, *tok.encode("hi"), tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == "hi"
    assert tok.encode("é") == [tok.unk_id]
    assert tok.decode(tok.encode("aéb")) == "a?b"
