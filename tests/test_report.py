"""zoo.report: statistics by hand, hand-made sweeps, and one tiny real multirun (4 runs of 6 steps)."""

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zoo.report import (
    confidence_interval,
    main,
    mean_std,
    steps_to_target,
    t_ppf,
    t_sf2,
    welch_test,
)

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


# -- statistics -------------------------------------------------------------------------------

def test_mean_std_and_ci_of_known_numbers():
    m, s, n = mean_std([1.0, 2.0, 3.0, 4.0])
    assert (m, n) == (2.5, 4)
    assert s == pytest.approx(math.sqrt(5 / 3))  # sum of squares 5, n - 1 = 3
    lo, hi = confidence_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.182446 * math.sqrt(5 / 3) / 2  # t(0.975, 3) from a t table
    assert lo == pytest.approx(2.5 - half, abs=1e-5) and hi == pytest.approx(2.5 + half, abs=1e-5)
    assert confidence_interval([4.2]) is None  # one seed: no interval
    assert math.isnan(mean_std([4.2])[1])


@pytest.mark.parametrize("df,t", [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262), (30, 2.042)])
def test_t_quantiles_match_the_table(df, t):
    assert t_ppf(0.975, df) == pytest.approx(t, abs=1e-3)
    assert t_sf2(t, df) == pytest.approx(0.05, abs=1e-4)


def test_welch_by_hand():
    # a: mean 2, var 1, n 3; b: mean 5.5, var 5/3, n 4 -> se^2 = 1/3 + 5/12 = 0.75
    w = welch_test([1, 2, 3], [4, 5, 6, 7])
    assert w.diff == pytest.approx(-3.5)
    assert w.t == pytest.approx(-3.5 / math.sqrt(0.75))
    assert w.df == pytest.approx(0.75 ** 2 / ((1 / 3) ** 2 / 2 + (5 / 12) ** 2 / 3))
    assert 0.005 < w.p < 0.02  # t = -4.04 on ~4.96 dof
    assert welch_test([1.0, 1.1, 1.2], [2.0, 2.1, 2.2]).p < 0.05  # clearly separated
    assert welch_test([1.0, 1.5, 2.0], [1.1, 1.6, 1.9]).p > 0.5  # overlapping
    assert welch_test([1.0], [2.0, 2.1]) is None  # one seed: noise unknown
    assert welch_test([1.0, 1.0], [2.0, 2.0]).p == 0.0 and welch_test([1.0, 1.0], [1.0, 1.0]).p == 1.0


def test_welch_agrees_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    for a, b in [([1, 2, 3], [4, 5, 6, 7]), ([0.3, 0.9], [0.1, 2.5, 0.7]), ([4.1, 4.3, 4.2, 4.0], [4.5, 4.4])]:
        ref = stats.ttest_ind(a, b, equal_var=False)
        assert welch_test(a, b).p == pytest.approx(ref.pvalue, rel=1e-8)


def test_steps_to_target_interpolates():
    hist = [(3, 4.0), (6, 3.0), (9, 2.5)]
    assert steps_to_target(hist, 3.5) == pytest.approx(4.5)
    assert steps_to_target(hist, 2.75) == pytest.approx(7.5)
    assert steps_to_target(hist, 3.0) == pytest.approx(6.0)
    assert steps_to_target(hist, 5.0) == 3.0  # reached at the first evaluation
    assert steps_to_target(hist, 2.0) is None
    assert steps_to_target([(2, 0.1), (4, 0.5)], 0.3, higher=True) == pytest.approx(3.0)


# -- hand-made sweeps -------------------------------------------------------------------------

def fake_run(d: Path, overrides: list[str], history: list[float] | None, status: str = "completed",
             metric: str = "val_loss", summary: bool = True) -> None:
    """A run directory as train.py writes it; history = the metric at steps 10, 20, ..."""
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    hist = [{metric: v, "step": 10 * (i + 1)} for i, v in enumerate(history or [])]
    (d / "metrics.csv").write_text("epoch,step,train_loss,val_loss\n0,1,5.0,\n")
    if not summary:
        return
    s = {"status": status, "diverged": status == "diverged", "params": {"total": 1000},
         "flops_per_token": {"forward": 2000, "train": 6000}, "tokens_per_second": 100.0,
         "final": {metric: hist[-1][metric]} if hist and status != "diverged" else {},
         "best": {}, "history": hist, "overrides": overrides, "steps": 10 * len(hist)}
    (d / "summary.json").write_text(json.dumps(s))


def sweep(root: Path, groups: dict[str, list[list[float]]]) -> Path:
    job = 0
    for ffn, histories in groups.items():
        for seed, hist in enumerate(histories):
            fake_run(root / str(job), [f"ffn={ffn}", f"seed={seed}", "trainer.max_steps=30"], hist)
            job += 1
    return root


def rows(md: str) -> dict[str, list[str]]:
    """Table rows of report.md, the header included, keyed by their first cell."""
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    return {cells[0]: cells for ln in lines if (cells := [c.strip() for c in ln.strip("|").split("|")])}


def test_separated_variants_are_significant(tmp_path, capsys):
    sweep(tmp_path, {"relu": [[3.0, 2.0, 1.0], [3.1, 2.1, 1.1], [3.2, 2.2, 1.2]],
                     "gelu": [[3.0, 2.5, 2.0], [3.1, 2.6, 2.1], [3.2, 2.7, 2.2]]})
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    table = rows(md)
    assert table["relu"][1:4] == ["1K", "6K", "100"]
    assert table["relu"][4] == "1.1000 ± 0.1000"
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert table["relu"][5] == f"[{1.1 - half:.4f}, {1.1 + half:.4f}]"
    assert table["gelu"][8] == "3"
    # target = worst mean final, 2.1: relu crosses between steps 10 and 20 (3.0 -> 2.0: 10 + 0.9 * 10 = 19)
    assert "val_loss ≤ 2.1000" in md
    assert table["relu"][9] == f"{(19 + 20 + 21) / 3:.1f}"
    assert "relu vs gelu: 1.0000 lower val_loss (better), larger than seed noise (Welch t, p=" in md
    assert "Welch" in md and "p < 0.05" in md
    assert "relu vs gelu" in capsys.readouterr().out


def test_overlapping_variants_and_baseline(tmp_path):
    sweep(tmp_path, {"relu": [[2.0, 1.0], [2.0, 1.5], [2.0, 2.0]], "gelu": [[2.0, 1.1], [2.0, 1.6], [2.0, 1.9]],
                     "swiglu": [[2.0, 1.2], [2.0, 1.3]]})
    assert main([str(tmp_path), "--baseline", "ffn=gelu", "--target", "1.5", "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "relu vs gelu: 0.0333 lower val_loss (better), within seed noise (Welch t, p=0.9" in md
    assert "swiglu vs gelu:" in md and "n=2 vs 3" in md
    assert "val_loss ≤ 1.5000" in md
    assert rows(md)["relu"][9] == "17.5 (2/3 seeds)"  # seed 0 reaches 1.5 at step 15, seed 1 at 20, seed 2 never
    assert main([str(tmp_path), "--baseline", "ffn=nope"]) == 2


def test_one_seed_has_no_interval(tmp_path):
    sweep(tmp_path, {"relu": [[2.0, 1.0]], "gelu": [[2.0, 1.5]]})
    assert main([str(tmp_path), "--metric", "val_loss"]) == 0
    md = (tmp_path / "report.md").read_text()
    assert rows(md)["relu"][4:6] == ["1.0000 (1 seed)", "n/a (1 seed)"]
    assert "noise cannot be estimated with one seed (n=1 vs 1)" in md


def test_higher_is_better_metric(tmp_path):
    for i, (ffn, v) in enumerate([("relu", 0.9), ("relu", 0.8), ("gelu", 0.2), ("gelu", 0.3)]):
        fake_run(tmp_path / str(i), [f"ffn={ffn}", f"seed={i % 2}"], [0.0, v], metric="exact_match")
    assert main([str(tmp_path), "--metric", "exact_match"]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "relu vs gelu: 0.6000 higher exact_match (better)" in md and "exact_match ≥ 0.2500" in md
    assert main([str(tmp_path), "--metric", "val_bleu"]) == 2


def test_failed_and_diverged_runs_are_counted(tmp_path):
    sweep(tmp_path, {"relu": [[2.0, 1.0], [2.0, 1.2]], "gelu": [[2.0, 1.5], [2.0, 1.7]]})
    fake_run(tmp_path / "4", ["ffn=relu", "seed=2", "trainer.max_steps=30"], [2.0, float("nan")], status="diverged")
    fake_run(tmp_path / "5", ["ffn=gelu", "seed=2", "trainer.max_steps=30"], None, summary=False)  # crashed
    fake_run(tmp_path / "6", ["ffn=gelu", "seed=3", "trainer.max_steps=30"], [2.0], status="interrupted")
    assert main([str(tmp_path)]) == 0
    table = rows((tmp_path / "report.md").read_text())
    assert (table["relu"][8], table["relu"][10:]) == ("2", ["1", "0"])  # seeds, diverged, failed
    assert (table["gelu"][8], table["gelu"][10:]) == ("2", ["0", "2"])  # crashed and interrupted both failed


def test_all_runs_failed_still_reports(tmp_path):
    fake_run(tmp_path / "0", ["ffn=relu", "seed=0"], None, summary=False)
    fake_run(tmp_path / "1", ["ffn=gelu", "seed=0"], None, summary=False)
    assert main([str(tmp_path)]) == 0
    table = rows((tmp_path / "report.md").read_text())
    assert table["relu"][-1] == "1" and table["relu"][8] == "0"


def test_no_runs_is_a_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no runs under") and "\n" not in err
    assert main([str(tmp_path / "missing")]) == 2
    out = subprocess.run([sys.executable, "-m", "zoo.report", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 2 and out.stderr.strip().startswith("error:")


# -- a real multirun --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def multirun(tmp_path_factory) -> Path:
    sweep_dir = tmp_path_factory.mktemp("sweep") / "mr"
    cmd = [sys.executable, "train.py", "-m", "ffn=relu,swiglu", "seed=0,1", "model.d_model=32", "model.n_layers=1",
           "model.n_heads=2", "trainer.max_steps=6", "trainer.val_check_interval=3", "data.eval_batches=2",
           "data.batch_size=4", "data.context=16", "logger=csv", f"hydra.sweep.dir={sweep_dir}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(list(sweep_dir.glob("*/summary.json"))) == 4, out.stderr[-2000:]
    return sweep_dir


def test_report_of_a_real_multirun(multirun, tmp_path):
    out = tmp_path / "report"
    assert main([str(multirun), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    table = rows(md)
    assert set(table) == {"ffn", "relu", "swiglu"}  # header + one row per variant; seed is not a factor
    header = table["ffn"]
    assert "final val_loss (mean ± std)" in header and "final 95% CI" in header and "seeds" in header
    for ffn in ("relu", "swiglu"):
        row = dict(zip(header, table[ffn], strict=True))
        assert row["seeds"] == "2" and row["diverged"] == "0" and row["failed"] == "0"
        assert re.fullmatch(r"\d\.\d{4} ± \d\.\d{4}", row["final val_loss (mean ± std)"])
        assert re.fullmatch(r"\[-?\d+\.\d{4}, \d+\.\d{4}\]", row["final 95% CI"])
    assert re.search(r"^- (relu vs swiglu|swiglu vs relu): \d\.\d{4} lower val_loss \(better\), "
                     r"(larger than|within) seed noise \(Welch t, p=[\d.e-]+, n=2 vs 2\)\.$", md, re.M)
    for name in ("curves.png", "final.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "<table>" in page and "src='curves.png'" not in page
    # the report writes next to the runs by default
    assert main([str(multirun)]) == 0 and (multirun / "report.html").is_file()


def test_crashed_run_in_a_real_multirun(multirun, tmp_path):
    root = tmp_path / "mr"
    shutil.copytree(multirun, root, ignore=shutil.ignore_patterns("checkpoints", "report*", "*.png"))
    (root / "3" / "summary.json").unlink()  # job 3 (swiglu, seed 1) crashed: metrics.csv and .hydra only
    assert main([str(root)]) == 0
    table = rows((root / "report.md").read_text())
    row = dict(zip(table["ffn"], table["swiglu"], strict=True))
    assert row["seeds"] == "1" and row["failed"] == "1" and row["final 95% CI"] == "n/a (1 seed)"
    assert row["params"] != "-"


def test_only_varying_factors_are_columns(tmp_path):
    job = 0
    for ffn in ("relu", "gelu"):
        for norm in ("pre_ln", "pre_rms"):
            for seed in (0, 1):
                fake_run(tmp_path / str(job), [f"ffn={ffn}", f"norm={norm}", f"seed={seed}", "model.d_model=32"],
                         [2.0, 1.0 + 0.1 * job])
                job += 1
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    table = rows(md)
    assert table["ffn"][:3] == ["ffn", "norm", "params"]  # seed and the constant d_model are no columns
    body = [ln.strip("|").split("|")[:2] for ln in md.splitlines() if ln.startswith("| ")][1:]
    assert [[c.strip() for c in r] for r in body] == [["relu", "pre_ln"], ["relu", "pre_rms"], ["gelu", "pre_ln"],
                                                      ["gelu", "pre_rms"]]
    assert md.count("\n- ffn=relu, norm=pre_ln vs ffn=") == 3


def test_one_variant_has_nothing_to_compare(tmp_path):
    for seed in range(2):
        fake_run(tmp_path / "runs" / str(seed), [f"seed={seed}"], [2.0, 1.0 + seed])
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert rows(md)["all runs"][8] == "2" and "nothing to compare" in md


def test_after_sweep_callback_writes_each_metric_and_survives_a_missing_baseline(tmp_path, capsys):
    from omegaconf import OmegaConf

    from zoo.report import ReportAfterSweep

    sweep(tmp_path, {"relu": [[3.0, 2.0], [3.1, 2.1]], "swiglu": [[3.0, 1.5], [3.1, 1.6]]})
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    ReportAfterSweep(metrics=["val_loss", "val_acc"], baseline="ffn=gelu").on_multirun_end(config)
    md = (tmp_path / "report.md").read_text()
    assert "swiglu vs relu: 0.5000 lower val_loss" in md  # no gelu in this sweep: best against the others
    out = capsys.readouterr()
    assert "report: " + str(tmp_path / "report.md") in out.out
    assert "report (val_acc): --metric: no run has 'val_acc'" in out.err  # one line, and no crash
