"""`zoo prepare` (or `python -m zoo.prepare`): tokenize a corpus once into token shards every run reuses.

    zoo prepare 'corpus/*.txt' --out corpus.tokens --tokenizer bpe --vocab-size 8192
    zoo prepare input.txt --out input.tokens           # one file: its last 10% is validation
    zoo train data=tokens data.path=corpus.tokens

Documents. Sources give documents in a fixed order: a text file is one document (or one per paragraph or
line: --sample-by), a JSONL line is one (its --text-field), a row of a Hugging Face dataset is one (--dataset,
streamed). Each document is followed by the tokenizer's end-of-text id: zoo's <eos> for char, byte and bpe;
a pretrained tokenizer's own end-of-text token (GPT-2's <|endoftext|>) where it has one, else <eos>.

Split. A document is validation when a hash of its text falls below --val-fraction (default 0.01):
deterministic, the same whatever the order or number of workers, and exact duplicates always land in the same
split. One text file prepared whole (the default --sample-by document) is one document, which no hash can put in
both splits: it is split as nanoGPT and data=text_file split a text, its last --val-fraction (default 0.1) of
characters validation, the cut moved back to the start of its line.

Shards. Documents are grouped in order into chunks of about --shard-mb of text; chunk k becomes
train_<k>.bin and val_<k>.bin (zoo.data.tokens). Chunk boundaries depend on the text alone, so the output
does not depend on --workers.

Failure. A run that fails on its input (a split left empty) removes what it wrote, so the next try, with other
flags, starts afresh in the same --out.

Resume. manifest.json is rewritten (atomically, like every shard) after each finished chunk, with the
sha256 of the chunk's text and of its shards. A rerun of the same command skips the chunks whose text and
files still match and redoes the rest: an interrupted run finished by a rerun is byte-identical to one that
was never interrupted.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import hashlib
import itertools
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from zoo.cli.common import OneLineParser, command, needs
from zoo.data.corpus import DataError
from zoo.data.tokenizers import HF_PREFIX, Tokenizer, build_tokenizer, tokenizer_from_state
from zoo.data.tokens import FORMAT, MANIFEST, SPLITS, dtype_for, write_shard
from zoo.io import FileFormatError, atomic_write_json, first_line, parse_json, read_json, remove_temp_files
from zoo.net import bound_network

SAMPLE_BY = ("document", "paragraph", "line")
# --val-fraction's default for each holdout rule (describe_source's "holdout"; a dataset's "split" is its own split)
VAL_FRACTION = {"hash": 0.01, "tail": 0.1}
LOCK = ".zoo-prepare.lock"


# ----------------------------------------------------------------------------------------------
# Sources -> documents


def expand_sources(patterns: list[str]) -> list[Path]:
    """Files named or matched by glob patterns, in sorted order per pattern; one-line errors."""
    files: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True)) if glob.has_magic(pattern) \
            else [os.path.expanduser(pattern)]
        if not matches:
            raise DataError(f"sources: '{pattern}' matches no file")
        for m in matches:
            p = Path(m)
            if not p.is_file():
                raise DataError(f"sources: no such file '{p}'" if not p.exists() else f"sources: '{p}' is not a file")
            if p.resolve() not in files:
                files.append(p.resolve())
    return files


def _is_jsonl(path: Path) -> bool:
    return path.name.removesuffix(".gz").endswith((".jsonl", ".json"))


def _open_text(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    return opener(path, "rt", encoding="utf-8", newline=None)  # newline=None: \r\n and \r read as \n


_PARAGRAPH_BREAK = re.compile(r"\n(?:[ \t]*\n)+")  # one or more blank (or whitespace-only) lines
_BLOCK_CHARS = 1 << 24  # files are read in blocks of this many characters, never whole


def _pieces(f, sample_by: str) -> Iterator[str]:
    """A text file's paragraphs (without their edge newlines) or lines, read block by block: the piece a
    block boundary cuts is carried into the next block."""
    rest = ""
    while block := f.read(_BLOCK_CHARS):
        parts = _PARAGRAPH_BREAK.split(rest + block) if sample_by == "paragraph" else (rest + block).split("\n")
        rest = parts.pop()
        yield from parts
    yield rest


def _file_documents(path: Path, sample_by: str, text_field: str) -> Iterator[str]:
    try:
        with _open_text(path) as f:
            if _is_jsonl(path):
                for n, line in enumerate(f, 1):
                    if line.strip():
                        yield _json_text(line, text_field, path, n)
            elif sample_by == "document":
                yield f.read().removeprefix("\ufeff")
            else:
                for i, piece in enumerate(_pieces(f, sample_by)):
                    yield (piece.removeprefix("\ufeff") if i == 0 else piece).strip("\n")
    except UnicodeDecodeError as e:
        raise DataError(f"sources: '{path}' is not valid UTF-8 ({e.reason}); re-save it as UTF-8") from None
    except (OSError, EOFError) as e:
        raise DataError(f"sources: cannot read '{path}': {getattr(e, 'strerror', None) or e}") from None


def _json_text(line: str, field: str, path: Path, n: int) -> str:
    try:
        record = parse_json(line, f"{path} line {n}")
    except FileFormatError as e:  # not JSON, nested too deep, a number out of range
        raise DataError(f"sources: {first_line(e)}") from None
    if not isinstance(record, dict) or field not in record:
        keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise DataError(f"--text-field: '{field}' not in '{path}' line {n}; it has: {keys}")
    if not isinstance(record[field], str):
        raise DataError(f"--text-field: '{field}' in '{path}' line {n} is not a string")
    return record[field]


def _dataset_documents(source: dict) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise DataError(needs("datasets", "hf", "--dataset")) from None
    bound_network()  # the hub and datasets' retries: ZOO_NET_TIMEOUT_S, not forever
    kw = {"data_files": source["data_files"]} if source["data_files"] else {}
    try:  # streaming: rows arrive as they are read, nothing is held whole
        ds = datasets.load_dataset(source["dataset"], source["config"], split=source["split"], streaming=True, **kw)
        rows = iter(ds)
        first = next(rows, None)
    except Exception as e:  # a missing dataset, no network, bad files: one line whatever the library raised
        msg = first_line(e)
        raise DataError(f"--dataset: cannot load '{source['dataset']}' ({msg})") from None
    field = source["text_field"]
    if first is not None and field not in first:
        raise DataError(f"--text-field: '{field}' not in dataset '{source['dataset']}'; it has: {', '.join(first)}")
    for row in itertools.chain([first] if first is not None else [], rows):
        yield row[field]


def documents(source: dict) -> Iterator[str]:
    """Every non-blank document of the source, in order."""
    if "dataset" in source:
        docs = _dataset_documents(source)
    else:
        docs = itertools.chain.from_iterable(
            _file_documents(Path(f["path"]), source["sample_by"], source["text_field"]) for f in source["files"])
    return (d for d in docs if d and not d.isspace())


def labelled(source: dict, val_fraction: float) -> Iterator[tuple[str, bool]]:
    """Every document with its split (True: validation): by its hash, or for the one document of a single text
    file (source["holdout"] == "tail") its head training and its last val_fraction validation, cut at a line's
    start."""
    if source.get("holdout") != "tail":
        yield from ((d, is_validation(d, val_fraction)) for d in documents(source))
        return
    text = "".join(documents(source))  # one document, read whole as --sample-by document reads it
    n = int(len(text) * (1.0 - val_fraction))
    cut = text.rfind("\n", 0, n) + 1 or n  # the start of the line the cut falls in (none before it: the cut)
    train, val = text[:cut], text[cut:]
    if not text.strip():
        return
    if not train.strip() or not val.strip():
        raise DataError(f"--val-fraction: the last {val_fraction} of '{source['files'][0]['path']}' ({len(text)} "
                        "characters) leaves an empty split; use more text or another fraction")
    yield train, False
    yield val, True


def is_validation(doc: str, val_fraction: float) -> bool:
    """The document's split: a hash of its text, so it depends on nothing else."""
    h = hashlib.blake2b(doc.encode("utf-8", errors="surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "big") < val_fraction * (1 << 64)


def chunks(docs: Iterator[tuple[str, bool]], shard_bytes: int) -> Iterator[tuple[list[tuple[str, bool]], str]]:
    """Consecutive documents with their splits, about `shard_bytes` of UTF-8 text each (a chunk closes once it
    reaches it), with the sha256 of their text (which tells a rerun whether a finished shard still matches its
    source)."""
    chunk: list[tuple[str, bool]] = []
    size, h = 0, hashlib.sha256()
    for doc, is_val in docs:
        chunk.append((doc, is_val))
        raw = doc.encode("utf-8", errors="surrogatepass")
        size += len(raw)
        h.update(raw)
        h.update(b"\0")  # a boundary no text holds: ["ab"] and ["a", "b"] differ
        if size >= shard_bytes:
            yield chunk, h.hexdigest()
            chunk, size, h = [], 0, hashlib.sha256()
    if chunk:
        yield chunk, h.hexdigest()


def no_text(source: dict) -> DataError:
    """The sources hold no document (empty files, whitespace only, an empty dataset)."""
    if "dataset" in source:
        return DataError(f"--dataset: '{source['dataset']}' (split {source['split']}) has no text in field "
                         f"'{source['text_field']}'")
    names = [f"'{f['path']}'" for f in source["files"]]
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return DataError(f"sources: no text in {', '.join(names[:3])}{more} (empty or only whitespace)")


def split_error(name: str, n: int, source: dict) -> DataError:
    """A split that received no document: the advice depends on why."""
    if n == 0:
        return no_text(source)
    if n == 1:  # no --val-fraction can put one document in both splits
        plain_text = "files" in source and not any(_is_jsonl(Path(f["path"])) for f in source["files"])
        finer = {"document": "--sample-by paragraph (or line)", "paragraph": "--sample-by line"}.get(
            source.get("sample_by")) if plain_text else None
        fix = f"split it into more with {finer}" if finer else "add documents"
        return DataError(f"sources: a single document, which cannot be both training and validation; {fix}")
    return DataError(f"--val-fraction: no document of {n} fell into the {name} split; "
                     + ("raise it or add documents" if name == "validation" else "lower it"))


# ----------------------------------------------------------------------------------------------
# The tokenizer, fixed once before any shard


def fit_tokenizer(spec: str, source: dict, vocab_size: int, sample_mb: float, val_fraction: float) -> Tokenizer:
    """char: the alphabet of the whole corpus (one pass); bpe: trained on the first `sample_mb` of training
    documents; byte: nothing to learn; hf:<name or dir>: loaded."""
    if spec == "bpe":
        tok = build_tokenizer("bpe", vocab_size=vocab_size)
        sample, size = [], 0
        for doc, is_val in labelled(source, val_fraction):
            if not is_val:
                sample.append(doc)
                size += len(doc)
                if size >= sample_mb * 1e6:
                    break
        if not sample:
            raise no_text(source) if not any(True for _ in documents(source)) else \
                DataError("sources: no training text to train the bpe tokenizer on; lower --val-fraction")
        return tok.fit("\n".join(sample))
    tok = build_tokenizer(spec)
    if spec == "char":
        alphabet: set[str] = set()
        for doc in documents(source):
            alphabet.update(doc)
        if not alphabet:
            raise no_text(source)
        return tok.fit("".join(sorted(alphabet)))
    return tok


# ----------------------------------------------------------------------------------------------
# One chunk -> its two shards (runs in a worker process, or in this one with --workers 1)

_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_state: dict, out: str, dtype: str, val_fraction: float) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle: it ends the pool
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already: no threads inside each
    tok = tokenizer_from_state(tokenizer_state)
    _WORKER.update(tok=tok, out=Path(out), dtype=np.dtype(dtype), val_fraction=val_fraction)


def _process_chunk(index: int, chunk: list[tuple[str, bool]], text_hash: str) -> dict:
    w = _WORKER
    tok: Tokenizer = w["tok"]
    record: dict[str, Any] = {"index": index, "text_sha256": text_hash}
    for split, is_val in zip(SPLITS, (False, True), strict=True):
        docs = [d for d, v in chunk if v == is_val]
        ids = tok.encode_batch(docs)
        n = sum(len(x) for x in ids) + len(ids)  # each document, then the end-of-text id
        eot = [tok.eot_id]
        flat = np.fromiter(itertools.chain.from_iterable(x + eot for x in ids), dtype=w["dtype"], count=n)
        entry = {"file": None, "tokens": n, "documents": len(docs), "characters": sum(len(d) for d in docs),
                 "bytes": sum(len(d.encode("utf-8", errors="surrogatepass")) for d in docs), "sha256": None}
        if n:
            entry.update(write_shard(w["out"], split, index, flat))
        record[split] = entry
    return record


def _file_sha256(path: Path) -> str | None:
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def _shards_intact(out: Path, record: dict) -> bool:
    """Whether a finished chunk's shards are still the regular files it wrote (a link is redone: replaced)."""
    return all(record[s]["file"] is None or (_is_regular(out / record[s]["file"])
                                             and _file_sha256(out / record[s]["file"]) == record[s]["sha256"])
               for s in SPLITS)


def _is_regular(path: Path) -> bool:
    """A regular file itself: not a link (which zoo would write through), a directory or a FIFO (which blocks)."""
    return path.is_file() and not path.is_symlink()


# ----------------------------------------------------------------------------------------------
# The whole run


def describe_source(sources: list[str], dataset: str | None, dataset_config: str | None, split: str,
                    data_files: list[str], text_field: str, sample_by: str) -> dict:
    if sample_by not in SAMPLE_BY:
        raise DataError(f"--sample-by: unknown '{sample_by}'; valid: {', '.join(SAMPLE_BY)}")
    if dataset:
        if sources:
            raise DataError("sources: give files or --dataset, not both")
        return {"dataset": dataset, "config": dataset_config, "split": split, "data_files": list(data_files),
                "text_field": text_field}
    if not sources:
        raise DataError("sources: name text or JSONL files (globs work), or a Hugging Face --dataset")
    files = [{"path": str(p), "bytes": p.stat().st_size} for p in expand_sources(sources)]
    whole = len(files) == 1 and sample_by == "document" and not _is_jsonl(Path(files[0]["path"]))
    return {"files": files, "text_field": text_field, "sample_by": sample_by,
            "holdout": "tail" if whole else "hash"}


def _claim(out: Path) -> int:
    """Lock the output directory (one zoo-prepare at a time); returns the lock's descriptor (see _release)."""
    import fcntl

    if out.exists() and not out.is_dir():
        raise DataError(f"--out: '{out}' is a file; give a directory (new, empty, or an earlier "
                        f"{command('prepare')}'s --out)")
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    try:  # O_NOFOLLOW: a link named like the lock is refused, never written through
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as e:
        what = "is a link" if path.is_symlink() else f"cannot be created ({e.strerror})"
        raise DataError(f"--out: '{path}' {what}; {command('prepare')} locks '{out}' with a regular file "
                        "of its own "
                        "there") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataError(f"--out: '{out}' is being prepared by another running "
                        f"{command('prepare')}") from None
    if not _same_file(fd, path):  # the previous holder removed it between our open and our lock: take it anew
        os.close(fd)
        return _claim(out)
    return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _release(fd: int, out: Path) -> None:
    """Remove the lock file, then unlock: the directory holds only the corpus once zoo-prepare ends. Removing it
    while held is safe: a zoo-prepare that opened it meanwhile finds it is no longer the file at LOCK (_claim)."""
    try:
        if _same_file(fd, out / LOCK):
            (out / LOCK).unlink(missing_ok=True)
    except OSError:  # a directory that became read-only: the lock file stays, harmless (the next run reuses it)
        pass
    os.close(fd)


# the temp files an interrupted zoo-prepare leaves (zoo.io.atomic_write's, of the names it writes)
_OWN_TEMP = re.compile(r"^\.(manifest\.json|(train|val)_\d{6}\.bin)\.[A-Za-z0-9_]{8}\.tmp$")


def _previous(out: Path, plan: dict) -> dict | None:
    """The manifest of an earlier run of this same plan (to resume), None for an empty directory; another
    corpus is refused. Then, the directory being zoo-prepare's, an interrupted run's temp files are removed."""
    manifest = _read_previous(out, plan)
    remove_temp_files(out)
    return manifest


def _read_previous(out: Path, plan: dict) -> dict | None:
    file = out / MANIFEST
    if file.is_symlink() or (file.exists() and not file.is_file()):
        raise DataError(f"--out: '{file}' is not a regular file; delete it, or choose another --out")
    if not file.is_file():
        others = [p.name for p in out.iterdir() if p.name != LOCK and not _OWN_TEMP.match(p.name)]
        if others:
            raise DataError(f"--out: '{out}' is not empty and holds no {MANIFEST} (e.g. '{others[0]}'); "
                            "choose an empty or new directory")
        return None
    try:
        manifest = read_json(file)
    except (OSError, ValueError):  # FileFormatError: too large, too deep, not JSON
        raise DataError(f"--out: '{file}' is damaged; delete '{out}' and prepare again") from None
    if manifest.get("format") != FORMAT or manifest.get("plan") != plan:
        old = manifest.get("plan", {})
        raise DataError(f"--out: '{out}' holds another corpus (tokenizer {old.get('tokenizer')!r}, other sources or "
                        "settings); choose another --out, or delete it to prepare this one there")
    return manifest


def prepare(sources: list[str], out: str | os.PathLike, tokenizer: str = "byte", *, vocab_size: int = 8192,
            bpe_sample_mb: float = 100.0, val_fraction: float | None = None, shard_mb: float = 64.0,
            workers: int | None = None, text_field: str = "text", sample_by: str = "document",
            dataset: str | None = None, dataset_config: str | None = None, split: str = "train",
            data_files: list[str] = (), progress: bool = True) -> dict:
    """Prepare (or finish preparing) a corpus in `out`; returns the manifest and the run's throughput.
    val_fraction None: the split rule's default (VAL_FRACTION)."""
    if val_fraction is not None and not 0.0 < val_fraction < 1.0:
        raise DataError(f"--val-fraction: must be between 0 and 1 (exclusive), got {val_fraction}")
    if not shard_mb > 0:
        raise DataError(f"--shard-mb: must be positive, got {shard_mb}")
    if not bpe_sample_mb > 0:
        raise DataError(f"--bpe-sample-mb: must be positive, got {bpe_sample_mb}")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise DataError(f"--workers: must be a positive integer, got {workers}")
    if tokenizer not in ("char", "byte", "bpe") and not (tokenizer.startswith(HF_PREFIX) and tokenizer != HF_PREFIX):
        raise DataError(f"--tokenizer: unknown '{tokenizer}'; valid: char, byte, bpe, hf:<name or directory>")
    if tokenizer.startswith(HF_PREFIX) and Path(tokenizer.removeprefix(HF_PREFIX)).expanduser().is_dir():
        tokenizer = HF_PREFIX + str(Path(tokenizer.removeprefix(HF_PREFIX)).expanduser().resolve())  # a local dir
    source = describe_source(list(sources), dataset, dataset_config, split, list(data_files), text_field, sample_by)
    if val_fraction is None:
        val_fraction = VAL_FRACTION[source.get("holdout", "hash")]
    plan = {"source": source, "tokenizer": tokenizer, "val_fraction": val_fraction, "shard_mb": shard_mb}
    if tokenizer == "bpe":
        plan.update(vocab_size=vocab_size, bpe_sample_mb=bpe_sample_mb)
    out = Path(out).expanduser().resolve()
    created = not out.exists()
    try:
        lock = _claim(out)
        try:
            return _run(out, plan, source, workers, progress)
        finally:
            _release(lock, out)
    except DataError:
        if created and out.is_dir() and not any(out.iterdir()):  # a failed first try leaves no directory either
            out.rmdir()
        raise
    except OSError as e:  # a full disk, a read-only file system, no permission: one line, finished shards kept
        where = f"'{e.filename}'" if e.filename else f"in '{out}'"
        raise DataError(f"--out: cannot write {where} ({e.strerror or e}); finished shards are kept: fix that "
                        "and rerun the same command") from None


def _run(out: Path, plan: dict, source: dict, workers: int, progress: bool) -> dict:
    previous = _previous(out, plan)
    try:
        return _write(out, plan, source, workers, progress, previous)
    except DataError:  # the input, not the machine: a retry with other flags must not find this corpus in its way
        if previous is None:
            _discard(out)
        raise


_OWN_FILE = re.compile(rf"^({re.escape(MANIFEST)}|(train|val)_\d{{6}}\.bin)$")


def _discard(out: Path) -> None:
    """Remove the manifest and shards a failed run wrote (a link among them goes, never what it points to)."""
    for path in out.iterdir():
        if _OWN_FILE.match(path.name) and (path.is_symlink() or path.is_file()):
            path.unlink()
    remove_temp_files(out)


def _write(out: Path, plan: dict, source: dict, workers: int, progress: bool, previous: dict | None) -> dict:
    t0 = time.perf_counter()
    if previous is not None:  # the tokenizer is fixed by the first run: reuse it, never refit
        tok = tokenizer_from_state(previous["tokenizer"])
        if previous.get("complete") and all(_shards_intact(out, r) for r in previous["shards"]):
            return {"manifest": previous, "seconds": 0.0, "fit_seconds": 0.0, "bytes": 0, "tokens": 0,
                    "skipped": len(previous["shards"])}  # nothing to do: already prepared, files intact
    else:
        tok = fit_tokenizer(plan["tokenizer"], source, plan.get("vocab_size", 0), plan.get("bpe_sample_mb", 0),
                            plan["val_fraction"])
    dtype = dtype_for(tok.vocab_size)
    manifest = {"format": FORMAT, "complete": False, "plan": plan, "tokenizer": tok.state_dict(),
                "vocab_size": tok.vocab_size, "dtype": dtype, "eot_id": tok.eot_id, "splits": {}, "shards": []}
    done = {r["index"]: r for r in (previous or {}).get("shards", [])}
    atomic_write_json(out / MANIFEST, {**manifest, "shards": [done[k] for k in sorted(done)]})
    fit_s = time.perf_counter() - t0

    from tqdm import tqdm

    total = None if "dataset" in source or any(f["path"].endswith(".gz") for f in source["files"]) \
        else sum(f["bytes"] for f in source["files"])
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="zoo-prepare", file=sys.stderr, disable=not progress,
               dynamic_ncols=True)
    records: dict[int, dict] = {}
    stats = {"bytes": 0, "tokens": 0, "skipped": 0}
    t1 = time.perf_counter()

    def finish(record: dict) -> None:
        records[record["index"]] = record
        size = sum(record[s]["bytes"] for s in SPLITS)
        stats["bytes"] += size
        stats["tokens"] += sum(record[s]["tokens"] for s in SPLITS)
        atomic_write_json(out / MANIFEST, {**manifest, "shards": [records[k] for k in sorted(records)]})
        bar.update(size)
        bar.set_postfix_str(f"{stats['tokens'] / max(time.perf_counter() - t1, 1e-9) / 1e6:.2f}M tok/s", refresh=False)

    pool = None
    if workers > 1:  # spawn, not fork: a fork of a process whose Rust tokenizer threads ran can deadlock
        pool = multiprocessing.get_context("spawn").Pool(
            workers, _init_worker, (manifest["tokenizer"], str(out), dtype, plan["val_fraction"]))
    else:
        _WORKER.update(tok=tok, out=out, dtype=np.dtype(dtype), val_fraction=plan["val_fraction"])
    pending: collections.deque = collections.deque()
    try:
        for index, (chunk, text_hash) in enumerate(chunks(labelled(source, plan["val_fraction"]),
                                                          int(plan["shard_mb"] * 1e6))):
            old = done.get(index)
            if old is not None and old["text_sha256"] == text_hash and _shards_intact(out, old):
                records[index] = old  # finished by an earlier run
                stats["skipped"] += 1
                bar.update(sum(old[s]["bytes"] for s in SPLITS))
                continue
            if pool is None:
                finish(_process_chunk(index, chunk, text_hash))
                continue
            pending.append(pool.apply_async(_process_chunk, (index, chunk, text_hash)))
            while len(pending) >= 2 * workers:  # bounded: memory does not grow with the corpus
                finish(pending.popleft().get())
        while pending:
            finish(pending.popleft().get())
    except BaseException:
        if pool is not None:  # a shard half written stays a temp file, which the next run removes
            pool.terminate()
        raise
    else:  # the bar counts documents' text, its total the files' bytes (with separators and blank lines): fill it
        bar.update(max(0, (bar.total or 0) - bar.n))
    finally:
        bar.close()
    if pool is not None:
        pool.close()
        pool.join()
    encode_s = time.perf_counter() - t1
    shards = [records[k] for k in sorted(records)]
    splits = {s: {k: sum(r[s][k] for r in shards) for k in ("tokens", "documents", "characters", "bytes")}
              for s in SPLITS}
    for s, name in (("train", "training"), ("val", "validation")):
        if not splits[s]["tokens"]:
            raise split_error(name, splits["train"]["documents"] + splits["val"]["documents"], source)
    manifest.update(complete=True, splits=splits, shards=shards)
    atomic_write_json(out / MANIFEST, manifest)
    return {"manifest": manifest, "seconds": encode_s, "fit_seconds": fit_s, **stats}


# ----------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser("prepare", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                      epilog=f"Then train on it: {command('train')} data=tokens data.path=OUT")
    p.add_argument("sources", nargs="*", help="text or JSONL files (.jsonl/.json, one document a line), or globs; "
                   ".gz files are read compressed")
    p.add_argument("--out", required=True, help="the directory to write (empty, new, or an earlier run to resume)")
    p.add_argument("--tokenizer", default="byte", help="char, byte, bpe, or hf:<Hugging Face name or directory> "
                   "(default byte)")
    p.add_argument("--vocab-size", type=int, default=8192, help="bpe: the vocabulary size (default 8192)")
    p.add_argument("--bpe-sample-mb", type=float, default=100.0,
                   help="bpe: train on the first this many MB of training documents (default 100)")
    p.add_argument("--text-field", default="text", help="JSONL / dataset field holding the text (default text)")
    p.add_argument("--sample-by", default="document", metavar="{document,paragraph,line}",
                   help="what one document is in a text file: the whole file (default), a paragraph (blank-line "
                   "separated) or a line; documents are split into training and validation by a hash of their text, "
                   "except one file taken whole, whose last --val-fraction is validation")
    p.add_argument("--dataset", default=None, help="a Hugging Face dataset by name, streamed (offline: 'text' or "
                   "'json' with --data-files)")
    p.add_argument("--dataset-config", default=None, help="the dataset's configuration name")
    p.add_argument("--split", default="train", help="the dataset's split to read (default train)")
    p.add_argument("--data-files", action="append", default=[], help="files for --dataset text/json (repeatable)")
    p.add_argument("--val-fraction", type=float, default=None,
                   help="fraction of documents for validation (default 0.01); for one text file taken whole, the "
                   "fraction of its text at the end (default 0.1, as data=text_file)")
    p.add_argument("--shard-mb", type=float, default=64.0, help="MB of text per shard (default 64)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a polite kill ends like Ctrl-C
    try:
        result = prepare(a.sources, a.out, a.tokenizer, vocab_size=a.vocab_size, bpe_sample_mb=a.bpe_sample_mb,
                         val_fraction=a.val_fraction, shard_mb=a.shard_mb, workers=a.workers, text_field=a.text_field,
                         sample_by=a.sample_by, dataset=a.dataset, dataset_config=a.dataset_config, split=a.split,
                         data_files=a.data_files, progress=not a.quiet)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: rerun the same command to finish (finished shards are kept)", file=sys.stderr)
        return 130
    m, secs = result["manifest"], result["seconds"]
    tr, va = m["splits"]["train"], m["splits"]["val"]
    rate = f"; {result['bytes'] / max(secs, 1e-9) / 1e6:.1f} MB/s, {result['tokens'] / max(secs, 1e-9):,.0f} " \
        "tokens/s" if result["tokens"] else ""
    kept = f", {result['skipped']} shards kept from an earlier run" if result["skipped"] else ""
    out = Path(a.out)
    print(f"prepared {out}: {tr['tokens']:,} training tokens ({tr['documents']:,} documents), {va['tokens']:,} "
          f"validation tokens ({va['documents']:,}); vocab {m['vocab_size']:,}, {m['dtype']}{rate}{kept}\n"
          f"train on it: {command('train')} data=tokens data.path={out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
