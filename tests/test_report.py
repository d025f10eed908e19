"""zoo.report: statistics by hand, hand-made sweeps, and one tiny real multirun (4 runs of 6 steps)."""

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from tests import zygote
from zoo.report import (
    confidence_interval,
    main,
    mean_std,
    steps_to_target,
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
def test_interval_uses_the_t_table(df, t):
    values = [float(i % 2) for i in range(df + 1)]  # n = df + 1 values
    m, s, n = mean_std(values)
    lo, hi = confidence_interval(values)
    assert (hi - lo) / 2 == pytest.approx(t * s / math.sqrt(n), rel=2e-4)


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
    """A run directory as train.py writes it; history = the metric at steps 10, 20, ..., each 1 + step / 2 seconds
    into the run."""
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    hist = [{metric: v, "step": 10 * (i + 1), "wall_time_s": 1 + 5 * (i + 1)} for i, v in enumerate(history or [])]
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


def tables(md: str) -> list[list[list[str]]]:
    """Every table of report.md: rows of cells, the header included, the |---| line left out."""
    out, current = [], None
    for ln in md.splitlines():
        if ln.startswith("|"):
            if current is None:
                current = []
                out.append(current)
            if not ln.startswith("|:") and not ln.startswith("|-"):
                current.append([c.strip() for c in ln.strip().strip("|").split("|")])
        else:
            current = None
    return out


def rows(md: str) -> dict[str, list[str]]:
    """Rows of report.md's variant table, the header included, keyed by their first cell."""
    return {cells[0]: cells for cells in tables(md)[0]}


def jobs(md: str) -> list[dict[str, str]]:
    """The job table of report.md as {column: cell} per job."""
    head, *body = next(t for t in tables(md) if t[0][0] == "job")
    return [dict(zip(head, r, strict=True)) for r in body]


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
    assert table["relu"][10] == f"{(1 + 19 / 2 + 1 + 20 / 2 + 1 + 21 / 2) / 3:.1f}"  # seconds: on each run's clock
    # gelu: seed 0 at step 28 (15 s), seed 1 at step 30 (16 s), seed 2 never
    assert table["gelu"][9:11] == ["29.0 (2/3 seeds)", "15.5 (2/3 seeds)"]
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


def test_effects_against_the_baseline_have_welch_intervals(tmp_path):
    """Each variant's difference from the baseline in final loss, steps and seconds to the target, with the interval
    scipy's Welch test gives; a time some seed never reached is not compared."""
    sweep(tmp_path, {"relu": [[3.0, 2.0, 1.0], [3.1, 2.1, 1.1], [3.2, 2.2, 1.2]],
                     "gelu": [[3.0, 2.5, 1.5], [3.0, 2.6, 1.6], [3.0, 2.7, 1.8]],
                     "swiglu": [[3.0, 2.9, 2.6], [3.0, 2.0, 1.0], [3.0, 2.0, 1.0]]})
    assert main([str(tmp_path), "--baseline", "ffn=gelu", "--target", "2.5"]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "## Effects against gelu" in md
    effects = {cells[0]: cells for cells in next(t for t in tables(md) if t[0][0] == "variant")}
    assert set(effects) == {"variant", "relu", "swiglu"}

    def cell(a, b):
        r = stats.ttest_ind(a, b, equal_var=False)
        lo, hi = r.confidence_interval(0.95)
        return f"{sum(a) / 3 - sum(b) / 3:+.4g} [{lo:+.4g}, {hi:+.4g}], p={r.pvalue:.2g}"

    # 2.5 is crossed by relu at steps 15, 16, 17 and by gelu at 20, 21, 22.22 (2.7 -> 1.8 between 20 and 30)
    relu_steps, gelu_steps = [15, 16, 17], [20, 21, 20 + 0.2 / 0.9 * 10]
    assert effects["relu"][1] == cell([1.0, 1.1, 1.2], [1.5, 1.6, 1.8])
    assert effects["relu"][2] == cell(relu_steps, gelu_steps)
    assert effects["relu"][3] == cell([1 + s / 2 for s in relu_steps], [1 + s / 2 for s in gelu_steps])
    assert effects["swiglu"][2] == effects["swiglu"][3] == "- (reached by 2/3 seeds)"
    assert effects["swiglu"][1].startswith(f"{(2.6 + 1.0 + 1.0) / 3 - (1.5 + 1.6 + 1.8) / 3:+.4g} [")


def test_effects_give_a_verdict_and_each_variant_s_size_beside_the_baseline_s(tmp_path):
    """study=narang's rows beside their cost: the verdict follows Welch's p and the metric's direction, and params
    and FLOPs are marked where they differ from the baseline's by more than 1%."""
    sweep(tmp_path, {"relu": [[3.0, 2.0, 1.0], [3.1, 2.1, 1.1], [3.2, 2.2, 1.2]],
                     "gelu": [[3.0, 2.5, 1.5], [3.0, 2.6, 1.6], [3.0, 2.7, 1.8]],
                     "swiglu": [[3.0, 2.5, 1.55], [3.0, 2.6, 1.5], [3.0, 2.7, 1.9]]})
    for job, params in ((0, 1005), (1, 1005), (2, 1005), (6, 2000), (7, 2000), (8, 2000)):  # relu within 1%
        summary = json.loads((tmp_path / str(job) / "summary.json").read_text())
        summary["params"]["total"] = params
        summary["flops_per_token"]["train"] = 9000 if params == 2000 else 6000
        (tmp_path / str(job) / "summary.json").write_text(json.dumps(summary))
    assert main([str(tmp_path), "--baseline", "ffn=gelu"]) == 0
    head, *body = next(t for t in tables((tmp_path / "report.md").read_text()) if t[0][0] == "variant")
    effects = {r[0]: dict(zip(head, r, strict=True)) for r in body}
    assert effects["relu"]["verdict"] == "better" and effects["swiglu"]["verdict"] == "within noise"
    assert effects["relu"]["params"] == "1K" and effects["relu"]["FLOPs/token (train)"] == "6K"
    assert effects["swiglu"]["params"] == "2K (+100% params)"
    assert effects["swiglu"]["FLOPs/token (train)"] == "9K (+50% FLOPs)"
    assert main([str(tmp_path), "--baseline", "ffn=relu", "--out", str(tmp_path / "r")]) == 0
    head, *body = next(t for t in tables((tmp_path / "r" / "report.md").read_text()) if t[0][0] == "variant")
    assert dict(zip(head, body[0], strict=True))["verdict"] == "worse"  # gelu against relu


def test_a_study_s_skipped_variants_are_listed_with_their_reasons(tmp_path):
    """hydra.callbacks.report.skipped in the sweep's multirun.yaml: every report of it lists them, the callback's
    and one written again by python -m zoo.report."""
    from zoo.report import ReportAfterSweep, ReportError

    sweep(tmp_path, {"relu": [[2.0, 1.0], [2.0, 1.1]], "gelu": [[2.0, 1.5], [2.0, 1.6]]})
    skipped = {"funnel": "decoder-only: zoo refuses model.funnel", "untie_head": "this is the row untied"}
    (tmp_path / "multirun.yaml").write_text(json.dumps({"hydra": {"callbacks": {"report": {"skipped": skipped}}}}))
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "## Not run here" in md
    listed = next(t for t in tables(md) if t[0] == ["variant", "why"])
    assert {r[0]: r[1] for r in listed[1:]} == skipped
    sweep(tmp_path / "plain", {"relu": [[2.0, 1.0]]})
    assert main([str(tmp_path / "plain")]) == 0 and "Not run here" not in (tmp_path / "plain" / "report.md").read_text()
    ReportAfterSweep(skipped=skipped)
    with pytest.raises(ReportError, match="hydra.callbacks.report.skipped"):
        ReportAfterSweep(skipped={"funnel": ""})


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
    assert (table["relu"][8], table["relu"][11:]) == ("2", ["1", "0"])  # seeds, diverged, failed
    assert (table["gelu"][8], table["gelu"][11:]) == ("2", ["0", "2"])  # crashed and interrupted both failed


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
    out = zygote.run([sys.executable, "-m", "zoo.report", str(tmp_path)], cwd=ROOT, capture_output=True,
                     text=True)
    assert out.returncode == 2 and out.stderr.strip().startswith("error:")


# -- a real multirun --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def multirun(tmp_path_factory) -> Path:
    sweep_dir = tmp_path_factory.mktemp("sweep") / "mr"
    cmd = [sys.executable, "train.py", "-m", "ffn=relu,swiglu", "seed=0,1", "model.d_model=32", "model.n_layers=1",
           "model.n_heads=2", "trainer.max_steps=6", "trainer.val_check_interval=3", "data.eval_batches=2",
           "data.batch_size=4", "data.context=16", "logger=csv", f"hydra.sweep.dir={sweep_dir}"]
    out = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
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
    for name in ("curves.png", "final.png", "effects.png"):  # effects: the other variant against the best
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
    summary = json.loads((multirun / "0" / "summary.json").read_text())
    assert summary["directions"] == {"val_loss": "min", "val_ppl": "min", "val_bpc": "min"}
    assert set(summary["load"]) == {"loadavg", "cpu_count"} and len(summary["load"]["loadavg"]) == 3
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "<table" in page and "src='curves.png'" not in page
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
    body = [r[:2] for r in tables(md)[0][1:]]
    assert body == [["relu", "pre_ln"], ["relu", "pre_rms"], ["gelu", "pre_ln"], ["gelu", "pre_rms"]]
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


def test_after_sweep_callback_writes_a_report_against_each_further_baseline(tmp_path, capsys):
    """study=speedrun's drop-one effects: a second report, of the first metric, against another variant."""
    from omegaconf import OmegaConf

    from zoo.report import ReportAfterSweep

    sweep(tmp_path, {"relu": [[3.0, 2.0], [3.1, 2.1]], "gelu": [[3.0, 1.8], [3.1, 1.9]],
                     "swiglu": [[3.0, 1.5], [3.1, 1.6]]})
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    ReportAfterSweep(baseline="ffn=relu", also={"against_swiglu": "ffn=swiglu", "against_moe": "ffn=moe"}) \
        .on_multirun_end(config)
    assert "gelu vs relu: 0.2000 lower val_loss" in (tmp_path / "report.md").read_text()
    md = (tmp_path / "against_swiglu" / "report.md").read_text()
    assert "gelu vs swiglu: 0.3000 higher val_loss (worse)" in md and "relu vs swiglu: 0.5000 higher" in md
    out = capsys.readouterr()
    assert "report: " + str(tmp_path / "against_swiglu" / "report.md") in out.out
    assert "report (against_moe, against ffn=moe): --baseline: no variant match 'ffn=moe'" in out.err
    assert not (tmp_path / "against_moe").exists()


def test_after_sweep_callback_gives_each_report_its_own_target(tmp_path):
    """A target for the sweep directory's report, another for an `also` report ({baseline, target}); the steps to
    each are read against it, and the default stays the worst variant's mean."""
    from omegaconf import OmegaConf

    from zoo.report import ReportAfterSweep

    sweep(tmp_path, {"relu": [[3.0, 2.0], [3.1, 2.1]], "swiglu": [[3.0, 1.5], [3.1, 1.6]]})
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    also = OmegaConf.create({"low": {"baseline": "ffn=swiglu", "target": 1.7}, "plain": "ffn=swiglu"})
    ReportAfterSweep(baseline="ffn=relu", target=2.5, also=also).on_multirun_end(config)
    assert "Target: val_loss ≤ 2.5000 (given)" in (tmp_path / "report.md").read_text()
    low = (tmp_path / "low" / "report.md").read_text()
    assert "Target: val_loss ≤ 1.7000 (given)" in low and "relu vs swiglu: 0.5000 higher" in low
    table = rows(low)
    steps = table["ffn"].index("steps to val_loss ≤ 1.7000")
    assert table["relu"][steps] == "-" and table["swiglu"][steps] != "-"  # only swiglu reaches 1.7
    assert "(default: the worst variant's mean final val_loss)" in (tmp_path / "plain" / "report.md").read_text()


@pytest.mark.parametrize("kwargs", [{"target": "2.3"}, {"also": {"x": {"baseline": "ffn=a", "taget": 1.0}}},
                                    {"also": {"x": {"target": 1.0}}}, {"also": {"x": 3}}])
def test_after_sweep_callback_refuses_bad_arguments_when_created(kwargs):
    from zoo.report import ReportAfterSweep
    from zoo.report.runs import ReportError

    with pytest.raises(ReportError, match=r"^hydra\.callbacks\.report\.(target|also\.x): expected "):
        ReportAfterSweep(**kwargs)


# -- the sweep's jobs: finished, running, failed (killed), missing --------------------------------

def test_jobs_of_a_real_multirun_running_killed_and_missing(multirun, tmp_path):
    root = tmp_path / "mr"
    shutil.copytree(multirun, root, ignore=shutil.ignore_patterns("checkpoints", "report*", "*.png"))
    (root / "1" / "summary.json").unlink()  # relu, seed 1: died before its summary (killed)
    shutil.rmtree(root / "2")  # swiglu, seed 0: never started
    (root / "3" / "summary.json").unlink()  # swiglu, seed 1: still running, it holds its lock
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from zoo.io import lock_run_dir; "
                               f"f = lock_run_dir({str(root / '3')!r}); print('locked', flush=True); "
                               "sys.stdin.read()"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main([str(root)]) == 0
    finally:
        holder.stdin.close()
        holder.wait(timeout=300)
    md = (root / "report.md").read_text()
    assert "4 jobs (4 planned in multirun.yaml): 1 finished, 1 running, 1 failed, 0 diverged, 1 missing." in md
    states = {j["overrides"]: (j["job"], j["status"], j["detail"]) for j in jobs(md)}
    assert states["ffn=relu seed=0"] == ("0", "finished", "")
    assert states["ffn=relu seed=1"][:2] == ("1", "failed") and "killed" in states["ffn=relu seed=1"][2]
    assert states["ffn=swiglu seed=0"] == ("-", "missing", "no run directory")
    assert states["ffn=swiglu seed=1"][:2] == ("3", "running")
    table = rows(md)
    relu, swiglu = (dict(zip(table["ffn"], table[v], strict=True)) for v in ("relu", "swiglu"))
    assert relu["failed"] == "1" and relu["running"] == "0" and relu["seeds"] == "1"
    assert swiglu["failed"] == "0" and swiglu["running"] == "1"  # a running job is not a failed one
    # once the lock is released (the process died), the same job is a killed one
    assert main([str(root)]) == 0
    assert "0 running, 2 failed" in (root / "report.md").read_text()


def test_planned_jobs_follow_hydras_basic_sweeper(tmp_path):
    """Sweeper params from the config, then the command line's overrides; ranges and choice() expand."""
    from zoo.report.runs import planned_jobs

    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
        "    max_batch_size: null\n    params:\n      ffn: relu,gelu\n"
        "  overrides:\n    task:\n    - seed=range(2)\n    - model.d_model=32\n")
    planned, source = planned_jobs(tmp_path)
    assert source == "multirun.yaml"
    assert planned == [[f"ffn={f}", f"seed={s}", "model.d_model=32"] for f in ("relu", "gelu") for s in (0, 1)]
    # a study preset's params narrowed on the command line: the command line's values win, as in Hydra
    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
        "    params:\n      position: learned,rope,alibi\n      seed: 0,1,2\n"
        "  overrides:\n    task:\n    - study=position\n    - position=learned,alibi\n    - seed=0,1\n")
    assert planned_jobs(tmp_path)[0] == [[f"position={p}", f"seed={s}", "study=position"]
                                         for p in ("learned", "alibi") for s in (0, 1)]
    (tmp_path / "multirun.yaml").write_text("hydra:\n  sweeper:\n    _target_: "
                                           "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper\n")
    planned, source = planned_jobs(tmp_path)
    assert planned is None and "OptunaSweeper: the jobs found on disk" in source


# -- bad input ------------------------------------------------------------------------------------

@pytest.mark.parametrize("content,reason", [
    ("[1, 2]", "summary.json holds an array, not a JSON object"),
    ("null", "summary.json holds null, not a JSON object"),
    ("{not json", "summary.json is not JSON"),
    ('{"status": "completed", "final": {"val_loss": "low"}}', "final.val_loss is 'low', not a number"),
    ('{"status": "completed", "final": {"val_loss": 1.0}, "history": [{"step": 3, "val_loss": [1]}]}',
     "history[0].val_loss is [1], not a number"),
    ('{"status": "completed", "final": {"val_loss": 1.0}, "best": {"val_loss": 1.0}}',
     "best.val_loss is 1.0, not {'value': <number>, ...}"),
    ('{"status": "completed", "final": 3}', "'final' is 3, not an object"),
])
def test_unreadable_summary_is_listed_with_its_reason(tmp_path, content, reason):
    sweep(tmp_path, {"relu": [[2.0, 1.0], [2.0, 1.1]]})
    fake_run(tmp_path / "9", ["ffn=gelu", "seed=0", "trainer.max_steps=30"], None, summary=False)
    (tmp_path / "9" / "summary.json").write_text(content)
    assert main([str(tmp_path)]) == 0  # an exception here would be the traceback the user sees
    md = (tmp_path / "report.md").read_text()
    job = next(j for j in jobs(md) if j["job"] == "9")
    assert job["status"] == "failed" and job["detail"].startswith("unreadable: ") and reason in job["detail"]
    assert rows(md)["gelu"][-1] == "1"  # counted as failed, not averaged


@pytest.mark.parametrize("make,message", [
    (lambda d: None, "error: no runs under"),
    (lambda d: (d / "notes").mkdir(), "error: no runs under"),
    (lambda d: (d / "file.txt").write_text("x"), "error: no runs under"),
])
def test_no_runs_exits_2_with_one_line(tmp_path, capsys, make, message):
    make(tmp_path)
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


# -- direction of a metric ------------------------------------------------------------------------

def test_direction_comes_from_the_summaries(tmp_path):
    """val_score says nothing by its name (the old rule calls it lower-is-better); the summaries say max."""
    for i, (ffn, v) in enumerate([("relu", 0.9), ("relu", 0.8), ("gelu", 0.2), ("gelu", 0.3)]):
        fake_run(tmp_path / str(i), [f"ffn={ffn}", f"seed={i % 2}"], [0.0, v], metric="val_score")
        s = json.loads((tmp_path / str(i) / "summary.json").read_text())
        s["directions"] = {"val_score": "max"}
        (tmp_path / str(i) / "summary.json").write_text(json.dumps(s))
    assert main([str(tmp_path), "--metric", "val_score"]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "(higher is better)" in md and "val_score ≥ 0.2500" in md
    assert "relu vs gelu: 0.6000 higher val_score (better)" in md


def test_objectives_declare_directions_and_training_does_not_import_the_report():
    from zoo.training.objectives import higher_is_better, metric_directions

    assert metric_directions()["val_masked_acc"] == "max" and metric_directions()["val_loss"] == "min"
    assert higher_is_better("exact_match") and not higher_is_better("val_bpc")
    with pytest.raises(ValueError, match="no declared direction; valid: "):
        higher_is_better("val_bleu")
    code = ("import sys, zoo.training, zoo.training.runner, zoo.training.callbacks; "
            "assert 'zoo.report' not in sys.modules, 'zoo.training imports zoo.report'")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


# -- short sweeps and busy machines ---------------------------------------------------------------

def test_short_sweep_plots_the_training_loss_and_flags_busy_runs(tmp_path):
    for i, (ffn, v) in enumerate([("relu", 1.0), ("relu", 1.1), ("gelu", 1.5), ("gelu", 1.6)]):
        d = tmp_path / str(i)
        fake_run(d, [f"ffn={ffn}", f"seed={i % 2}"], [v])  # one evaluation: a curve of one dot
        (d / "metrics.csv").write_text("epoch,step,train_loss,val_loss\n" + "".join(
            f"0,{s},{5.0 - 0.1 * s - 0.2 * i},\n" for s in range(0, 10)) + f"0,9,,{v}\n")
        s = json.loads((d / "summary.json").read_text())
        s["load"] = {"loadavg": [7.5, 6.0, 5.0] if ffn == "gelu" else [0.5, 0.4, 0.3], "cpu_count": 2}
        (d / "summary.json").write_text(json.dumps(s))
    assert main([str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "Training loss per variant (fewer than 3 evaluations of val_loss)" in md
    assert rows(md)["gelu"][3] == "100 (busy)" and rows(md)["relu"][3] == "100"
    assert "tok/s marked (busy)" in md


# -- report.html in a real browser ----------------------------------------------------------------

PROBE = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  document.body.setAttribute("data-images", imgs.length);
  document.body.setAttribute("data-broken", imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length);
  document.body.setAttribute("data-tables", document.querySelectorAll("table").length);
});
</script>
"""


def render(page: Path) -> tuple[dict[str, int], list[str]]:
    """Load a copy of `page` (with a probe script) in headless Chromium: (image and table counts from the
    rendered DOM, console messages). The report itself has no scripts, so any console message is its own."""
    probe = page.with_name("probe_" + page.name)
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    out = subprocess.run([shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu",
                          "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=300)
    body = re.search(r"<body([^>]*)>", out.stdout)
    assert body, f"chromium rendered nothing: {out.stderr[-2000:]}"
    counts = {k: int(v) for k, v in re.findall(r'data-(\w+)="(\d+)"', body.group(1))}
    console = [ln for ln in out.stderr.splitlines() if ":CONSOLE" in ln and "probe_" in ln]
    return counts, console


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed "
                    "(apt-get install chromium) to render report.html")
def test_report_html_renders_in_chromium(multirun, tmp_path):
    out = tmp_path / "report"
    assert main([str(multirun), "--out", str(out)]) == 0
    counts, console = render(out / "report.html")
    assert counts == {"images": 3, "broken": 0, "tables": 3} and console == []  # variants, effects, jobs
    # the probe sees what it must: a corrupt image, a missing table, a script error
    page = (out / "report.html").read_text()
    (out / "bad.html").write_text(page.replace("base64,iVBOR", "base64,AAAA", 1)
                                  .replace("<table", "<div", 1).replace("</body>", "<script>nope()</script></body>"))
    counts, console = render(out / "bad.html")
    assert counts["broken"] == 1 and counts["tables"] == 2 and any("nope is not defined" in c for c in console)


# -- scale: the report's work grows linearly with the runs --------------------------------------------------------


def _bench_report():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "scripts" / "bench_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _calls(fn) -> int:
    """How many Python and C function calls `fn()` makes: a count of operations, not a timing."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def test_report_work_is_linear_in_the_runs(tmp_path):
    """scripts/bench_report.py's fake sweep at n, 2n and 4n runs: finding the runs and building the report make
    calls in a fixed part plus a part per run, so going from 2n to 4n adds twice what going from n to 2n added;
    checking each directory against every other (the quadratic search this replaced) added four times as much.
    The figures in seconds are docs/benchmarks.md's, "The report on a large sweep"."""
    from zoo.report.cli import build_report
    from zoo.report.runs import find_run_dirs

    bench, counts = _bench_report(), []
    for n in (50, 100, 200):
        root = bench.make_sweep(tmp_path / str(n), n, steps=8)
        found = find_run_dirs(root)
        assert len(found) == n and found[:3] == [root / "0", root / "1", root / "2"]
        build_report(root)  # its first call imports what it needs (Hydra's parser): once, not per run
        counts.append((_calls(lambda: find_run_dirs(root)), _calls(lambda: build_report(root))))  # noqa: B023
    for what, (a, b, c) in zip(("find_run_dirs", "build_report"), zip(*counts, strict=True), strict=True):
        assert 1.6 < (c - b) / (b - a) < 2.4, (what, a, b, c)


# -- CPU instruction sets: float32 digits repeat on one only -------------------------------------------------------


def _set_cpu(run_dir: Path, **record) -> None:
    """Give a hand-made run's summary.json the CPU record a run writes (cpu_isa, cpu_kind) or an older one."""
    path = run_dir / "summary.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **record}))


@pytest.mark.parametrize(("records", "line"), [
    # (cpu_isa, cpu_kind) per run; None: the key absent (a run from before the record)
    ([("avx512+amx", "amx")] * 4, None),
    ([("avx512+amx", "amx")] * 2 + [("avx512+avx512_bf16", "avx512_bf16")] * 2,
     "Mixed CPU instruction sets: avx512+amx (2 runs), avx512+avx512_bf16 (2 runs)."),
    ([("avx512+amx", "amx")] * 3 + [("avx2", "none")],
     "Mixed CPU instruction sets: avx2 (1 run), avx512+amx (3 runs)."),
    # an older run records the coarser cpu_kind only: every run is compared by it
    ([(None, "amx")] * 2 + [("avx512+amx", "amx")] * 2, None),
    ([(None, "amx")] * 2 + [("avx512+avx512_bf16", "avx512_bf16")] * 2,
     "Mixed CPU instruction sets: amx (2 runs), avx512_bf16 (2 runs)."),
    ([(None, None)] * 4, None),  # nothing recorded: nothing said
])
def test_report_says_when_a_sweep_mixes_cpu_instruction_sets(tmp_path, records, line):
    from zoo.report import build_report, write_report

    root = sweep(tmp_path / "sweep", {"relu": [[3.0, 2.0], [3.1, 2.1]], "gelu": [[3.0, 1.9], [3.1, 2.0]]})
    for job, (isa, kind) in enumerate(records):
        _set_cpu(root / str(job), **{k: v for k, v in (("cpu_isa", isa), ("cpu_kind", kind)) if v is not None})
    write_report(build_report(root), root)
    md, page = (root / "report.md").read_text(), (root / "report.html").read_text()
    said = [ln for ln in md.splitlines() if ln.startswith("Mixed CPU")]
    if line is None:
        assert said == [] and "Mixed CPU" not in page
    else:
        assert len(said) == 1 and said[0].startswith(line) and "within seed noise" in said[0], said
        assert line in page
