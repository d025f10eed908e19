"""Sweeps: Hydra multirun with the joblib launcher, a failing run, and budget=params."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import TINY

ROOT = Path(__file__).resolve().parents[1]


def test_joblib_multirun_with_a_failing_run_and_matched_parameters(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    cmd = [sys.executable, "train.py", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TINY,
           "logger=csv", "ffn=gelu,swiglu", "model.n_heads=2,3", "budget=params", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {tuple(sorted(o for o in s["overrides"] if o.startswith(("ffn=", "model.n_heads=")))): s
            for s in (json.loads(p.read_text()) for p in tmp_path.glob("*/summary.json"))}
    assert len(runs) == 4
    assert {k: s["status"] for k, s in runs.items()} == {
        ("ffn=gelu", "model.n_heads=2"): "completed", ("ffn=swiglu", "model.n_heads=2"): "completed",
        ("ffn=gelu", "model.n_heads=3"): "failed", ("ffn=swiglu", "model.n_heads=3"): "failed"}
    gelu, swiglu = runs["ffn=gelu", "model.n_heads=2"], runs["ffn=swiglu", "model.n_heads=2"]
    assert abs(swiglu["params"]["total"] - gelu["params"]["total"]) <= 0.01 * gelu["params"]["total"]
    from zoo.layers.ffn import default_d_ff

    assert swiglu["budget"]["d_ff"] != default_d_ff(32, gated=True)  # resized, and the summary says so
    assert swiglu["model"]["ffn"]["d_ff"] == swiglu["budget"]["d_ff"]


def test_unknown_budget_is_refused(tmp_path, capsys):
    from tests.helpers import compose_cfg
    from zoo.training import main

    assert main(compose_cfg(TINY + ["budget=flops"]), tmp_path) == 2
    assert "budget: unknown 'flops'; valid: params, null" in capsys.readouterr().err


def _train_py(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "train.py", "-m", *args, f"hydra.sweep.dir={tmp_path}"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_optuna_search_returns_each_trials_metric(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    proc = _train_py(tmp_path, "hparams_search=lr_warmup", *TINY, "logger=none", "hydra.sweeper.n_trials=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("*/summary.json")]
    assert len(summaries) == 3 and all(s["status"] == "completed" for s in summaries)
    lrs = {s["overrides"][0] for s in summaries}
    assert len(lrs) == 3  # three different trials were sampled
    from omegaconf import OmegaConf

    result = OmegaConf.load(tmp_path / "optimization_results.yaml")
    assert result.best_value == pytest.approx(min(s["final"]["val_loss"] for s in summaries))


def test_final_metric_ranks_failed_runs_last(tmp_path):
    from zoo.training import final_metric

    assert final_metric(tmp_path, "val_loss") == float("inf")  # no summary: the run crashed
    assert final_metric(tmp_path, "exact_match") == float("-inf")  # higher is better: worst is -inf
    (tmp_path / "summary.json").write_text(json.dumps({"status": "diverged", "final": {"val_loss": 9.0}}))
    assert final_metric(tmp_path, "val_loss") == float("inf")
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "final": {"val_loss": 2.5}}))
    assert final_metric(tmp_path, "val_loss") == 2.5


def test_optuna_search_survives_failing_trials(tmp_path):
    """Every trial is an invalid config (3 heads do not divide d_model 32): each fails, scores inf, and the
    search still finishes and writes its result."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    tiny = [o for o in TINY if not o.startswith("model.n_heads=")]
    proc = _train_py(tmp_path, "hparams_search=lr_warmup", *tiny, "logger=none", "hydra.sweeper.n_trials=2",
                     "model.n_heads=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = [json.loads(p.read_text())["status"] for p in tmp_path.glob("*/summary.json")]
    assert statuses == ["failed", "failed"]
    from omegaconf import OmegaConf

    assert OmegaConf.load(tmp_path / "optimization_results.yaml").best_value == float("inf")


def test_submitit_local_launcher(tmp_path):
    """The submitit launcher, run locally: the same code path a SLURM sweep takes, minus the queue."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    proc = _train_py(tmp_path, "hydra/launcher=submitit_local", *TINY, "logger=none", "ffn=gelu,swiglu")
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = [json.loads(p.read_text())["status"] for p in tmp_path.glob("*/summary.json")]
    assert statuses == ["completed", "completed"]


def test_slurm_launcher_preset_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm", "trainer=ddp", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("SlurmLauncher") and launcher["partition"] == "gpu"
    assert launcher["tasks_per_node"] == launcher["gpus_per_node"] == 2  # one task per GPU for DDP


STUDIES = {"ffn": {"ffn", "seed"}, "norm_placement": {"norm", "optim.warmup_steps", "optim.lr", "seed"},
           "position": {"position", "seed"}, "norm_type": {"norm", "seed"}, "attention": {"attention", "seed"},
           "lineage": {"model", "seed"}}


@pytest.mark.parametrize("study", STUDIES)
def test_study_presets_sweep_three_seeds(study):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"study={study}"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert set(params) == STUDIES[study] and params.seed == "0,1,2"
    assert cfg.hydra.callbacks.report._target_ == "zoo.report.ReportAfterSweep"


def test_a_study_ends_with_its_report(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    proc = _train_py(tmp_path, "study=position", *TINY, "logger=csv", "position=learned,alibi", "seed=0,1",
                     "data.long_context=32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (tmp_path / "report.md").read_text()
    lines = [" ".join(ln.split()) for ln in report.splitlines()]  # without the table's cell padding
    rows = [ln for ln in lines if ln.startswith(("| learned |", "| alibi |"))]
    assert len(rows) == 2 and all(" ± " in r and "[" in r for r in rows)  # mean ± std and a CI over 2 seeds
    long = (tmp_path / "report_val_loss_long" / "report.md").read_text()
    assert "val_loss_long" in long and (tmp_path / "report_val_loss_long" / "curves.png").is_file()
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert summary["model"]["max_seq_len"] == 32 and "val_loss_long" in summary["final"]
