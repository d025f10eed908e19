"""A prepared corpus (written by `zoo.prepare`): flat token shards and the manifest.json that describes them.

    <dir>/manifest.json          source, tokenizer state, vocab size, dtype, token counts, sha256 checksums
    <dir>/train_000000.bin ...   token ids of the training documents, each followed by the end-of-text id
    <dir>/val_000000.bin ...     the same for the validation documents
    <dir>/.zoo-prepare.lock      held while zoo-prepare writes the directory (removed when it ends)

A shard is a bare little-endian array (uint16 when the vocabulary has fewer than 65,536 ids, else uint32),
so `np.memmap` reads any part of it without loading the rest.

Trust. A run reads only regular files inside the corpus directory that the manifest names, and checks each
shard before training on it (`open_shards`, data.verify): its sha256 against the manifest and its largest id
against the vocabulary, in one pass. What was verified is recorded in the user's cache directory (never in the
corpus, which may be read-only or shared), keyed by the shard's size, mtime, ctime, inode and device, so a
corpus is read whole once, not at every run.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import numpy as np

from zoo.commands import command
from zoo.data.corpus import DataError
from zoo.io import atomic_write, atomic_write_json, cache_dir, read_json

FORMAT = "zoo-tokens/1"
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
DTYPES = ("uint16", "uint32")
# data.verify: once = when a shard changed since this user last verified it (its stat differs from the
# record); always = at every open; never = sizes only (a damaged shard or a bad id then fails mid-run, or not).
VERIFY = ("once", "always", "never")
VERIFIED_FORMAT = "zoo-verified/1"
_READ_BYTES = 1 << 24  # a shard is hashed and range-checked in blocks of this size, never loaded whole
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def dtype_for(vocab_size: int) -> str:
    """The smallest unsigned integer type that holds every id."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"


def write_shard(directory: Path, split: str, index: int, ids: np.ndarray) -> dict[str, Any]:
    """Write `ids` as shard `index` of `split` (little-endian, atomically); returns its manifest fields."""
    data = ids.astype(ids.dtype.newbyteorder("<"), copy=False).tobytes()
    name = shard_name(split, index)
    atomic_write(Path(directory) / name, lambda f: f.write(data), mode="wb")
    return {"file": name, "sha256": hashlib.sha256(data).hexdigest()}


# ----------------------------------------------------------------------------------------------
# The manifest


def read_manifest(path: str | Path, key: str = "data.path") -> dict[str, Any]:
    """The manifest of a finished prepared corpus, its structure checked; one-line errors naming `key`."""
    root = Path(path).expanduser()
    file = root / MANIFEST
    if not root.is_dir():
        raise DataError(f"{key}: no prepared corpus at '{root}' (not a directory); make one with "
                        f"{command('prepare')} <text files> --out {root}")
    if file.is_symlink() and not _inside(file.resolve(), root):
        raise DataError(f"{key}: '{file}' is a link to '{file.resolve()}', outside the corpus directory; "
                        "a corpus's files must be inside it")
    if file.exists() and not file.is_file() and not file.is_dir():  # a FIFO would block the read
        raise DataError(f"{key}: '{file}' is not a regular file; prepare the corpus again")
    try:
        manifest = read_json(file)
    except FileNotFoundError:
        raise DataError(f"{key}: '{root}' has no {MANIFEST}; make a prepared corpus with "
                        f"{command('prepare')} <text files> --out {root}") from None
    except (OSError, ValueError) as e:  # FileFormatError: too large, too deep, not JSON
        raise DataError(f"{key}: cannot read '{file}': {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{key}: '{file}' is not a zoo prepare manifest ({FORMAT})")
    if not manifest.get("complete"):
        raise DataError(f"{key}: '{root}' is only partly prepared; rerun the {command('prepare')} command to finish it")
    if problem := manifest_problem(manifest):
        raise DataError(f"{key}: '{file}' is damaged ({problem}); prepare the corpus again")
    return manifest


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _entry_problem(entry: Any, where: str) -> str | None:
    """What is wrong with one shard entry of the manifest ({file, tokens, sha256, ...}), or None."""
    if not isinstance(entry, dict) or not _is_count(entry.get("tokens")):
        return f"{where}.tokens: expected an integer >= 0"
    if not entry["tokens"]:
        return None
    file = entry.get("file")
    # zoo-prepare writes bare names: a path (../x.bin, /etc/x, sub/x.bin) would read outside the corpus
    if not isinstance(file, str) or not file or file in (".", "..") or "/" in file or "\\" in file or "\0" in file:
        return f"{where}.file: {file!r} is not a file name inside the corpus directory"
    if not isinstance(entry.get("sha256"), str) or not _SHA256.match(entry["sha256"]):
        return f"{where}.sha256: expected 64 hex digits"
    return None


def manifest_problem(m: dict[str, Any]) -> str | None:
    """The first thing in a complete manifest that zoo-prepare would not have written, or None."""
    vocab = m.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        return "vocab_size: expected an integer >= 1"
    if m.get("dtype") != dtype_for(vocab):
        return f"dtype: expected {dtype_for(vocab)} for vocab_size {vocab}, got {m.get('dtype')!r}"
    if not isinstance(m.get("tokenizer"), dict):
        return "tokenizer: expected the tokenizer's state"
    if not isinstance(m.get("eot_id"), int) or not 0 <= m["eot_id"] < vocab:
        return "eot_id: expected an id below vocab_size"
    shards, splits = m.get("shards"), m.get("splits")
    if not isinstance(shards, list) or not isinstance(splits, dict):
        return "shards, splits: expected a list and a mapping"
    for i, shard in enumerate(shards):
        for split in SPLITS:
            if problem := _entry_problem(shard.get(split) if isinstance(shard, dict) else None,
                                         f"shards[{i}].{split}"):
                return problem
    for split in SPLITS:
        counts = splits.get(split)
        if not isinstance(counts, dict) or not all(_is_count(counts.get(k)) for k in ("tokens", "documents",
                                                                                     "characters", "bytes")):
            return f"splits.{split}: expected counts of tokens, documents, characters and bytes"
        if counts["tokens"] != sum(s[split]["tokens"] for s in shards) or not counts["documents"]:
            return f"splits.{split}: its counts disagree with its shards"
    return None


# ----------------------------------------------------------------------------------------------
# Shards


def _inside(path: Path, root: Path) -> bool:
    return path == root or root.resolve() in path.parents


def check_verify(verify: Any, key: str = "data.verify") -> None:
    if verify not in VERIFY:
        raise DataError(f"{key}: got {verify!r}; valid: {', '.join(VERIFY)}")


def open_shards(path: str | Path, manifest: dict[str, Any], split: str, key: str = "data.path",
                verify: str = "once") -> list[np.memmap]:
    """Memory maps of a split's non-empty shards, in order. Each must be a regular file inside the corpus
    directory (a link that resolves inside it is followed, one that leads out is refused), of the manifest's
    size, and, unless verify="never", match the manifest's sha256 and hold only ids below its vocab_size.
    `manifest` comes from read_manifest (its structure checked)."""
    check_verify(verify)
    root = Path(path).expanduser().resolve()
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    record = _VerifiedRecord(root) if verify == "once" else None
    maps = []
    for shard in manifest["shards"]:
        entry = shard[split]
        if entry["tokens"]:
            maps.append(_open_shard(root, entry, dtype, manifest["vocab_size"], key, verify, record))
    if record is not None:
        record.save()
    return maps


def _open_shard(root: Path, entry: dict, dtype: np.dtype, vocab: int, key: str, verify: str,
                record: _VerifiedRecord | None) -> np.memmap:
    named = root / entry["file"]
    file = named.resolve()  # follows links: where the bytes really are
    if not _inside(file, root):
        raise DataError(f"{key}: shard '{named}' links to '{file}', outside the corpus directory '{root}'; "
                        "a corpus's shards must be inside it")
    expected = entry["tokens"] * dtype.itemsize
    try:  # the file checked and mapped is the one just resolved (O_NOFOLLOW), and a FIFO cannot block (O_NONBLOCK)
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        what = "is missing" if isinstance(e, FileNotFoundError) else f"cannot be opened ({e.strerror})"
        raise DataError(f"{key}: shard '{named}' {what}; rerun {command('prepare')} to repair the corpus") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != expected:
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"{st.st_size} bytes, not {expected}"
        raise DataError(f"{key}: shard '{named}' is {what}; rerun {command('prepare')} to repair the corpus")
    with os.fdopen(fd, "rb") as f:
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
        if verify != "never":
            known = record.get(entry["file"], stamp, entry["sha256"]) if record is not None else None
            top = known if known is not None else _verify(f, named, entry["sha256"], dtype, key)
            if top >= vocab:
                raise DataError(f"{key}: shard '{named}' holds token id {top}, past the vocabulary of {vocab} "
                                f"(ids 0..{vocab - 1}); prepare the corpus again")
            if record is not None and known is None:
                record.put(entry["file"], stamp, entry["sha256"], top)
        return np.memmap(f, dtype=dtype, mode="r")  # the mapping keeps its own reference to the file


def _verify(f, named: Path, sha256: str, dtype: np.dtype, key: str) -> int:
    """Read the shard once: its sha256 must be the manifest's; returns its largest id."""
    h, top = hashlib.sha256(), 0
    buf = bytearray(_READ_BYTES)
    view = memoryview(buf)
    while n := f.readinto(buf):
        h.update(view[:n])
        if n >= dtype.itemsize:
            top = max(top, int(np.frombuffer(buf, dtype, count=n // dtype.itemsize).max()))
    if h.hexdigest() != sha256:
        raise DataError(f"{key}: shard '{named}' does not match its sha256 in {MANIFEST} (changed or damaged "
                        f"since it was prepared); rerun {command('prepare')} to repair the corpus")
    return top


_NOTED: set[Path] = set()  # record directories that could not be written, already said


class _VerifiedRecord:
    """The shards of one corpus this user has verified: file name -> the stat it had, the sha256 it matched
    and its largest id. Kept in <zoo cache>/verified/, one JSON file per corpus directory. A missing, damaged
    or unwritable record only means verifying again."""

    def __init__(self, root: Path):
        self.root = root
        self.file = cache_dir() / "verified" / f"{hashlib.sha256(str(root).encode()).hexdigest()[:32]}.json"
        self.shards: dict[str, Any] = {}
        self.changed = False
        try:  # bounded, a regular file only (FileFormatError, a ValueError, otherwise): damaged means verify again
            saved = read_json(self.file) if self.file.is_file() else {}
            if saved.get("format") == VERIFIED_FORMAT and saved.get("corpus") == str(root):
                self.shards = dict(saved["shards"])
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            pass

    def get(self, name: str, stamp: list[int], sha256: str) -> int | None:
        """The shard's largest id if it was verified against this sha256 and has not changed since."""
        seen = self.shards.get(name)
        if isinstance(seen, dict) and seen.get("stat") == stamp and seen.get("sha256") == sha256 \
                and _is_count(seen.get("max_id")):
            return seen["max_id"]
        return None

    def put(self, name: str, stamp: list[int], sha256: str, top: int) -> None:
        self.shards[name] = {"stat": stamp, "sha256": sha256, "max_id": top}
        self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        try:
            atomic_write_json(self.file, {"format": VERIFIED_FORMAT, "corpus": str(self.root), "shards": self.shards})
        except OSError as e:  # a read-only or full home: the shards are verified again at the next open
            if self.file.parent in _NOTED:
                return
            _NOTED.add(self.file.parent)  # said once per process, not once per split
            print(f"note: cannot record verified shards in '{self.file.parent}' ({e.strerror or e}); they are "
                  "verified again next time", file=sys.stderr, flush=True)
