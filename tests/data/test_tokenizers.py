"""Tokenizers: round trips, fixed special ids, state round trips, char errors, BPE caching."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zoo.data import (
    BOS_ID,
    N_SPECIAL,
    SPECIALS,
    TOKENIZERS,
    BPETokenizer,
    CharTokenizer,
    DataError,
    Tokenizer,
    build_tokenizer,
    cached_bpe,
    load_default_corpus,
    tokenizer_from_state,
)

BPE_VOCAB = 400  # small: keeps training on the slice well under a second


@pytest.fixture(scope="module")
def train_text() -> str:
    return load_default_corpus()[:200_000]


@pytest.fixture(scope="module")
def excerpt(train_text) -> str:
    return train_text[50_000:52_000]


@pytest.fixture(scope="module")
def fitted(train_text) -> dict[str, Tokenizer]:
    out = {}
    for name in TOKENIZERS:
        kw = {"vocab_size": BPE_VOCAB} if name == "bpe" else {}
        out[name] = build_tokenizer(name, **kw).fit(train_text)
    return out


ALL = sorted(TOKENIZERS)
UNICODE = "héllo wörld, naïve café — 日本語 🎭\n\ttabs\r\nand\x00nul"


def test_registry_names():
    assert ALL == ["bpe", "byte", "char"]


def test_unknown_tokenizer_lists_valid_names():
    with pytest.raises(DataError) as err:
        build_tokenizer("x")
    assert str(err.value) == "tokenizer: unknown 'x'; valid: bpe, byte, char, hf:<Hugging Face name or directory>"


def test_pretrained_tokenizer_ids_follow_zoos_specials_and_its_state_rebuilds_it(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from tests.helpers import save_pretrained_tokenizer

    path = save_pretrained_tokenizer(tmp_path / "tok")
    tok, reference = build_tokenizer(f"hf:{path}"), AutoTokenizer.from_pretrained(str(path))
    text = "To be, or not to be <|endoftext|> <eos>"
    ids = tok.encode(text)
    # shifted past zoo's 20 specials; the pretrained end-of-text token in text is text, not a control token
    assert ids == [N_SPECIAL + i for i in reference.encode(text, split_special_tokens=True)]
    assert tok.eot_id == N_SPECIAL + reference.eos_token_id and tok.vocab_size == N_SPECIAL + len(reference)
    assert tok.decode([BOS_ID] + ids + [tok.eot_id]) == "<bos>" + text + "<|endoftext|>"
    rebuilt = tokenizer_from_state(json.loads(json.dumps(tok.state_dict())))  # plain JSON, no directory needed
    assert rebuilt.encode(text) == ids and rebuilt.state_dict() == tok.state_dict()
    with pytest.raises(DataError, match="^tokenizer: 'hf:/no/such' is pretrained and has no option 'vocab_size'$"):
        build_tokenizer("hf:/no/such", vocab_size=3)


def test_unknown_option_is_one_line_error():
    with pytest.raises(DataError, match="'char' has no option 'vocab_size'"):
        build_tokenizer("char", vocab_size=100)


@pytest.mark.parametrize("name", ALL)
def test_round_trip_on_shakespeare(fitted, excerpt, name):
    tok = fitted[name]
    ids = tok.encode(excerpt)
    assert all(tok.n_special <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == excerpt


@pytest.mark.parametrize("name", ["byte", "bpe"])
def test_round_trip_on_unicode(fitted, name):
    tok = fitted[name]
    assert tok.decode(tok.encode(UNICODE)) == UNICODE


def test_byte_ids_are_offset_bytes(fitted):
    tok = fitted["byte"]
    assert tok.vocab_size == tok.n_special + 256
    assert tok.encode("é") == [tok.n_special + b for b in "é".encode()]
    assert tok.decode(tok.encode("日本")[:-1]) == "日\ufffd"  # truncated UTF-8 -> replacement char


@pytest.mark.parametrize("name", ALL)
def test_specials_have_fixed_ids(fitted, name):
    tok = fitted[name]
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id) == (0, 1, 2, 3)
    assert tok.sentinel_ids == list(range(4, 20))
    assert tok.n_special == len(SPECIALS) == 20
    assert SPECIALS[:4] == ["<pad>", "<bos>", "<eos>", "<mask>"] and SPECIALS[4] == "<extra_0>"
    for i, s in enumerate(SPECIALS):
        assert tok.decode([i]) == s
    assert tok.vocab_size > tok.n_special


@pytest.mark.parametrize("name", ALL)
def test_decode_skip_special(fitted, name):
    tok = fitted[name]
    ids = [tok.bos_id, *tok.encode("Good night"), tok.eos_id, tok.pad_id, tok.pad_id]
    assert tok.decode(ids) == "<bos>Good night<eos><pad><pad>"
    assert tok.decode(ids, skip_special=True) == "Good night"


@pytest.mark.parametrize("name", ["byte", "bpe"])
def test_special_strings_in_text_are_plain_text(fitted, name):
    tok = fitted[name]
    ids = tok.encode("a <eos> b <pad>")
    assert all(i >= tok.n_special for i in ids)
    assert tok.decode(ids) == "a <eos> b <pad>"


@pytest.mark.parametrize("name", ALL)
def test_decode_out_of_range_id(fitted, name):
    tok = fitted[name]
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([tok.vocab_size])


@pytest.mark.parametrize("name", ALL)
def test_state_dict_round_trip(fitted, excerpt, name, tmp_path):
    tok = fitted[name]
    state = json.loads(json.dumps(tok.state_dict()))  # must survive JSON (checkpoint-safe)
    assert state["name"] == name
    for rebuilt in (tokenizer_from_state(state), TOKENIZERS[name].from_state(state)):
        assert type(rebuilt) is type(tok)
        assert rebuilt.vocab_size == tok.vocab_size
        assert rebuilt.encode(excerpt) == tok.encode(excerpt)
        assert rebuilt.decode(tok.encode(excerpt)) == excerpt
    path = tmp_path / f"{name}.json"
    tok.save(path)
    assert Tokenizer.load(path).encode(excerpt) == tok.encode(excerpt)


def test_from_state_rejects_wrong_class(fitted):
    with pytest.raises(DataError, match="state is for 'byte'"):
        CharTokenizer.from_state(fitted["byte"].state_dict())


def test_char_vocab_is_sorted_chars_after_specials():
    tok = CharTokenizer().fit("banana!")
    assert tok.chars == ["!", "a", "b", "n"]
    assert tok.vocab_size == 20 + 4
    assert tok.encode("ab!") == [21, 22, 20]


def test_char_unknown_characters_error(fitted):
    tok = fitted["char"]
    with pytest.raises(ValueError) as err:
        tok.encode("Good morrow, señor Müller, café")
    msg = str(err.value)
    assert "\n" not in msg
    assert "never saw: 'ñ', 'ü', 'é'" in msg
    assert f"trained on {len(tok.chars)} characters" in msg
    assert "tokenizer=byte" in msg


def test_char_replace_drops_unknown_characters(fitted):
    tok = fitted["char"]
    assert tok.encode("café au lait", errors="replace") == tok.encode("caf au lait")
    assert tok.encode("日本", errors="replace") == []
    with pytest.raises(ValueError, match="errors must be"):
        tok.encode("x", errors="ignore")


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("text", ["", "a", UNICODE, "\ud800 lone surrogate", "\U0010ffff top code point"],
                         ids=["empty", "one", "unicode", "surrogate", "top"])
def test_encode_array_is_encode_as_an_integer_array(fitted, excerpt, name, text):
    """char's table lookup against its per-character encode: the ids, and the same refusal of what it never saw
    (strict) or the same drop (replace)."""
    tok = fitted[name]
    for sample in (text, excerpt, excerpt + text):
        for errors in ("strict", "replace"):
            try:
                expected = tok.encode(sample, errors=errors)
            except Exception as e:  # char: what it never saw; bpe: a lone surrogate
                with pytest.raises(type(e)) as err:
                    tok.encode_array(sample, errors=errors)
                assert str(err.value) == str(e)
                continue
            ids = tok.encode_array(sample, errors=errors)
            assert ids.dtype in (np.int32, np.int64) and ids.tolist() == expected


def test_unfitted_tokenizer_errors():
    with pytest.raises(DataError, match="not fitted"):
        CharTokenizer().encode("abc")
    with pytest.raises(DataError, match="not fitted"):
        _ = BPETokenizer().vocab_size


def test_bpe_rejects_tiny_vocab():
    with pytest.raises(DataError, match="tokenizer.vocab_size"):
        BPETokenizer(vocab_size=100)


def test_bpe_specials_are_first_ids(fitted):
    tok = fitted["bpe"]
    assert [tok._tok.token_to_id(s) for s in SPECIALS] == list(range(20))
    assert tok.vocab_size <= BPE_VOCAB


def test_bpe_chunked_encode_matches_whole(fitted):
    tok = fitted["bpe"]
    text = load_default_corpus()[:300_000]  # long enough to be encoded in parallel chunks
    assert tok.encode(text) == tok._tok.encode(text, add_special_tokens=False).ids


def test_cached_bpe_reuses_then_retrains(tmp_path, train_text, monkeypatch):
    cache = tmp_path / "cache" / "bpe.json"
    text = train_text[:60_000]
    first = cached_bpe(text, cache, vocab_size=300)
    assert cache.is_file()
    mtime = cache.stat().st_mtime_ns
    assert not list(cache.parent.glob("*.tmp"))  # atomic write leaves no temp file

    calls = []
    real_fit = BPETokenizer.fit
    monkeypatch.setattr(BPETokenizer, "fit", lambda self, t: calls.append(1) or real_fit(self, t))

    second = cached_bpe(text, cache, vocab_size=300)
    assert calls == []  # loaded, not retrained
    assert cache.stat().st_mtime_ns == mtime
    assert second.encode(text[:2000]) == first.encode(text[:2000])

    cached_bpe(text + " more words", cache, vocab_size=300)  # text changed -> retrain
    assert calls == [1]
    cached_bpe(text + " more words", cache, vocab_size=320)  # vocab size changed -> retrain
    assert calls == [1, 1]
    cached_bpe(text + " more words", cache, vocab_size=320)
    assert calls == [1, 1]


def test_cached_bpe_recovers_from_corrupt_cache(tmp_path, train_text):
    cache = tmp_path / "bpe.json"
    cache.write_text("{not json")
    tok = cached_bpe(train_text[:20_000], cache, vocab_size=300)
    assert tok.decode(tok.encode("To be")) == "To be"
    assert json.loads(cache.read_text())["meta"]["vocab_size"] == 300


def test_a_hf_tokenizer_directory_linking_out_is_refused_in_one_line(tmp_path):
    """The same directory check as init_from=hf:<dir>: a file of the tokenizer read through a link out is refused."""
    pytest.importorskip("transformers")
    from tests.helpers import save_pretrained_tokenizer
    from zoo.data import DataError
    from zoo.data.tokenizers import HFTokenizer

    directory = save_pretrained_tokenizer(tmp_path / "tok")
    outside = tmp_path / "outside.json"
    (directory / "tokenizer.json").rename(outside)
    (directory / "tokenizer.json").symlink_to(outside)
    before = outside.read_bytes()
    with pytest.raises(DataError, match=r"^tokenizer: 'hf:.*tokenizer.json.*a symbolic link to .*outside"):
        HFTokenizer(str(directory))
    assert outside.read_bytes() == before
