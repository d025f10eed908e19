"""zoo.prepare: a corpus tokenized once into shards; split by document, smallest dtype, resumable byte for byte."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import save_pretrained_tokenizer, write_corpus
from zoo.data import EOS_ID, N_SPECIAL, DataError
from zoo.data.tokenizers import build_tokenizer, tokenizer_from_state
from zoo.data.tokens import dtype_for, open_shards, read_manifest
from zoo.prepare import documents, is_validation, main, prepare

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[Path]:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    return save_pretrained_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def files_of(directory: Path) -> dict[str, bytes]:
    """Every file a run leaves (the lock file aside), by name."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".zoo-prepare.lock"}


def shard_documents(out: Path, split: str) -> list[list[int]]:
    """The split's token ids cut at each end-of-text id, as documents."""
    m = read_manifest(out)
    flat = np.concatenate(open_shards(out, m, split)).tolist()
    docs, cur = [], []
    for i in flat:
        if i == m["eot_id"]:
            docs.append(cur)
            cur = []
        else:
            cur.append(i)
    assert not cur  # every document ends with the end-of-text id
    return docs


@pytest.mark.parametrize("spec", ["char", "pretrained"])
def test_shards_hold_every_document_split_by_document(corpus, pretrained, tmp_path, spec):
    tokenizer = f"hf:{pretrained}" if spec == "pretrained" else spec
    out = tmp_path / "out"
    prepare([str(corpus[0].parent / "*.txt")], out, tokenizer, sample_by="paragraph", val_fraction=0.1,
            shard_mb=0.008, workers=1, progress=False)
    m = read_manifest(out)
    tok = tokenizer_from_state(m["tokenizer"])
    docs = list(documents(m["plan"]["source"]))
    assert len(docs) == 240 and m["plan"]["source"]["files"][0]["path"] == str(corpus[0].resolve())
    val = [d for d in docs if is_validation(d, 0.1)]
    train = [d for d in docs if not is_validation(d, 0.1)]
    assert 10 <= len(val) <= 45  # about a tenth, whole documents
    for split, expected in (("train", train), ("val", val)):
        got = shard_documents(out, split)
        assert [tok.decode(ids) for ids in got] == expected  # every document, in order, nothing else
        assert m["splits"][split]["documents"] == len(expected)
        assert m["splits"][split]["tokens"] == sum(len(ids) + 1 for ids in got)
    assert len(m["shards"]) >= 3 and m["dtype"] == "uint16" and m["vocab_size"] == tok.vocab_size
    for shard in m["shards"]:  # the checksums are those of the files
        for split in ("train", "val"):
            if shard[split]["file"]:
                data = (out / shard[split]["file"]).read_bytes()
                assert hashlib.sha256(data).hexdigest() == shard[split]["sha256"]
                assert len(data) == 2 * shard[split]["tokens"]
    if spec == "pretrained":  # its own end-of-text token, shifted past zoo's specials like every id
        assert m["eot_id"] == N_SPECIAL + 0 and m["tokenizer"]["source"] == str(pretrained)
        from transformers import AutoTokenizer

        reference = AutoTokenizer.from_pretrained(str(pretrained))
        assert shard_documents(out, "train")[0] == [N_SPECIAL + i for i in reference.encode(train[0])]
    else:
        assert m["eot_id"] == EOS_ID  # zoo's <eos>: char, byte and bpe have no other end-of-text


def test_dtype_is_the_smallest_that_holds_the_vocabulary(tmp_path):
    assert dtype_for(300) == "uint16" and dtype_for(65_536) == "uint16" and dtype_for(65_537) == "uint32"
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # a word-level vocabulary of 70,000 words: ids past 65,535 must survive the round trip
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(70_000)}}
    word = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=word, unk_token="[UNK]").save_pretrained(str(tmp_path / "words"))
    text = tmp_path / "words.jsonl"
    text.write_text("".join(json.dumps({"body": f"w{i} w69999 w{i * 7 % 70_000}"}) + "\n" for i in range(300)))
    prepare([str(text)], tmp_path / "out", f"hf:{tmp_path / 'words'}", text_field="body", val_fraction=0.2,
            workers=1, progress=False)
    m = read_manifest(tmp_path / "out")
    assert m["dtype"] == "uint32" and m["vocab_size"] == N_SPECIAL + 70_001 and m["eot_id"] == EOS_ID  # no eos
    first = shard_documents(tmp_path / "out", "train")[0]
    assert first[1] == N_SPECIAL + 70_000 and (tmp_path / "out" / "train_000000.bin").stat().st_size % 4 == 0


def test_workers_do_not_change_the_output(corpus, tmp_path):
    runs = {}
    for workers in (1, 2):
        prepare([str(p) for p in corpus], tmp_path / str(workers), "byte", sample_by="paragraph", val_fraction=0.1,
                shard_mb=0.01, workers=workers, progress=False)
        runs[workers] = files_of(tmp_path / str(workers))
    assert runs[1] == runs[2] and len(runs[1]) > 5


def test_bpe_is_trained_on_a_sample_of_the_training_documents(corpus, tmp_path):
    prepare([str(p) for p in corpus], tmp_path / "out", "bpe", vocab_size=300, bpe_sample_mb=0.01,
            sample_by="paragraph", val_fraction=0.1, workers=1, progress=False)
    m = read_manifest(tmp_path / "out")
    tok = tokenizer_from_state(m["tokenizer"])
    assert m["plan"]["vocab_size"] == 300 and tok.vocab_size <= 300 and m["eot_id"] == EOS_ID
    sample, size = [], 0  # what the first 10 kB of training documents train: the same tokenizer
    for d in documents(m["plan"]["source"]):
        if not is_validation(d, 0.1) and size < 10_000:
            sample.append(d)
            size += len(d)
    assert tok.state_dict() == build_tokenizer("bpe", vocab_size=300).fit("\n".join(sample)).state_dict()


def test_interrupted_then_rerun_is_byte_identical(corpus, tmp_path, monkeypatch):
    """An interruption while writing the fourth shard, a temp file left as a SIGKILL leaves it and a damaged
    shard: the rerun redoes exactly what is missing and the directory equals an uninterrupted run's."""
    import zoo.data.tokens

    args = dict(sample_by="paragraph", val_fraction=0.1, shard_mb=0.004, workers=1, progress=False)
    sources = [str(p) for p in corpus]
    prepare(sources, tmp_path / "full", "bpe", vocab_size=300, **args)
    full = files_of(tmp_path / "full")

    real = zoo.data.tokens.atomic_write  # the shard writer's

    def half_then_interrupted(f):
        f.write(b"\0" * 10)
        raise KeyboardInterrupt

    def dying(path, write, mode="w"):  # the fourth shard: half written, then the interruption
        real(path, half_then_interrupted if Path(path).name == "train_000003.bin" else write, mode)

    monkeypatch.setattr(zoo.data.tokens, "atomic_write", dying)
    with pytest.raises(KeyboardInterrupt):
        prepare(sources, tmp_path / "part", "bpe", vocab_size=300, **args)
    monkeypatch.undo()
    part = tmp_path / "part"
    manifest = json.loads((part / "manifest.json").read_text())
    assert not manifest["complete"] and len(manifest["shards"]) == 3
    (part / ".train_000005.bin.abcd1234.tmp").write_bytes(b"junk")  # what a SIGKILL mid-write leaves
    (part / "train_000001.bin").write_bytes(b"damaged")
    result = prepare(sources, part, "bpe", vocab_size=300, **args)
    assert result["skipped"] == 2  # shards 0 and 2; 1 was damaged, 3 onwards never finished
    assert files_of(part) == full


def test_killed_run_then_rerun_is_byte_identical(corpus, tmp_path):
    """SIGKILL the command while its worker processes write shards, rerun it: the same bytes as one run."""
    big = tmp_path / "big.txt"
    big.write_text("\n\n".join(p.read_text() for p in corpus) * 10)
    cmd = [sys.executable, "-m", "zoo.prepare", str(big), "--sample-by", "paragraph", "--tokenizer", "char",
           "--val-fraction", "0.1", "--shard-mb", "0.005", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd + ["--out", str(tmp_path / "full"), "--workers", "1"], check=True, env=env)
    proc = subprocess.Popen(cmd + ["--out", str(tmp_path / "part"), "--workers", "2"], env=env)
    deadline = time.time() + 120
    manifest = tmp_path / "part" / "manifest.json"
    while not (manifest.exists() and len(json.loads(manifest.read_text() or "{}").get("shards", [])) >= 3):
        assert proc.poll() is None and time.time() < deadline, "the run ended before it could be killed"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not json.loads(manifest.read_text())["complete"]
    rerun = subprocess.run(cmd + ["--out", str(tmp_path / "part"), "--workers", "2"], env=env, capture_output=True,
                           text=True)
    assert rerun.returncode == 0 and "shards kept from an earlier run" in rerun.stdout
    assert files_of(tmp_path / "part") == files_of(tmp_path / "full")


def test_jsonl_and_a_streamed_dataset_give_the_same_shards(tmp_path):
    pytest.importorskip("datasets")
    from zoo.data import load_default_corpus

    lines = [p for p in load_default_corpus().split("\n\n") if p.strip()][:200]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": i, "content": t}) + "\n" for i, t in enumerate(lines)))
    kw = dict(text_field="content", val_fraction=0.1, workers=1, progress=False)
    prepare([str(src)], tmp_path / "jsonl", "byte", **kw)
    prepare([], tmp_path / "hf", "byte", dataset="json", data_files=[str(src)], **kw)
    a, b = files_of(tmp_path / "jsonl"), files_of(tmp_path / "hf")
    assert {k: v for k, v in a.items() if k.endswith(".bin")} == {k: v for k, v in b.items() if k.endswith(".bin")}
    assert json.loads(b["manifest.json"])["plan"]["source"]["dataset"] == "json"
    with pytest.raises(DataError, match="^--text-field: 'text' not in '.*docs.jsonl' line 1; it has: id, content$"):
        prepare([str(src)], tmp_path / "bad", "byte", workers=1, progress=False)


@pytest.mark.parametrize("args, error", [
    (["{missing}"], "error: sources: no such file '{missing}'"),
    (["{corpus}/*.md"], "error: sources: '{corpus}/*.md' matches no file"),
    (["{corpus}/part0.txt", "--tokenizer", "wordpiece"],
     "error: --tokenizer: unknown 'wordpiece'; valid: char, byte, bpe, hf:<name or directory>"),
    (["{corpus}/part0.txt", "--tokenizer", "hf:/no/such/dir"],
     "error: tokenizer: 'hf:/no/such/dir': no such directory (a save_pretrained folder or a hub name)"),
    (["{corpus}/part0.txt", "--sample-by", "sentence"],
     "error: --sample-by: unknown 'sentence'; valid: document, paragraph, line"),
    (["{corpus}/part0.txt", "--val-fraction", "1.5"],
     "error: --val-fraction: must be between 0 and 1 (exclusive), got 1.5"),
    (["{one_paragraph}", "--val-fraction", "0.99"],  # one file taken whole: 1% of 55 characters is no training text
     "error: --val-fraction: the last 0.99 of '{one_paragraph}' (54 characters) leaves an empty split; use more text "
     "or another fraction"),
    (["{one_paragraph}", "--sample-by", "paragraph"],
     "error: sources: a single document, which cannot be both training and validation; split it into more with "
     "--sample-by line"),
    (["{empty}", "{blank}"], "error: sources: no text in '{empty}', '{blank}' (empty or only whitespace)"),
    (["{empty}", "--tokenizer", "char"], "error: sources: no text in '{empty}' (empty or only whitespace)"),
    (["{blank}", "--tokenizer", "bpe"], "error: sources: no text in '{blank}' (empty or only whitespace)"),
])
def test_bad_input_is_one_line(corpus, tmp_path, capsys, args, error):
    names = {"missing": str(tmp_path / "nope.txt"), "corpus": str(corpus[0].parent), "empty": str(tmp_path / "e.txt"),
             "blank": str(tmp_path / "b.txt"), "one_paragraph": str(tmp_path / "p.txt")}
    Path(names["empty"]).write_text("")
    Path(names["blank"]).write_text(" \n\n\t\n")
    Path(names["one_paragraph"]).write_text("a whole file\nof lines\nwith no blank line between them\n")
    assert main([a.format(**names) for a in args] + ["--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == error.format(**names) + "\n"


def test_one_text_file_is_split_at_the_line_where_its_last_tenth_starts(tmp_path, capsys):
    """The obvious first call, `zoo prepare input.txt --out dir`: the file is one document, split as data=text_file
    splits a text (its last 10%), the cut moved back to the start of its line."""
    text = "".join(f"line {i}: {'x' * (i % 17)}\n" for i in range(300))
    (tmp_path / "input.txt").write_text(text)
    assert main([str(tmp_path / "input.txt"), "--out", str(tmp_path / "out"), "--quiet", "--workers", "1"]) == 0
    cut = text.rfind("\n", 0, int(len(text) * 0.9)) + 1
    tok = tokenizer_from_state(read_manifest(tmp_path / "out")["tokenizer"])
    decoded = {split: [tok.decode(doc) for doc in shard_documents(tmp_path / "out", split)]
               for split in ("train", "val")}
    assert decoded == {"train": [text[:cut]], "val": [text[cut:]]}
    assert decoded["val"][0].startswith("line ") and 0.09 < len(text[cut:]) / len(text) < 0.11
    assert "2 documents" not in capsys.readouterr().out


def test_a_failed_prepare_leaves_nothing_in_the_way_of_the_next(tmp_path, capsys):
    """A split left empty fails after shards were written: they go (and the directory it made), so the retry that
    the error suggests, other flags into the same --out, runs."""
    (tmp_path / "p.txt").write_text("a whole file\nof lines\nwith no blank line between them\n" * 3)
    out = tmp_path / "out"
    args = [str(tmp_path / "p.txt"), "--out", str(out), "--quiet", "--workers", "1"]
    assert main(args + ["--sample-by", "paragraph"]) == 2
    assert "a single document" in capsys.readouterr().err and not out.exists()
    out.mkdir()  # a directory the user made first is kept, empty
    assert main(args + ["--sample-by", "paragraph"]) == 2
    assert out.is_dir() and list(out.iterdir()) == []
    assert main(args + ["--sample-by", "line", "--val-fraction", "0.3"]) == 0
    assert json.loads((out / "manifest.json").read_text())["complete"]


def test_an_output_directory_holding_something_else_is_refused(corpus, tmp_path, capsys):
    source = str(corpus[0])
    out = tmp_path / "out"
    assert main([source, "--out", str(out), "--sample-by", "paragraph", "--val-fraction", "0.2", "--quiet"]) == 0
    capsys.readouterr()
    assert main([source, "--out", str(out), "--sample-by", "paragraph", "--val-fraction", "0.2", "--quiet",
                 "--tokenizer", "char"]) == 2
    assert capsys.readouterr().err == (f"error: --out: '{out}' holds another corpus (tokenizer 'byte', other sources "
                                       "or settings); choose another --out, or delete it to prepare this one there\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    assert main([source, "--out", str(tmp_path / "notes"), "--quiet"]) == 2
    assert "holds no manifest.json (e.g. 'todo.txt')" in capsys.readouterr().err


def test_console_script_is_declared():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["zoo-prepare"] == "zoo.prepare:main"


def test_the_progress_bar_ends_at_100_percent_and_the_lock_goes(corpus, tmp_path, capsys):
    """The bar counts documents' text against the files' bytes (blank lines between paragraphs included): it is
    filled when the last chunk is done. The lock file is removed once zoo-prepare ends, however it ends."""
    out = tmp_path / "out"
    assert main([str(corpus[0]), "--out", str(out), "--sample-by", "paragraph", "--val-fraction", "0.2"]) == 0
    bar = capsys.readouterr().err.split("\r")[-1]
    done, total = re.search(r"^zoo-prepare: 100%\|█+\| (\S+)/(\S+) ", bar).groups()
    assert done == total, bar
    assert not (out / ".zoo-prepare.lock").exists()
    assert main([str(corpus[0]), "--out", str(out), "--tokenizer", "char", "--quiet"]) == 2  # refused: another corpus
    assert not (out / ".zoo-prepare.lock").exists()
