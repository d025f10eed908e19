"""Short training runs through the real config tree: every group option, every lineage, outputs."""

import json
import math

import pytest
import torch

from tests import zygote
from tests.helpers import compose_cfg
from zoo.commands import config_dir
from zoo.config.schema import KINDS
from zoo.registry import REGISTRIES
from zoo.training.cli import _options

CONF = config_dir()

# Every option of each architecture group: the registered parts (a part needs no conf/ file: zoo.config.schema makes its
# node) and the presets in conf/ (sliding_window; the norm group's pre_ln, post_rms, ...).
GROUP_OPTIONS = [(group, option) for group in KINDS for option in _options(group, CONF)]


def test_config_groups_offer_every_registered_component():
    for group, (kind, _) in KINDS.items():
        if group != "norm":  # a norm type is chosen with its placement: norm=pre_rms, or norm.type=rmsnorm
            assert set(REGISTRIES[kind].names()) <= set(_options(group, CONF)), group
    assert {"pre_ln", "post_ln", "pre_rms", "post_rms"} <= set(_options("norm", CONF))
    options = lambda group: {p.stem for p in (CONF / group).glob("*.yaml")}
    assert {"cpu", "gpu", "ddp", "fsdp"} <= options("trainer")
    assert {"csv", "wandb", "tensorboard", "none"} <= options("logger")


def test_default_run_leaves_a_complete_run_directory(train):
    code, run_dir = train([])
    assert code == 0
    for name in ("config.yaml", "metrics.csv", "summary.json", "checkpoints/last.ckpt", "checkpoints/best.ckpt"):
        assert (run_dir / name).is_file(), name
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "completed" and s["diverged"] is False and s["steps"] == 4
    assert s["architecture"] == {"lineage": "decoder_only", "attention": "mha", "position": "learned",
                                 "norm": "layernorm", "placement": "pre", "ffn": "gelu", "window": None}
    assert s["tokens_seen"] == 4 * 4 * 16 and s["tokens_per_second"] > 0 and s["wall_time_s"] > 0
    # evaluations take time, inside the wall time; each history entry says when it ended, in order
    assert 0 < s["eval_time_s"] < s["wall_time_s"] - s["train_time_s"]
    ends = [h["wall_time_s"] for h in s["history"]]
    assert ends == sorted(ends) and 0 < ends[0] and ends[-1] <= s["wall_time_s"]
    assert s["params"]["total"] > 0 and s["flops_per_token"]["train"] > 0
    assert math.isfinite(s["final"]["val_loss"]) and s["final"]["val_bpc"] > 0
    assert s["best"]["val_loss"]["value"] <= s["final"]["val_loss"]
    resolved = (run_dir / "config.yaml").read_text()
    assert "vocab_size: 102" in resolved and "max_seq_len: 16" in resolved  # filled from the data


@pytest.mark.parametrize("group,option", GROUP_OPTIONS, ids=lambda x: str(x))
def test_every_group_option_trains(train, group, option):
    code, run_dir = train([f"{group}={option}", "logger=none", "trainer.max_steps=2"])
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["status"] == "completed" and math.isfinite(s["final"]["val_loss"])
    chosen = compose_cfg([f"{group}={option}"]).model  # what the option names: a part, or a preset of one
    key, (_, name_key) = {"model": "lineage", "norm": "placement"}.get(group, group), KINDS[group]
    expect = chosen[name_key] if group == "model" else chosen[group]["placement" if group == "norm" else name_key]
    assert s["architecture"][key] == expect


def test_norm_option_sets_placement_and_type_and_short_overrides_work():
    cfg = compose_cfg(["norm=post_rms"])
    assert (cfg.model.norm.placement, cfg.model.norm.type) == ("post", "rmsnorm")
    cfg = compose_cfg(["norm=pre_ln", "model.norm.type=rmsnorm"])
    assert (cfg.model.norm.placement, cfg.model.norm.type) == ("pre", "rmsnorm")
    from zoo.training.cli import expand  # the short form of the README: norm.type=rmsnorm

    assert expand("norm.type=rmsnorm") == "model.norm.type=rmsnorm"
    assert expand("norm=pre_ln") == "norm=pre_ln"


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_only", "encoder_decoder"])
@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_every_lineage_trains_on_tasks_and_reports_exact_match(train, lineage, task):
    code, run_dir = train([f"model={lineage}", f"data={task}", "logger=none"])
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0
    assert 0 <= s["final"]["exact_match"] <= 1 and 0 <= s["final"]["exact_match_long"] <= 1


@pytest.mark.parametrize("data", ["sort", "addition"])
def test_other_tasks(train, data):
    code, run_dir = train(["data=" + data, "logger=none", "model=encoder_decoder"])
    assert code == 0 and "exact_match" in json.loads((run_dir / "summary.json").read_text())["final"]


@pytest.mark.parametrize("experiment", ["gpt2_style", "llama_style", "bert_style", "t5_style", "transformer_base",
                                        "nanogpt_cpu"])
def test_experiment_presets(train, experiment):
    code, run_dir = train([f"experiment={experiment}", "logger=none", "model.d_model=32", "model.n_layers=1",
                           "trainer.max_steps=2", "data.context=16", "data.eval_batches=1"], tiny=False)
    assert code == 0
    s = json.loads((run_dir / "summary.json").read_text())
    expected = {"gpt2_style": ("decoder_only", "learned", "layernorm", "gelu"),
                "llama_style": ("decoder_only", "rope", "rmsnorm", "swiglu"),
                "bert_style": ("encoder_only", "learned", "layernorm", "gelu"),
                "t5_style": ("encoder_decoder", "t5", "rmsnorm", "relu"),
                "transformer_base": ("encoder_decoder", "sinusoidal", "layernorm", "relu"),
                "nanogpt_cpu": ("decoder_only", "learned", "layernorm", "gelu")}[experiment]
    a = s["architecture"]
    assert (a["lineage"], a["position"], a["norm"], a["ffn"]) == expected


def test_nanogpt_preset_is_the_recipe():
    cfg = compose_cfg(["experiment=nanogpt_cpu"])
    assert (cfg.model.n_layers, cfg.model.n_heads, cfg.model.d_model, cfg.model.dropout) == (4, 4, 128, 0.0)
    assert (cfg.data.context, cfg.data.batch_size, cfg.trainer.max_steps) == (64, 12, 2000)
    assert (cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.optim.betas[1]) == (1e-3, 1e-4, 100, 0.99)


def test_experiment_values_override_the_primary_config():
    assert compose_cfg(["experiment=transformer_base"]).optim.warmup_steps == 200  # config.yaml says 100
    assert compose_cfg(["experiment=transformer_base", "optim.warmup_steps=7"]).optim.warmup_steps == 7


def test_validation_windows_are_the_same_for_every_seed():
    from zoo.training.data import build_data
    from zoo.training.objectives import OBJECTIVE

    cfg = {"kind": "text", "path": None, "context": 32, "batch_size": 4, "eval_batches": 3, "long_context": 64}
    a, b = build_data(cfg, seed=0, steps=1), build_data(cfg, seed=1, steps=1)
    for d in (a, b):
        d.objective = OBJECTIVE.get("encoder_only")(d.tokenizer.vocab_size)  # random masking too
    for x, y in zip(a.val_batches + a.long_val_batches, b.val_batches + b.long_val_batches, strict=True):
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
    assert a.long_val_batches[0]["input"].shape == (4, 64) and a.val_batches[0]["input"].shape == (4, 32)
    assert not torch.equal(a.val_windows[0], a.val_windows[1])  # different windows, not one repeated


@pytest.mark.parametrize("tokenizer", ["char", "byte", "bpe"])
def test_text_file_with_each_tokenizer(train, tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    from zoo.data import load_default_corpus

    path = tmp_path / "my.txt"
    path.write_text(load_default_corpus()[:60_000])
    code, run_dir = train(["data=text_file", f"data.path={path}", f"data.tokenizer={tokenizer}",
                           "data.vocab_size=300", "logger=none"])
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["data"]["tokenizer"] == tokenizer
    if tokenizer == "bpe":
        assert (tmp_path / "my.txt.bpe.json").is_file()  # cached next to the data


def test_hf_dataset_from_local_files(train, tmp_path):
    pytest.importorskip("datasets")
    from zoo.data import load_default_corpus

    path = tmp_path / "lines.txt"
    path.write_text(load_default_corpus()[:40_000])
    code, run_dir = train(["data=hf", "data.dataset=text", f"+data.load_kwargs.data_files={path}", "logger=none"])
    assert code == 0 and json.loads((run_dir / "summary.json").read_text())["data"]["kind"] == "hf"


def test_resume_from_last_checkpoint(train):
    code, run_dir = train(["trainer.max_steps=4"], name="resumable")
    assert code == 0
    code, run_dir = train(["trainer.max_steps=4", "ckpt_path=last"], name="resumable")
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["steps"] == 4
    import csv

    with (run_dir / "metrics.csv").open() as f:
        val_steps = [int(r["step"]) for r in csv.DictReader(f) if r["val_loss"]]
    assert val_steps == [1, 3]  # the finished run's rows are kept, not repeated
    # A longer schedule is another run (the cosine decay depends on max_steps): refused, naming the key.
    from zoo.build import ConfigError

    with pytest.raises(ConfigError, match=r"\(trainer.max_steps: checkpoint 4, this run 8\)"):
        train(["trainer.max_steps=8", "ckpt_path=last"], name="resumable")


def test_bf16_mixed_precision(train):
    code, run_dir = train(["trainer.precision=bf16-mixed", "logger=none"])
    assert code == 0 and math.isfinite(json.loads((run_dir / "summary.json").read_text())["final"]["val_loss"])


def test_tensorboard_logger(train):
    code, run_dir = train(["logger=tensorboard"])
    assert code == 0 and list((run_dir / "tb").rglob("events.out.tfevents.*"))
    assert (run_dir / "metrics.csv").is_file()  # the CSV is always beside it


def test_logger_none_writes_no_metrics_but_a_summary(train):
    code, run_dir = train(["logger=none"])
    assert code == 0 and not (run_dir / "metrics.csv").exists() and (run_dir / "summary.json").is_file()


def test_sample_entry_point(train, capsys):
    from zoo.sample import main

    code, run_dir = train(["logger=none"])
    capsys.readouterr()
    assert main([str(run_dir / "checkpoints" / "best.ckpt"), "--prompt", "ROMEO:", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ROMEO:") and len(out.splitlines()[0]) >= len("ROMEO:")
    assert main([str(run_dir / "checkpoints" / "best.ckpt"), "--prompt", "ROMEO ☃"]) == 2
    assert "never saw: '☃'" in capsys.readouterr().err
    assert main([str(run_dir / "checkpoints" / "best.ckpt"), "--prompt", "ROMEO ☃", "--unknown", "skip",
                 "--max-new-tokens", "4"]) == 0


def test_ddp_two_processes_on_cpu(tmp_path):
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "train.py", "trainer=ddp", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
           "trainer.max_steps=4", "trainer.val_check_interval=2", "data.eval_batches=2", "data.batch_size=4",
           "data.context=16", "logger=none", f"hydra.run.dir={tmp_path}"]
    proc = zygote.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "completed" and s["steps"] == 4
    assert s["tokens_seen"] == 2 * 4 * 4 * 16  # two processes, each with its own batches


def test_history_holds_every_metric_of_each_evaluation(train):
    code, run_dir = train(["data=copy", "logger=none", "trainer.max_steps=4", "trainer.val_check_interval=2"])
    s = json.loads((run_dir / "summary.json").read_text())
    assert [h["step"] for h in s["history"]] == [2, 4]
    assert all({"val_loss", "exact_match", "exact_match_long"} <= set(h) for h in s["history"])


def test_a_finished_run_keeps_its_best_weights_alone_and_a_whole_last_checkpoint(train, capsys):
    """checkpoints=best_weights, the default: best.ckpt without the optimizer's state (two thirds of it), which
    sampling needs not; last.ckpt whole, the checkpoint a resume reads."""
    from tests.helpers import TINY
    from zoo.sample import main as sample
    from zoo.training import main
    from zoo.training.checkpoint import read_checkpoint

    code, run_dir = train([])
    best, last = run_dir / "checkpoints" / "best.ckpt", run_dir / "checkpoints" / "last.ckpt"
    assert code == 0 and sorted(p.name for p in best.parent.iterdir()) == ["best.ckpt", "last.ckpt"]
    ckpt = read_checkpoint(best)
    assert "optimizer_states" not in ckpt and ckpt["state_dict"] and ckpt["tokenizer"]
    assert read_checkpoint(last)["optimizer_states"] and best.stat().st_size < last.stat().st_size / 2
    assert sample([str(best), "--prompt", "RO", "--max-new-tokens", "4"]) == 0
    capsys.readouterr()
    assert main(compose_cfg(TINY + [f"ckpt_path={best}"]), run_dir) == 2
    assert "holds a finished run's weights alone (checkpoints=last), nothing to resume" in capsys.readouterr().err


def test_checkpoints_last_keeps_the_weights_alone_and_none_keeps_nothing(train, capsys):
    from zoo.sample import main as sample
    from zoo.training import main
    from zoo.training.checkpoint import read_checkpoint

    code, run_dir = train(["checkpoints=last"], name="last")
    assert code == 0 and sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt"]
    ckpt = read_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert "optimizer_states" not in ckpt and ckpt["state_dict"] and ckpt["tokenizer"]
    capsys.readouterr()
    assert sample([str(run_dir / "checkpoints" / "last.ckpt"), "--prompt", "RO", "--max-new-tokens", "4"]) == 0
    from tests.helpers import TINY

    assert main(compose_cfg(TINY + ["checkpoints=last", "ckpt_path=last"]), run_dir) == 2
    assert "holds a finished run's weights alone (checkpoints=last), nothing to resume" in capsys.readouterr().err
    code, run_dir = train(["checkpoints=none"], name="none")
    assert code == 0 and not list((run_dir / "checkpoints").glob("*.ckpt"))
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
