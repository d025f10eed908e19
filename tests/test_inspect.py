"""zoo.inspect: parameter breakdown, FLOPs and memory from configs, --vs, and attention-map plots."""

import sys
from pathlib import Path

import pytest
import torch

from tests import zygote
from zoo.build import build_model, count_params
from zoo.data.tokenizers import build_tokenizer
from zoo.inspect import ffn_share, inspect_config, main, merge_overrides, ordered_maps
from zoo.layers.attention import attention_maps
from zoo.registry import RESIDUAL

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
PARTS = ("embedding", "position", "attention", "ffn", "norm", "head")


@pytest.mark.parametrize("overrides", [[], ["model=encoder_only", "model.bias=false"],
                                       ["experiment=llama_style", "model.d_model=64"],
                                       ["model=encoder_decoder", "data=copy", "model.n_decoder_layers=2"]])
def test_breakdown_sums_to_total_and_matches_count_params(overrides):
    info = inspect_config(overrides)
    p = info["params"]
    assert sum(p[k] for k in PARTS) == p["total"]
    assert p == count_params(info["model"])
    assert p["total"] == sum(t.numel() for t in build_model(info["model"]).parameters())


def test_vocab_and_context_follow_the_data():
    from zoo.training.data import build_data

    for overrides in ([], ["data=copy", "model=encoder_decoder"]):
        info = inspect_config(overrides)
        data = build_data(info["config"]["data"], 0, 1)
        assert info["model"]["vocab_size"] == data.tokenizer.vocab_size  # 102 for the embedded corpus
        assert info["model"]["max_seq_len"] == info["context"] == data.required_len()
    info = inspect_config(["model.vocab_size=500", "data.context=32"])
    assert info["model"]["vocab_size"] == 500 and info["model"]["max_seq_len"] == 32


def test_ffn_is_two_thirds_of_a_block(capsys):
    info = inspect_config(["model.d_model=128", "attention=mha", "ffn=gelu", "model.bias=false"])
    d = 128
    assert info["params"]["attention"] == 4 * d * d * 4 and info["params"]["ffn"] == 8 * d * d * 4
    assert ffn_share(info["params"]) == pytest.approx(2 / 3)
    assert main(["model.d_model=128", "model.bias=false"]) == 0
    out = capsys.readouterr().out
    assert "FFN share of attention + FFN: 66.7%" in out
    for name in ("embeddings", "attention", "FFN", "norms", "head", "total", "non-embedding"):
        assert f"\n{name} " in out


def test_memory_is_four_and_two_bytes_per_parameter(capsys):
    info = inspect_config(["model.n_layers=2"])
    total = info["params"]["total"]
    assert info["bytes"] == {"float32": 4 * total, "16-bit": 2 * total}
    assert main(["model.n_layers=2"]) == 0
    out = capsys.readouterr().out
    assert f"float32 {4 * total:,} bytes" in out and f"16-bit {2 * total:,} bytes" in out
    flops = info["flops"]
    assert f"forward {flops['forward']:,}" in out and f"train {flops['train']:,}" in out
    assert flops["train"] == 3 * flops["forward"]


def test_vs_prints_both_configs_side_by_side(capsys):
    assert main(["model.bias=false", "--vs", "ffn=swiglu"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.split() == ["A", "B", "B-A"])
    assert header
    assert "model.ffn.name: gelu -> swiglu" in out and "B: model.bias=false ffn=swiglu" in out
    a, b = inspect_config(["model.bias=false"]), inspect_config(["model.bias=false", "ffn=swiglu"])
    ffn_row = next(ln for ln in lines if ln.startswith("FFN "))
    assert ffn_row.split()[1:3] == [f"{a['params']['ffn']:,}", f"{b['params']['ffn']:,}"]
    attention_row = next(ln for ln in lines if ln.startswith("attention "))
    assert attention_row.split()[-1] == "0"  # the ablation leaves attention alone
    assert merge_overrides(["ffn=gelu", "seed=1"], ["ffn=swiglu"]) == ["seed=1", "ffn=swiglu"]


def test_bad_overrides_are_one_line_errors(capsys):
    assert main(["ffn=nope"]) == 2
    assert main(["model.d_model=100", "model.n_heads=3"]) == 2
    assert main(["--text", "hello"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
    assert "valid: elu, geglu" in err[0] and "model.d_model" in err[1]


# -- attention maps ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    cmd = [sys.executable, "train.py", "trainer.max_steps=2", "model.d_model=32", "model.n_layers=1",
           "model.n_heads=2", "data.context=16", "data.eval_batches=1", "data.batch_size=4", "logger=none",
           "sample.max_new_tokens=1", f"hydra.run.dir={run_dir}"]
    out = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return run_dir / "checkpoints" / "last.ckpt"


def test_attention_png_from_a_trained_checkpoint(checkpoint, tmp_path, capsys):
    out = tmp_path / "maps" / "attn.png"
    assert main(["--attention", str(checkpoint), "--text", "To be, or not", "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
    assert str(out) in capsys.readouterr().out
    long = tmp_path / "long.png"  # longer than the 16 learned positions: truncated, no token labels
    assert main(["--attention", str(checkpoint), "--text", "x" * 40, "--out", str(long)]) == 0
    assert long.read_bytes().startswith(PNG)
    assert main(["--attention", str(tmp_path / "none.ckpt"), "--text", "hi"]) == 2


def test_encoder_decoder_maps_are_labelled(tmp_path):
    cfg = dict(name="encoder_decoder", vocab_size=None, d_model=16, n_layers=2, n_heads=2, max_seq_len=16)
    tok = build_tokenizer("char").fit("abc def")
    cfg["vocab_size"] = tok.vocab_size
    model = build_model(cfg).eval()
    tokens = torch.tensor([tok.encode("abc")])
    rows = ordered_maps(attention_maps(model, tokens, tokens))
    assert [label for label, _ in rows] == ["encoder self L0", "encoder self L1", "decoder self L0",
                                            "decoder self L1", "decoder cross L0", "decoder cross L1"]
    assert all(w.shape == (2, 3, 3) for _, w in rows)
    ckpt = {"hyper_parameters": {"cfg": {"model": cfg}}, "tokenizer": tok.state_dict(),
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}
    torch.save(ckpt, tmp_path / "ed.ckpt")
    out = tmp_path / "ed.png"
    assert main(["--attention", str(tmp_path / "ed.ckpt"), "--text", "abc", "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG) and out.stat().st_size > 5000


@pytest.mark.parametrize("placement", RESIDUAL.names())
def test_maps_are_labelled_for_every_placement(placement):
    """A parallel block holds its attention as parallel.f.attn, a sequential one as attn.f: same labels."""
    cfg = dict(name="encoder_decoder", vocab_size=11, d_model=16, n_layers=1, n_heads=2, max_seq_len=16,
               norm={"placement": placement})
    tokens = torch.tensor([[1, 2, 3]])
    rows = ordered_maps(attention_maps(build_model(cfg).eval(), tokens, tokens))
    assert [label for label, _ in rows] == ["encoder self L0", "decoder self L0", "decoder cross L0"]


# -- loss by position -----------------------------------------------------------------------------

def test_loss_by_position_matches_val_loss_long(tmp_path, capsys):
    """The per-position losses average to the run's own val_loss_long on the same windows (data.long_context)."""
    import json

    from zoo.inspect import loss_by_position

    run_dir = tmp_path / "rope"
    cmd = [sys.executable, "train.py", "position=rope", "trainer.max_steps=2", "trainer.val_check_interval=2",
           "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.context=16", "data.long_context=32",
           "data.eval_batches=2", "data.batch_size=4", "logger=none", "sample.max_new_tokens=1", "threads=1",
           f"hydra.run.dir={run_dir}"]
    out = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    result = loss_by_position(ckpt, 32, buckets=4)
    assert result["context"] == 16 and result["windows"] == 8
    assert [(a, b) for a, b, _ in result["rows"]] == [(0, 7), (8, 15), (16, 23), (24, 31)]
    mean = sum(loss for _, _, loss in result["rows"]) / 4  # equal buckets
    final = json.loads((run_dir / "summary.json").read_text())["final"]
    assert mean == pytest.approx(final["val_loss_long"], rel=1e-4)
    assert main(["--loss-by-position", str(ckpt), "--length", "32"]) == 0
    table = capsys.readouterr().out
    assert "trained with context 16" in table and "| 8-11 |" in table and "| 12-15 |" in table
    assert [ln.endswith("beyond the training context |") for ln in table.splitlines() if ln.startswith("| ")
            and "-" in ln.split("|")[1]] == [False] * 4 + [True] * 4


def test_loss_by_position_bad_input(checkpoint, tmp_path, capsys):
    for argv, message in [(["--loss-by-position", str(checkpoint), "--length", "64"],
                           "error: --length: 64 is past the learned positions' max_seq_len; valid: 2..16"),
                          (["--loss-by-position", str(checkpoint), "--length", "1"],
                           "error: --length: must be an integer >= 2, got 1"),
                          (["--length", "64"], "error: --length goes with --loss-by-position CHECKPOINT"),
                          (["--loss-by-position", str(tmp_path / "none.ckpt"), "--length", "8"], "error: ")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, err
