"""Hostile corpora: every file a prepared corpus and zoo's data caches consist of (manifest.json, the shards,
the record of verified shards, a cached bpe tokenizer, zoo-prepare's output directory and its lock), replaced
by a link out of its directory, a directory (or the reverse), a truncated file, flipped bytes or a named pipe,
or put on a read-only or full file system. Each case ends in one line (exit code 2 from the CLIs) or, for a
cache, in one note and a run that goes on; a marker file outside is never touched."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import zygote
from tests.helpers import write_corpus
from zoo.data import DataError, cached_bpe
from zoo.data.tokens import MANIFEST, _VerifiedRecord, read_manifest
from zoo.prepare import LOCK, main, prepare
from zoo.training.data import build_data

ROOT = Path(__file__).resolve().parents[2]
USER_ENV = {k: v for k, v in os.environ.items()}  # before the fixture below: a CLI run keeps the user's cache
SECRET = b"the user's own file, outside the corpus\n"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> list[str]:
    return [str(p) for p in write_corpus(tmp_path_factory.mktemp("text"), n_files=2, paragraphs=40)]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """This test's own zoo cache (the record of verified shards)."""
    monkeypatch.setenv("ZOO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def marker(tmp_path):
    """A file outside every directory zoo is given: it must end byte-identical and unmodified."""
    path = tmp_path / "outside" / "marker.bin"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    before = path.stat().st_mtime_ns
    yield path
    assert path.read_bytes() == SECRET and path.stat().st_mtime_ns == before


def make_corpus(sources: list[str], out: Path) -> Path:
    prepare(sources, out, "byte", sample_by="paragraph", val_fraction=0.2, shard_mb=0.01, workers=1, progress=False)
    return out


@pytest.fixture
def corpus(sources, tmp_path) -> Path:
    return make_corpus(sources, tmp_path / "corpus")


def load(path: Path, verify: str = "once"):
    """What data=tokens does with a corpus before the first step: the manifest, then every shard."""
    return build_data({"kind": "tokens", "path": str(path), "context": 16, "batch_size": 2, "eval_batches": 1,
                       "verify": verify}, 0, 1)


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("data.path: ")
    return msg


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "64k"):
    """A small file system of its own at `path` (root only: else the case is skipped)."""
    path.mkdir(parents=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                           capture_output=True).returncode:
        pytest.skip("a small or read-only file system needs root and mount -t tmpfs")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def fill(fs: Path) -> None:
    """Leave no free byte on the tmpfs at `fs`."""
    with contextlib.suppress(OSError), open(fs / "filler", "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)


# ----------------------------------------------------------------------------------------------
# Reading a prepared corpus: each of its files attacked in each way


def shard(corpus: Path, split: str) -> Path:
    return corpus / read_manifest(corpus)["shards"][0][split]["file"]


def link_out(path: Path, marker: Path) -> None:
    path.unlink()
    path.symlink_to(marker)


def dir_for_file(path: Path, marker: Path) -> None:
    path.unlink()
    path.mkdir()


def truncate(path: Path, marker: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path: Path, marker: Path) -> None:
    """One byte changed: in a manifest, a digit of the first training shard's sha256 (where a change matters)."""
    data = bytearray(path.read_bytes())
    at = data.index(b'"sha256": "') + 20 if path.name == MANIFEST else len(data) // 2
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def fifo(path: Path, marker: Path) -> None:
    """A named pipe: opening it to read would wait for a writer that never comes."""
    path.unlink()
    os.mkfifo(path)


ATTACKS = {"link out": link_out, "directory": dir_for_file, "truncated": truncate, "flipped": flip, "fifo": fifo}
EXPECTED = {  # (file, attack) -> the one line, after "data.path: "
    ("manifest", "link out"): r"'.*/manifest.json' is a link to '.*/marker.bin', outside the corpus directory",
    ("manifest", "directory"): r"cannot read '.*/manifest.json': Is a directory$",
    ("manifest", "truncated"): r"cannot read '.*/manifest.json': ",
    ("manifest", "fifo"): r"'.*/manifest.json' is not a regular file; prepare the corpus again$",
    ("manifest", "flipped"): r"('.*/manifest.json' is damaged \(shards\[0\]\.train\.sha256: expected 64 hex digits\)"
                             r"|shard '.*/train_000000.bin' does not match its sha256 in manifest.json)",
    **{(s, "link out"): rf"shard '.*/{s}_000000.bin' links to '.*/marker.bin', outside the corpus directory"
       for s in ("train", "val")},
    **{(s, attack): rf"shard '.*/{s}_000000.bin' is not a regular file; rerun python -m zoo.prepare"
       for s in ("train", "val") for attack in ("directory", "fifo")},
    **{(s, "truncated"): rf"shard '.*/{s}_000000.bin' is \d+ bytes, not \d+; rerun python -m zoo.prepare"
       for s in ("train", "val")},
    **{(s, "flipped"): rf"shard '.*/{s}_000000.bin' does not match its sha256 in manifest.json \(changed or damaged"
       for s in ("train", "val")},
}


@pytest.mark.parametrize("file, attack", list(EXPECTED), ids=[f"{f}-{a}" for f, a in EXPECTED])
def test_a_damaged_corpus_file_is_refused_in_one_line(corpus, marker, file, attack):
    load(corpus)  # verified once and recorded: the attack must be noticed all the same
    target = corpus / MANIFEST if file == "manifest" else shard(corpus, file)
    ATTACKS[attack](target, marker)
    with pytest.raises(DataError) as err:
        load(corpus)
    assert re.match("data.path: " + EXPECTED[file, attack], one_line(err))


def test_a_shard_zeroed_in_place_with_its_mtime_restored_is_caught(corpus):
    load(corpus)  # verified and recorded
    file = shard(corpus, "train")
    st, size = file.stat(), file.stat().st_size
    with open(file, "r+b") as f:  # same inode, same size
        f.write(b"\0" * size)
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))  # the change of ctime is what gives it away
    assert file.stat().st_mtime_ns == st.st_mtime_ns and file.stat().st_size == size
    with pytest.raises(DataError, match="train_000000.bin' does not match its sha256"):
        load(corpus)


def test_verify_once_reads_a_shard_again_only_when_it_changed(corpus, monkeypatch):
    import zoo.data.tokens as tokens

    reads = []
    real = tokens._verify
    monkeypatch.setattr(tokens, "_verify", lambda f, named, *a: reads.append(named.name) or real(f, named, *a))
    load(corpus)
    n_shards = len(reads)
    assert n_shards == sum(1 for p in corpus.iterdir() if p.suffix == ".bin")  # every shard, once
    load(corpus)
    assert len(reads) == n_shards  # recorded: nothing read again
    shard(corpus, "val").touch()  # a new mtime: that shard alone is read again
    load(corpus)
    assert reads[n_shards:] == ["val_000000.bin"]
    load(corpus, verify="always")
    assert len(reads) == 2 * n_shards + 1
    file = shard(corpus, "train")
    file.write_bytes(b"\xff" * file.stat().st_size)
    load(corpus, verify="never")  # sizes only: the user's choice (README)
    with pytest.raises(DataError, match="verify: got 'sometimes'; valid: once, always, never"):
        load(corpus, verify="sometimes")


def _rewrite(corpus: Path, edit) -> None:
    m = json.loads((corpus / MANIFEST).read_text())
    edit(m)
    (corpus / MANIFEST).write_text(json.dumps(m))


@pytest.mark.parametrize("name", ["../outside/marker.bin", "{marker}", "sub/train_000000.bin", ".."])
def test_a_manifest_naming_a_file_outside_the_corpus_is_refused(corpus, marker, name):
    _rewrite(corpus, lambda m: m["shards"][0]["train"].update(file=name.format(marker=marker)))
    with pytest.raises(DataError) as err:
        load(corpus)
    assert one_line(err).endswith(f"is damaged (shards[0].train.file: {name.format(marker=marker)!r} is not a file "
                                  "name inside the corpus directory); prepare the corpus again")


def test_token_ids_past_the_vocabulary_are_refused_where_the_shard_opens(corpus):
    """A shard whose checksum matches a manifest that was edited with it: the range check still holds."""
    file = shard(corpus, "train")
    ids = np.fromfile(file, dtype="<u2")
    ids[7] = 300  # the byte tokenizer's vocabulary: 276 ids
    ids.tofile(file)
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    _rewrite(corpus, lambda m: m["shards"][0]["train"].update(sha256=digest))
    with pytest.raises(DataError) as err:
        load(corpus)
    assert one_line(err) == (f"data.path: shard '{file}' holds token id 300, past the vocabulary of 276 (ids 0..275); "
                             "prepare the corpus again")


def test_a_corpus_that_is_a_file_and_a_link_inside_it(corpus, marker):
    with pytest.raises(DataError) as err:
        load(marker)
    assert one_line(err).startswith(f"data.path: no prepared corpus at '{marker}' (not a directory)")
    # a shard linked to another file inside the corpus is read (the bytes are the corpus's own)
    file = shard(corpus, "val")
    file.rename(corpus / "kept.bin")
    file.symlink_to("kept.bin")
    assert len(load(corpus).val_tokens) > 0


def test_a_read_only_corpus_trains_and_its_verification_is_recorded_elsewhere(sources, tmp_path, cache):
    with tmpfs(tmp_path / "fs", "1m") as fs:
        corpus = make_corpus(sources, fs / "corpus")
        names = sorted(p.name for p in corpus.iterdir())
        read_only(fs)
        assert len(load(corpus).train_tokens) > 0
        assert sorted(p.name for p in corpus.iterdir()) == names
        assert len(list((cache / "verified").iterdir())) == 1  # the record is in the user's cache, not the corpus


# ----------------------------------------------------------------------------------------------
# What zoo writes around a corpus: the record of verified shards and the bpe cache (a failure costs a note)


@pytest.mark.parametrize("attack", ["link out", "directory", "cache is a file", "read-only", "full"])
def test_the_verification_record_is_replaced_or_skipped_never_written_through(corpus, marker, cache, attack,
                                                                              tmp_path, capsys, monkeypatch):
    record = _VerifiedRecord(corpus.resolve()).file
    monkeypatch.setattr("zoo.data.tokens._NOTED", set())  # the note is once per process and directory
    with contextlib.ExitStack() as stack:
        if attack == "link out":
            record.parent.mkdir(parents=True)
            record.symlink_to(marker)
        elif attack == "directory":
            record.mkdir(parents=True)
        elif attack == "cache is a file":
            cache.write_bytes(b"not a directory")
        else:
            fs = stack.enter_context(tmpfs(tmp_path / "fs", "16k"))
            monkeypatch.setenv("ZOO_CACHE", str(fs))
            read_only(fs) if attack == "read-only" else fill(fs)
        load(corpus)
        err = capsys.readouterr().err
        if attack == "link out":  # replaced by zoo's own regular file
            assert err == "" and not record.is_symlink() and json.loads(record.read_text())["shards"]
        else:
            assert err.count("\n") == 1 and err.startswith("note: cannot record verified shards in '")
            assert err.endswith("; they are verified again next time\n")
        assert len(load(corpus).train_tokens) > 0  # and the next run goes on as well


@pytest.mark.parametrize("attack", ["link out", "directory", "read-only", "full"])
def test_the_bpe_cache_is_replaced_or_skipped_never_written_through(tmp_path, marker, attack, capsys):
    from zoo.data import load_default_corpus

    text = load_default_corpus()[:20_000]
    path = tmp_path / "caches" / "bpe.json"
    with contextlib.ExitStack() as stack:
        if attack == "link out":
            path.parent.mkdir()
            path.symlink_to(marker)
        elif attack == "directory":
            path.mkdir(parents=True)
        else:
            stack.enter_context(tmpfs(path.parent, "16k"))
            read_only(path.parent) if attack == "read-only" else fill(path.parent)
        tok = cached_bpe(text, path, vocab_size=300)
        assert tok.decode(tok.encode("To be")) == "To be"
        err = capsys.readouterr().err
        if attack == "link out":
            assert err == "" and not path.is_symlink() and json.loads(path.read_text())["meta"]["vocab_size"] == 300
        else:
            assert err.count("\n") == 1 and err.startswith(f"warning: tokenizer cache: cannot write '{path}' (")


# ----------------------------------------------------------------------------------------------
# zoo-prepare's output directory


def test_prepare_refuses_links_where_it_writes_and_replaces_a_linked_shard(sources, tmp_path, marker, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).symlink_to(marker)
    assert main([*sources, "--out", str(out), "--quiet", "--workers", "1"]) == 2
    assert capsys.readouterr().err == (f"error: --out: '{out / LOCK}' is a link; python -m zoo.prepare locks '{out}' "
                                       "with a regular file of its own there\n")
    (out / LOCK).unlink()
    (out / MANIFEST).symlink_to(marker)
    assert main([*sources, "--out", str(out), "--quiet", "--workers", "1"]) == 2
    assert capsys.readouterr().err == (f"error: --out: '{out / MANIFEST}' is not a regular file; delete it, or "
                                       "choose another --out\n")
    (out / MANIFEST).unlink()
    args = [*sources, "--out", str(out), "--quiet", "--workers", "1", "--sample-by", "paragraph",
            "--val-fraction", "0.2", "--shard-mb", "0.01"]
    assert main(args) == 0
    link_out(out / "train_000001.bin", marker)  # a rerun redoes that shard as a file of its own
    assert main(args) == 0
    assert not (out / "train_000001.bin").is_symlink() and len(load(out).train_tokens) > 0
    assert not (out / LOCK).exists()


def _prepare_cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return zygote.run([sys.executable, "-m", "zoo.prepare", *args, "--quiet", "--workers", "1"], cwd=ROOT,
                      capture_output=True, text=True, timeout=120, **kw)


def test_prepare_cli_on_a_file_a_read_only_and_a_full_file_system(sources, tmp_path, marker):
    proc = _prepare_cli(*sources, "--out", str(marker))
    assert (proc.returncode, proc.stderr) == (2, f"error: --out: '{marker}' is a file; give a directory (new, "
                                                 "empty, or an earlier python -m zoo.prepare's --out)\n")
    with tmpfs(tmp_path / "fs", "16k") as fs:  # the corpus needs about 90 kB
        (fs / "out").mkdir()
        proc = _prepare_cli(*sources, "--out", str(fs / "out"), "--sample-by", "paragraph", "--shard-mb", "0.01")
        assert proc.returncode == 2 and proc.stdout == ""
        # the write that failed is named: a shard's (or its temp file's) path in the output directory
        full = rf"error: --out: cannot write '{re.escape(str(fs / 'out'))}/[^']+' \(No space left on device\); "
        assert re.fullmatch(full + r"finished shards are kept: fix that and rerun the same command\n", proc.stderr), \
            proc.stderr
        assert not (fs / "out" / LOCK).exists() and not [p for p in (fs / "out").iterdir() if p.suffix == ".tmp"]
        shutil.rmtree(fs / "out")
        read_only(fs)
        proc = _prepare_cli(*sources, "--out", str(fs / "out"))
        assert (proc.returncode, proc.stderr) == (2, f"error: --out: cannot write '{fs / 'out'}' (Read-only file "
                                                     "system); finished shards are kept: fix that and rerun the same "
                                                     "command\n")


def test_prepare_cli_past_a_file_size_limit(sources, tmp_path):
    """The full disk of a user without root: RLIMIT_FSIZE in the child (SIGXFSZ ignored: writes fail instead)."""
    def limit():
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    out = tmp_path / "out"
    proc = _prepare_cli(*sources, "--out", str(out), "--sample-by", "paragraph", "--shard-mb", "0.01",
                        preexec_fn=limit)
    assert proc.returncode == 2 and re.match(rf"error: --out: cannot write '{re.escape(str(out))}/[^']+' \(File too "
                                             r"large\)", proc.stderr), proc.stderr
    assert proc.stderr.count("\n") == 1


# ----------------------------------------------------------------------------------------------
# Through train.py: the run stops before its first step, exit code 2, one line


def test_train_py_refuses_a_shard_linked_out_of_the_corpus_in_one_line(corpus, marker, tmp_path):
    link_out(shard(corpus, "train"), marker)
    proc = zygote.run([sys.executable, "train.py", "data=tokens", f"data.path={corpus}", "logger=none",
                       "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "data.context=16",
                       f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                      timeout=300, env=USER_ENV)  # the user's cache: its built kernels
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr == (f"error: data.path: shard '{corpus.resolve() / 'train_000000.bin'}' links to '{marker}', "
                           f"outside the corpus directory '{corpus.resolve()}'; a corpus's shards must be inside it\n")
    assert not (tmp_path / "run" / "checkpoints").exists()
