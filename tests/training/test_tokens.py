"""data=tokens: every lineage trains on a prepared corpus; batches are a function of (seed, step), exact resume,
distinct batches per DDP rank; text_file and hf refuse corpora past the in-memory threshold."""

import csv
import json
from pathlib import Path

import pytest
import torch

from tests.helpers import interrupt_at_batch, lineages, save_pretrained_tokenizer, write_corpus
from zoo.data import DataError
from zoo.prepare import prepare
from zoo.training.data import StepLoader, build_data
from zoo.training.objectives import OBJECTIVE


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    """The same small corpus prepared with char and with a pretrained tokenizer saved locally."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("prepared")
    files = [str(p) for p in write_corpus(root / "text")]
    tok = save_pretrained_tokenizer(root / "tokenizer")
    out = {}
    for name, spec in (("char", "char"), ("pretrained", f"hf:{tok}")):
        prepare(files, root / name, spec, sample_by="paragraph", val_fraction=0.1, shard_mb=0.005, workers=1,
                progress=False)
        out[name] = str(root / name)
    return out


def data(path: str, seed: int = 0, steps: int = 8, objective: str = "decoder_only", **cfg):
    d = build_data({"kind": "tokens", "path": path, "context": 16, "batch_size": 4, "eval_batches": 2, **cfg},
                   seed, steps)
    d.objective = OBJECTIVE.get(objective)(d.tokenizer.vocab_size)
    return d


@pytest.mark.parametrize("lineage", lineages())
def test_every_lineage_trains_on_a_pretrained_tokenizers_shards(train, corpora, lineage, capsys):
    code, run_dir = train(["data=tokens", f"data.path={corpora['pretrained']}", f"model={lineage}", "logger=none",
                           "sample.max_new_tokens=8"])
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["status"] == "completed" and s["data"]["kind"] == "tokens"
    manifest = json.loads((Path(corpora["pretrained"]) / "manifest.json").read_text())
    assert s["model"]["vocab_size"] == manifest["vocab_size"]  # the tokenizer rebuilt from the manifest
    if lineage == "decoder_only":  # bits per character from the manifest's counts; the sample decodes
        assert s["final"]["val_bpc"] > 0 and "--- sample" in capsys.readouterr().out


def test_batch_i_depends_on_seed_and_i_alone_and_ranks_differ(corpora):
    a, b = data(corpora["pretrained"]), data(corpora["pretrained"])
    first = [x["input"] for x in StepLoader(a.train_batch, 0, 6)]
    assert all(torch.equal(x, y["input"]) for x, y in zip(first, StepLoader(b.train_batch, 0, 6), strict=True))
    assert not torch.equal(first[0], next(iter(StepLoader(a.train_batch, 1, 6)))["input"])  # another seed
    resumed = StepLoader(b.train_batch, 0, 6)
    resumed.load_state_dict({"next": 4})
    rest = [x["input"] for x in resumed]
    assert len(rest) == 2 and all(torch.equal(x, y) for x, y in zip(rest, first[4:], strict=True))  # exactly
    ranks = [list(StepLoader(a.train_batch, 0, 3, rank=r, world=2)) for r in (0, 1)]
    for i in range(3):  # rank r of 2 takes batch 2i + r of the single-process order: all distinct
        assert not torch.equal(ranks[0][i]["input"], ranks[1][i]["input"])
        assert torch.equal(ranks[0][i]["input"], first[2 * i]) and torch.equal(ranks[1][i]["input"], first[2 * i + 1])
    # the validation windows are fixed: the same whatever the seed
    assert all(torch.equal(x, y) for x, y in zip(a.val_windows, data(corpora["pretrained"], seed=5).val_windows,
                                                 strict=True))


@pytest.mark.parametrize("lineage", ["encoder_only", "encoder_decoder"])
def test_masked_and_span_corruption_batches_come_from_the_shards(corpora, lineage):
    d = data(corpora["pretrained"], objective=lineage)
    batch = d.train_batch(torch.Generator().manual_seed(0))
    assert batch["input"].shape[0] == 4 and int(batch["target"].max()) < d.tokenizer.vocab_size


def test_interrupted_run_resumes_exactly(train, corpora, monkeypatch):
    """SIGINT while batch 3 is drawn: the run saves last.ckpt and stops; resumed, it equals an uninterrupted run."""
    over = ["data=tokens", f"data.path={corpora['char']}", "trainer.max_steps=8", "model.dropout=0.1",
            "trainer.deterministic=true"]
    code, full = train(over, name="full")
    assert code == 0
    from zoo.training import data as data_module

    interrupt_at_batch(monkeypatch, data_module.TokenData)
    code, part = train(over, name="part")
    assert code == 130 and json.loads((part / "summary.json").read_text())["status"] == "interrupted"
    monkeypatch.undo()
    code, part = train(over + ["ckpt_path=last"], name="part")
    assert code == 0
    a, b = (json.loads((d / "summary.json").read_text()) for d in (full, part))
    assert b["steps"] == a["steps"] == 8 and b["final"]["val_loss"] == pytest.approx(a["final"]["val_loss"], abs=1e-6)

    def val_by_step(run_dir):
        with (run_dir / "metrics.csv").open() as f:
            return {int(r["step"]): float(r["val_loss"]) for r in csv.DictReader(f) if r.get("val_loss")}

    full_vals, part_vals = val_by_step(full), val_by_step(part)
    assert [part_vals[k] for k in sorted(full_vals)] == pytest.approx([full_vals[k] for k in sorted(full_vals)],
                                                                      abs=1e-6)


def test_a_missing_or_unfinished_corpus_is_one_line(tmp_path, corpora):
    with pytest.raises(DataError, match=r"^data.path: '.*' has no manifest.json; make a prepared corpus with "
                                        r"python -m zoo.prepare"):
        data(str(tmp_path))
    part = tmp_path / "part"
    part.mkdir()
    m = json.loads((Path(corpora["char"]) / "manifest.json").read_text())
    (part / "manifest.json").write_text(json.dumps({**m, "complete": False}))
    with pytest.raises(DataError, match=r"only partly prepared; rerun the python -m zoo.prepare command to finish it$"):
        data(str(part))
    (part / "manifest.json").write_text(json.dumps(m))  # complete, but its shards are elsewhere
    with pytest.raises(DataError, match=r"^data.path: shard '.*train_000000.bin' is missing; rerun "
                                        r"python -m zoo.prepare"):
        data(str(part))


def test_text_file_and_hf_past_the_threshold_say_to_prepare(tmp_path, monkeypatch):
    from zoo.data import corpus

    path = tmp_path / "big.txt"
    path.write_text("to be or not to be\n" * 200)
    monkeypatch.setattr(corpus, "MAX_TEXT_BYTES", 1000)
    with pytest.raises(DataError, match=r"^data.path: '.*big.txt' is 0 MB, more than the 0 MB a run reads into "
                                        r"memory; prepare it once with `python -m zoo.prepare .*big.txt --out "
                                        r"corpus.tokens` "
                                        r"and train with data=tokens data.path=corpus.tokens$"):
        build_data({"kind": "text", "path": str(path), "context": 16, "batch_size": 4}, 0, 4)
    pytest.importorskip("datasets")
    with pytest.raises(DataError, match=r"^data.dataset: 'text' is .* `python -m zoo.prepare --dataset text "
                                        r"--data-files "):
        build_data({"kind": "hf", "dataset": "text", "load_kwargs": {"data_files": str(path)}, "context": 16,
                    "batch_size": 4}, 0, 4)


def test_the_data_fingerprint_names_what_a_run_trained_on(corpora, tmp_path):
    """A prepared corpus by its manifest (which lists each shard's sha256), a task by the examples its settings
    generate, a text by its bytes: equal data, equal fingerprints; other data, another."""
    import hashlib

    from tests.helpers import compose_cfg

    char, pretrained = data(corpora["char"]).fingerprint, data(corpora["pretrained"]).fingerprint
    manifest = json.loads((Path(corpora["char"]) / "manifest.json").read_text())
    assert char == {"source": f"data.path '{corpora['char']}' (its manifest.json)",
                    "sha256": hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()}
    assert pretrained["sha256"] != char["sha256"] and data(corpora["char"], seed=1).fingerprint == char

    def task(*over: str) -> dict:
        cfg = compose_cfg(["data=copy", "data.n_train=50", "data.n_val=8", "data.n_test=8", *over])
        return build_data(dict(cfg.data), 0, 4).fingerprint

    assert task() == task() and task()["source"] == "data.task 'copy'"
    assert task("data.seed=1")["sha256"] != task()["sha256"] != task("data.n_train=51")["sha256"]
    text = tmp_path / "a.txt"
    text.write_text("abc def\n" * 400)
    fp = build_data({"kind": "text", "path": str(text), "context": 16, "batch_size": 4}, 0, 4).fingerprint
    assert fp == {"source": f"data.path '{text}'", "sha256": hashlib.sha256(text.read_bytes()).hexdigest()}
