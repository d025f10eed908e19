"""Text corpora: the embedded Shakespeare default, user text files, and the train/val split.

Errors raised for bad input are `DataError` (a `ValueError`) with a one-line message that names
the config key to fix, so a CLI can print ``str(err)`` instead of a traceback.
"""

from __future__ import annotations

import functools
import gzip
import os
import shlex
from pathlib import Path

from zoo.commands import command
from zoo.io import DataError as DataError  # zoo.data's error; below the data layer (zoo.net subclasses it)
from zoo.io import special_file

DEFAULT_CORPUS = Path(__file__).resolve().parent / "shakespeare.txt.gz"
"""The 37 Shakespeare plays from Project Gutenberg (public domain); see scripts/build_corpus.py."""


MAX_TEXT_BYTES = 200 * 10**6
"""The most text data=text_file and data=hf read into memory; past it they say to run zoo-prepare instead."""


def too_big(what: str, size: int, prepare_args: str) -> str:
    """The one-line refusal for a corpus past MAX_TEXT_BYTES, with the command that prepares it."""
    return (f"{what} is {size / 1e6:,.0f} MB, more than the {MAX_TEXT_BYTES / 1e6:.0f} MB a run reads into memory; "
            f"prepare it once with `{command('prepare')} {prepare_args} --out corpus.tokens` and train with "
            "data=tokens data.path=corpus.tokens")


class DataFileNotFoundError(DataError, FileNotFoundError):
    """`data.path` does not exist; catchable as `DataError` or as `FileNotFoundError`."""


@functools.lru_cache(maxsize=1)
def load_default_corpus() -> str:
    """Return the embedded Shakespeare corpus (about 4.8M characters, plain UTF-8, ``\\n`` newlines)."""
    # Cached: it is immutable and every run that uses the default would otherwise re-inflate 1.9 MB.
    with gzip.open(DEFAULT_CORPUS, "rb") as f:
        return f.read().decode("utf-8")


def check_text_file(path: str | os.PathLike[str]) -> Path:
    """The path of an existing regular file for data.path (not a directory, FIFO, device or socket: reading one
    would block or never end), else a one-line DataError."""
    p = Path(path).expanduser()
    if kind := special_file(p):
        raise DataError(f"data.path: '{p}' is {kind}, not a regular file; point it at a text file")
    if not p.exists():
        raise DataFileNotFoundError(f"data.path: no such file '{p}'")
    if p.is_dir():
        raise DataError(f"data.path: '{p}' is a directory; point it at a text file")
    return p


def read_text_file(path: str | os.PathLike[str]) -> str:
    """Read a UTF-8 text file for training, with one-line errors for the usual mistakes.

    Line endings are normalised to ``\\n`` and a leading byte-order mark is dropped, so the same
    text saved on Windows or Unix tokenizes identically.
    """
    p = check_text_file(path)
    size = p.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise DataError(too_big(f"data.path: '{p}'", size, shlex.quote(str(p))))
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise DataError(f"data.path: cannot read '{p}': {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"data.path: '{p}' is not valid UTF-8 (byte {e.start}); re-save it as UTF-8") from None
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise DataError(f"data.path: '{p}' is empty")
    return text


def split_text(text: str, val_fraction: float = 0.1) -> tuple[str, str]:
    """Split into (train, val): the first ``1 - val_fraction`` of the characters, then the rest.

    A contiguous tail (the nanoGPT convention) rather than random lines keeps validation text
    unseen in context, so val loss measures generalisation rather than memorised neighbours.
    """
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"data.val_fraction: must be between 0 and 1 (exclusive), got {val_fraction}")
    n = int(len(text) * (1.0 - val_fraction))
    train, val = text[:n], text[n:]
    if not train or not val:
        raise DataError(
            f"data.val_fraction: {val_fraction} of {len(text)} characters leaves an empty split; "
            "use more text or another fraction"
        )
    return train, val
