"""python -m zoo.eval: its loss on a checkpoint is the run's own val_loss; on hf: it is Hugging Face's own loss."""

import json
import math

import pytest
import torch

from tests.helpers import TINY, compose_cfg, save_pretrained_tokenizer
from zoo.eval import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from zoo.training import run

    out = tmp_path_factory.mktemp("eval") / "run"
    assert run(compose_cfg(TINY + ["logger=none", "sample.max_new_tokens=0"]), run_dir=out) == 0
    return out


def test_sampling_from_a_checkpoint_does_not_import_lightning(run_dir):
    """python -m zoo.sample reads the checkpoint and samples without Lightning's seconds of import (zoo.eval
    still imports it, for its data modules), nor torch._dynamo's 1-1.6 s (nothing compiles: neither zoo's
    softmax nor building the model on the meta device to check the weights' shapes may import it)."""
    import subprocess
    import sys

    code = ("import runpy, sys\n"
            f"sys.argv = ['zoo.sample', {str(run_dir / 'checkpoints' / 'last.ckpt')!r}, '--max-new-tokens', '5']\n"
            "try:\n"
            "    runpy.run_module('zoo.sample', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "print('lightning imported:', any(m.split('.')[0] in ('lightning', 'pytorch_lightning')\n"
            "                                 for m in sys.modules))\n"
            "print('torch._dynamo imported:', 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True)
    assert out.stdout.strip().endswith("lightning imported: False\ntorch._dynamo imported: False"), \
        out.stdout + out.stderr


def eval_json(capsys, argv: list[str]) -> dict:
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_loss_on_a_checkpoint_is_its_runs_final_val_loss(run_dir, capsys):
    summary = json.loads((run_dir / "summary.json").read_text())
    r = eval_json(capsys, [str(run_dir / "checkpoints" / "last.ckpt")])
    assert r["windows"] == 2 * 4 and r["tokens"] == 2 * 4 * 16  # data.eval_batches x batch_size windows of context
    assert r["loss"] == pytest.approx(summary["final"]["val_loss"], abs=1e-4)
    assert r["perplexity"] == pytest.approx(math.exp(r["loss"]))
    # the embedded corpus is almost all ASCII: a character is a byte, a char token is a character
    assert r["bits_per_byte"] == pytest.approx(r["loss"] * r["tokens"] / (r["bytes"] * math.log(2)))
    assert r["bits_per_char"] == pytest.approx(r["loss"] / math.log(2), rel=1e-3)
    assert r["bits_per_byte"] <= r["bits_per_char"]


def test_max_windows_and_train_split_and_data_override(run_dir, capsys, tmp_path):
    ckpt = str(run_dir / "checkpoints" / "last.ckpt")
    first = eval_json(capsys, [ckpt, "--max-windows", "3"])
    assert first["windows"] == 3 and first["tokens"] == 3 * 16
    train = eval_json(capsys, [ckpt, "--split", "train", "--max-windows", "3"])
    assert train["split"] == "train" and train["loss"] != first["loss"]
    text = tmp_path / "t.txt"
    text.write_text("To be, or not to be, that is the question. " * 40)
    other = eval_json(capsys, [ckpt, "data=text_file", f"data.path={text}", "data.context=8"])
    assert other["context"] == 8 and other["data"] == str(text)
    assert main([ckpt, "--max-windows", "2"]) == 0
    out = capsys.readouterr().out
    assert "perplexity" in out and "bits per byte" in out


def test_hf_loss_equals_hugging_faces_own(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from zoo.data import load_default_corpus, split_text
    from zoo.training.data import VAL_SEED, TokenSplit, generator

    d = save_pretrained_tokenizer(tmp_path / "gpt2")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=400, n_positions=32, n_embd=32, n_layer=2,
                                                              n_head=4)).eval()
    hf.save_pretrained(str(d))
    assert eval_json(capsys, [f"hf:{d}", "--max-windows", "1"])["context"] == 32  # by default the model's max_seq_len
    # context 16: HF's labels=input_ids scores 16 next tokens of each 17-token window, inside its 32 positions
    r = eval_json(capsys, [f"hf:{d}", "data.eval_batches=2", "data.batch_size=3", "data.context=16"])
    assert r["context"] == 16 and r["windows"] == 6
    # Hugging Face's loss on the same windows, tokenized by the same tokenizer, ids unshifted
    val = split_text(load_default_corpus(), 0.1)[1]
    ids = torch.tensor(AutoTokenizer.from_pretrained(str(d))(val, verbose=False)["input_ids"]).numpy()
    g = generator(VAL_SEED, "val", 0)
    windows = torch.cat([TokenSplit([ids]).windows(g, 3, 16) for _ in range(2)])
    with torch.no_grad():
        loss = hf(windows, labels=windows).loss.item()  # HF shifts the labels itself
    assert r["loss"] == pytest.approx(loss, abs=1e-4)


def test_one_line_errors(run_dir, tmp_path, capsys):
    ckpt = str(run_dir / "checkpoints" / "last.ckpt")
    cases = [([str(tmp_path / "missing.ckpt")], "no such file"),
             ([ckpt, "data.nope=1"], "data.nope: unknown data option; valid: batch_size, context"),
             ([ckpt, "model.d_model=8"], "not a data override"),
             ([ckpt, "--split", "test"], "valid: val, train"),
             ([ckpt, "data.context=64"], "max_seq_len=16"),  # TINY's context 16 sized the learned positions
             ([ckpt, "data=copy"], "not running text")]
    for argv, part in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert part in err and "\n" not in err and err.startswith("error: "), (argv, err)


def test_a_model_that_is_not_a_next_token_lm_is_refused(tmp_path, capsys):
    from zoo.training import run

    assert run(compose_cfg(TINY + ["model=encoder_only", "logger=none", "trainer.max_steps=1",
                                   "sample.max_new_tokens=0"]), run_dir=tmp_path / "r") == 0
    assert main([str(tmp_path / "r" / "checkpoints" / "last.ckpt")]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a next-token LM" in err and "\n" not in err


def test_a_prepared_corpus_gives_the_runs_val_loss_and_bytes_from_its_manifest(run_dir, tmp_path, capsys):
    from tests.helpers import write_corpus
    from zoo.data.tokens import read_manifest
    from zoo.prepare import prepare
    from zoo.training import run

    corpus = tmp_path / "c.tokens"
    prepare([str(p) for p in write_corpus(tmp_path / "text", n_files=2)], corpus, "char", sample_by="paragraph",
            val_fraction=0.1, shard_mb=0.005, workers=1, progress=False)
    over = ["data=tokens", f"data.path={corpus}", "logger=none", "sample.max_new_tokens=0"]
    assert run(compose_cfg(TINY + over), run_dir=tmp_path / "r") == 0
    capsys.readouterr()  # the run's own output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    r = eval_json(capsys, [str(tmp_path / "r" / "checkpoints" / "last.ckpt")])
    assert r["loss"] == pytest.approx(summary["final"]["val_loss"], abs=1e-4)
    val = read_manifest(str(corpus))["splits"]["val"]  # each document's end-of-text id counts as one byte
    assert r["bytes"] == pytest.approx(r["tokens"] * (val["bytes"] + val["documents"]) / val["tokens"])
    assert r["bits_per_byte"] == pytest.approx(r["loss"] * r["tokens"] / (r["bytes"] * math.log(2)))
    # a model whose tokenizer did not write these shards cannot read their ids
    assert main([str(run_dir / "checkpoints" / "last.ckpt"), "data=tokens", f"data.path={corpus}"]) == 2
    assert "tokenized with another tokenizer" in capsys.readouterr().err


def test_no_arguments_names_only_the_required_one(capsys):
    from zoo.eval import main

    with pytest.raises(SystemExit) as e:
        main([])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err == "error: the following arguments are required: model; see python -m zoo.eval --help\n"
