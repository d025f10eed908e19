"""Embedded corpus, text-file reading errors, train/val split, and the corpus build script."""

from __future__ import annotations

import gzip
import importlib.util
import re
from pathlib import Path

import pytest

from zoo.data import (
    DEFAULT_CORPUS,
    DataError,
    DataFileNotFoundError,
    load_default_corpus,
    read_text_file,
    split_text,
)

ROOT = Path(__file__).resolve().parents[2]


def _load_build_script():
    spec = importlib.util.spec_from_file_location("build_corpus", ROOT / "scripts" / "build_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- default corpus ---------------------------------------------------------------------------


def test_default_corpus_loads_and_is_large():
    text = load_default_corpus()
    assert isinstance(text, str)
    assert len(text) > 500_000
    assert text.startswith("ALL'S WELL THAT ENDS WELL")
    assert "To be, or not to be" in text
    assert "\r" not in text


def test_default_corpus_has_no_gutenberg_licence_text():
    text = load_default_corpus()
    for pattern in [r"gutenberg", r"small print", r"\be-?texts?\b", r"\bebook", r"copyright", r"world library"]:
        assert not re.search(pattern, text, re.IGNORECASE), pattern


def test_default_corpus_file_is_small_and_reproducible():
    data = DEFAULT_CORPUS.read_bytes()
    assert len(data) <= 2_000_000
    assert data[:2] == b"\x1f\x8b"
    assert data[4:8] == b"\x00\x00\x00\x00"  # gzip mtime 0 -> byte-reproducible builds
    assert gzip.decompress(data).decode("utf-8") == load_default_corpus()


def test_default_corpus_has_no_long_blank_runs():
    assert "\n\n\n\n" not in load_default_corpus()


def test_default_val_split_uses_only_train_characters():
    # A char tokenizer fit on the train split must be able to encode the val split.
    train, val = split_text(load_default_corpus())
    assert set(val) <= set(train)


# -- read_text_file ---------------------------------------------------------------------------


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_read_missing_file(tmp_path):
    p = tmp_path / "nope.txt"
    with pytest.raises(DataFileNotFoundError) as err:
        read_text_file(p)
    assert _one_line(err) == f"data.path: no such file '{p}'"
    assert isinstance(err.value, FileNotFoundError)
    assert isinstance(err.value, DataError) and isinstance(err.value, ValueError)


def test_read_directory(tmp_path):
    with pytest.raises(DataError) as err:
        read_text_file(tmp_path)
    msg = _one_line(err)
    assert msg.startswith("data.path:") and "is a directory" in msg and str(tmp_path) in msg


@pytest.mark.parametrize("content", [b"", b"  \n\n\t "])
def test_read_empty_file(tmp_path, content):
    p = tmp_path / "empty.txt"
    p.write_bytes(content)
    with pytest.raises(DataError) as err:
        read_text_file(p)
    assert _one_line(err) == f"data.path: '{p}' is empty"


def test_read_non_utf8_reports_byte_offset(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes("héllo".encode("latin-1"))  # b'h\xe9llo': the bad byte is at offset 1
    with pytest.raises(DataError) as err:
        read_text_file(p)
    assert _one_line(err).startswith(f"data.path: '{p}' is not valid UTF-8 (byte 1)")


def test_read_normalises_newlines_and_bom(tmp_path):
    p = tmp_path / "win.txt"
    p.write_bytes("\ufeffline one\r\nline two\rthree é\n".encode())
    assert read_text_file(str(p)) == "line one\nline two\nthree é\n"


# -- split_text -------------------------------------------------------------------------------


def test_split_default_is_90_10():
    text = "".join(chr(97 + i % 26) for i in range(1000))
    train, val = split_text(text)
    assert (len(train), len(val)) == (900, 100)
    assert train + val == text


@pytest.mark.parametrize("frac", [0.05, 0.25, 0.5])
def test_split_fractions(frac):
    text = load_default_corpus()[:100_000]
    train, val = split_text(text, frac)
    assert train + val == text
    assert abs(len(val) / len(text) - frac) < 1e-4


@pytest.mark.parametrize("frac", [0.0, 1.0, -0.1, 1.5])
def test_split_rejects_bad_fraction(frac):
    with pytest.raises(DataError, match="data.val_fraction"):
        split_text("some text here", frac)


def test_split_rejects_empty_side():
    with pytest.raises(DataError, match="empty split"):
        split_text("a", 0.5)


# -- build script cleaning --------------------------------------------------------------------


def test_build_script_strips_gutenberg_boilerplate():
    mod = _load_build_script()
    raw = (
        "The Project Gutenberg Etext of Hamlet\r\nLicence blah\r\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\n"
        "HAMLET\r\n\r\n\r\n\r\n\r\n<<THIS ELECTRONIC VERSION IS COPYRIGHT\r\nWORLD LIBRARY>>\r\n"
        "Ber.   \r\nWho's _there_?\r\n@@@\r\nLamenting some enforc&egrave;d chastity, &c.\r\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nMore licence text\r\n"
    )
    out = mod.normalise(mod.strip_boilerplate(raw))
    assert out == "HAMLET\n\n\nBer.\nWho's there?\nLamenting some enforcèd chastity, &c."
    assert not mod._FORBIDDEN.search(out)


def test_build_script_old_style_small_print_header():
    mod = _load_build_script()
    raw = "legal\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\nPlay text\n"
    raw += "End of the Project Gutenberg Etext of Play\nfooter\n"
    assert mod.normalise(mod.strip_boilerplate(raw)) == "Play text"
