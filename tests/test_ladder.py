"""Ladders: a study at several sizes (conf/ladder, conf/size, conf/climb), the token rule that sizes each rung's
training, the report's fits and verdicts, and a sweep that continues when its command is run again."""

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests import zygote
from tests.helpers import TINY, compose_cfg
from zoo.build import count_params, resolve_config
from zoo.report import build_report, write_report
from zoo.report.ladder import Gap, fit_power_law, verdict

ROOT = Path(__file__).resolve().parents[1]
CLIMBED = {"ffn": "ffn", "position": "position", "attention": "attention", "norm_placement": "norm",
           "norm_type": "norm", "speedrun": "speedrun", "narang": "narang", "narang_bpe": "narang",
           "narang_seq2seq": "narang", "catalogue": "catalogue"}


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize("study", CLIMBED)
def test_cpu3_climbs_a_subset_of_its_study_at_three_sizes_in_a_fixed_directory(study):
    alone, ladder = _compose([f"study={study}"]), _compose([f"study={study}", "ladder=cpu3"])
    params = ladder.hydra.sweeper.params
    assert params.size == "cpu_s,cpu_m,cpu_l" and params.seed == "0,1,2"
    key = CLIMBED[study]
    climbed, offered = set(params[key].split(",")), set(alone.hydra.sweeper.params[key].split(","))
    assert 2 <= len(climbed) and climbed <= offered
    assert ladder.hydra.sweep.dir == f"multirun/study-{study}/ladder-cpu3"  # no timestamp: a rerun continues
    # norm_placement's 8 layers, the encoder-decoder's 4 + 4: see their climb files
    assert ladder.tokens_per_param == {"norm_placement": 1, "narang_seq2seq": 0.5}.get(study, 2)
    assert ladder.hydra.launcher.n_jobs == 2 and ladder.threads == 1


def test_the_speedrun_ladder_drops_the_studys_one_size_targets():
    """study=speedrun's report targets are losses at its one size; across rungs they would leave one rung's steps
    to the target empty, so its ladder keeps the report's default."""
    alone, ladder = _compose(["study=speedrun"]), _compose(["study=speedrun", "ladder=cpu3"])
    assert alone.hydra.callbacks.report.target == 2.26 and alone.hydra.callbacks.report.also.drop_one.target == 1.85
    report = ladder.hydra.callbacks.report
    assert report.target is None and report.also.drop_one.target is None
    assert report.baseline == "speedrun=nanogpt" and report.also.drop_one.baseline == "speedrun=full"


def _params(overrides: list[str], vocab: int) -> int:
    cfg = _compose(overrides)
    model = {**__import__("omegaconf").OmegaConf.to_container(cfg.model, resolve=True), "vocab_size": vocab,
             "max_seq_len": cfg.data.get("context") or 64}
    return count_params(resolve_config(model))["total"]


def _ladder_compute(study: str) -> float:
    """A cpu3 ladder's training compute in units of 6·N·tokens, tokens = tokens_per_param·N, over its runs."""
    ladder = _compose([f"study={study}", "ladder=cpu3"])
    params = ladder.hydra.sweeper.params
    runs, sizes = len(params[CLIMBED[study]].split(",")) * len(params.seed.split(",")), params.size.split(",")
    return runs * sum(ladder.tokens_per_param * _params([f"study={study}", "ladder=cpu3", f"size={s}"], 65) ** 2
                      for s in sizes)


@pytest.mark.parametrize("study", sorted(set(CLIMBED) - {"ffn"}))
def test_every_cpu3_ladder_costs_about_as_much_as_the_ffn_ladder(study):
    # The ffn ladder took 1.7 h on the 2-core CPU (docs/studies.md); every ladder is sized to about two hours.
    assert 0.5 <= _ladder_compute(study) / _ladder_compute("ffn") <= 1.5


def test_cpu3_largest_rung_has_at_least_8x_the_smallest_and_the_middle_is_the_study():
    small = _params(["study=ffn", "ladder=cpu3", "size=cpu_s"], 65)
    middle = _params(["study=ffn", "ladder=cpu3", "size=cpu_m"], 65)
    large = _params(["study=ffn", "ladder=cpu3", "size=cpu_l"], 65)
    assert large >= 8 * small
    assert middle == _params(["study=ffn"], 65)  # the studies' own shape is the middle rung


def test_gpu_ladder_climbs_to_about_100m_parameters():
    large = _params(["study=ffn", "ladder=gpu", "size=gpu_l"], 16_384)
    small = _params(["study=ffn", "ladder=gpu", "size=gpu_s"], 16_384)
    assert 80e6 <= large <= 130e6 and large >= 8 * small


def test_gpu_ladder_runs_at_toy_size(tmp_path):
    """ladder=gpu composed as written, its GPU trainer swapped for the CPU's and the sizes shrunk."""
    cmd = [sys.executable, "train.py", "-m", "study=ffn", "ladder=gpu", "trainer=cpu", "tokens_per_param=null",
           *TINY, "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "hydra.sweeper.params.size=gpu_s",
           "hydra.sweeper.params.ffn=gelu", "seed=0", f"hydra.sweep.dir={tmp_path}"]
    proc = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "0" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["data"]["context"] == 16


def test_tokens_per_param_sets_the_steps_from_the_models_size(tmp_path):
    from zoo.training import main

    assert main(compose_cfg(TINY + ["tokens_per_param=0.05", "evals_per_run=3"]), tmp_path) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    tokens_per_step = 4 * 16  # data.batch_size x data.context
    expected = math.ceil(0.05 * summary["params"]["active"] / tokens_per_step)
    assert summary["steps"] == expected > 4  # not TINY's trainer.max_steps
    assert summary["tokens_seen"] == expected * tokens_per_step
    assert [h["step"] for h in summary["history"]][:3] == [expected // 3 * i for i in (1, 2, 3)]


@pytest.mark.parametrize("override, error", [
    ("tokens_per_param=0", "tokens_per_param: got 0.0; valid: a positive number"),
    ("tokens_per_param=-2", "tokens_per_param: got -2.0"),
    ("evals_per_run=0", "evals_per_run: got 0; valid: an integer >= 1, or null"),
])
def test_bad_token_rule_is_one_line(override, error, tmp_path, capsys):
    from zoo.training import main

    assert main(compose_cfg(TINY + [override]), tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {error}") and "\n" not in err


# ----------------------------------------------------------------------------------------------
# The report of a ladder, on sweeps written by hand with known answers
# ----------------------------------------------------------------------------------------------

def _write_run(path: Path, overrides: list[str], final: float, compute: float, params: float) -> None:
    path.mkdir(parents=True)
    summary = {"status": "completed", "diverged": False, "overrides": overrides, "final": {"val_loss": final},
               "best": {"val_loss": {"value": final, "step": 10}}, "history": [{"step": 10, "val_loss": final}],
               "params": {"total": params, "active": params}, "flops_per_token": {"train": 6 * params},
               "tokens_seen": compute / (6 * params), "steps": 10, "seed": 0}
    (path / "summary.json").write_text(json.dumps(summary))


def _write_ladder(root: Path, arms: dict, sizes: dict, seeds: int = 3, noise: float = 0.004) -> None:
    """arms: name -> f(compute) -> loss; sizes: name -> parameters. Compute = 20 tokens per parameter."""
    rng, i = np.random.default_rng(0), 0
    for arm, loss in arms.items():
        for size, params in sizes.items():
            for seed in range(seeds):
                c = 6 * params * 20 * params
                value = loss(c) + noise * rng.standard_normal()
                _write_run(root / str(i), [f"ffn={arm}", f"size={size}", f"seed={seed}"], value, c, params)
                i += 1


SIZES = {"s": 2e5, "m": 8e5, "l": 1.8e6}


def test_ladder_verdicts_on_known_gaps(tmp_path):
    base = lambda c: 12.0 * c ** -0.06
    gaps = {"holds": lambda c: -0.10, "grows": lambda c: -0.02 - 0.12 * math.log(c / 3.9e12) / math.log(81),
            "flips": lambda c: 0.08 - 0.16 * math.log(c / 3.9e12) / math.log(81),
            "shrinks": lambda c: -0.15 + 0.13 * math.log(c / 3.9e12) / math.log(81), "same": lambda c: 0.0}
    arms = {"base": base, **{k: (lambda c, g=g: base(c) + g(c)) for k, g in gaps.items()}}
    _write_ladder(tmp_path, arms, SIZES)
    report = build_report(tmp_path, baseline="ffn=base")
    lad = report.ladder
    assert lad is not None and lad.rungs == ["s", "m", "l"] and lad.baseline == "base"
    got = {v.arm: v.verdict for v in lad.verdicts}
    assert got == {"holds": "holds", "grows": "grows", "flips": "flips", "shrinks": "shrinks", "same": "inconclusive"}
    fit = lad.fits["base"]
    assert fit.form == "A·C^-α" and fit.alpha_ci[0] < 0.06 < fit.alpha_ci[1] and abs(fit.alpha - 0.06) < 0.01
    written = write_report(report, tmp_path)
    assert tmp_path / "ladder.png" in written
    md = (tmp_path / "report.md").read_text()
    for heading in ("## Ranking at each size", "## Fits against compute", "## Does it transfer?"):
        assert heading in md
    assert "| flips " in md and "ladder.png" in md


def test_no_two_of_forty_ladder_variants_are_drawn_alike():
    """A study's ladder climbs more than matplotlib's ten colors (narang's: 27 rows and the vanilla)."""
    from zoo.report.plots import arm_style

    assert len({arm_style(i)[:2] for i in range(40)}) == 40  # color and marker: the legend tells them apart


@pytest.mark.parametrize("arms", [3, 12, 28])
def test_every_figure_names_every_variant_in_a_legend_inside_it(arms, tmp_path, monkeypatch):
    """narang's ladder (27 rows and the vanilla, names up to 34 characters; its curves 84 variants with the sizes)
    once lost its last legend entries off the figure's edges."""
    from zoo.report import plots

    names = [f"{'share_blocks_all_factorized_shared'[:6 + i]}_{i}" for i in range(arms)]
    _write_ladder(tmp_path, {n: (lambda c, k=k: 3.0 * c ** -0.05 + 0.01 * k) for k, n in enumerate(names)},
                  SIZES, seeds=2)
    saved, save = {}, plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (save(fig, path), saved.setdefault(path.name, fig)))
    write_report(build_report(tmp_path), tmp_path / "out")
    expected = {"ladder.png": names, "curves.png": [f"ffn={n}, size={s}" for n in names for s in SIZES]}
    for name, labels in expected.items():
        fig = saved[name]
        legend = fig.axes[0].get_legend()
        assert set(labels) <= {t.get_text().split(" (n=")[0] for t in legend.get_texts()}, name  # and the target
        box, page = legend.get_window_extent(), fig.bbox
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, name


def test_a_four_size_ladder_fits_the_irreducible_term(tmp_path):
    sizes = {f"r{i}": p for i, p in enumerate((1e5, 3e5, 1e6, 3e6, 1e7))}
    _write_ladder(tmp_path, {"a": lambda c: 1.5 + 40.0 * c ** -0.15, "b": lambda c: 1.5 + 45.0 * c ** -0.15},
                  sizes, noise=0.001)
    fit = build_report(tmp_path).ladder.fits["a"]
    assert fit.form == "E + A·C^-α"
    assert abs(fit.e - 1.5) < 0.02 and abs(fit.alpha - 0.15) < 0.01  # recovered (a 95% CI misses 1 draw in 20)
    assert fit.e_ci[0] < fit.e < fit.e_ci[1] and fit.alpha_ci[1] - fit.alpha_ci[0] < 0.02


def test_verdict_needs_two_seeds_and_fit_needs_two_sizes():
    one = Gap(-0.1, None)
    assert verdict(one, one, one, higher=False)[0] == "inconclusive"
    assert fit_power_law([(1e9, 3.0), (1e9, 3.1)], sizes=1) is None


def test_ladder_baseline_must_match_a_variant(tmp_path):
    from zoo.report import ReportError

    _write_ladder(tmp_path, {"a": lambda c: 3.0, "b": lambda c: 3.1}, SIZES)
    with pytest.raises(ReportError, match="--baseline: no variant matches"):
        build_report(tmp_path, baseline="ffn=gelu")


# ----------------------------------------------------------------------------------------------
# A sweep run again in its directory continues
# ----------------------------------------------------------------------------------------------

SWEEP = ["-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=1", *TINY, "trainer.max_steps=200",
         "trainer.val_check_interval=10", "sample.max_new_tokens=0", "logger=csv", "checkpoints=last",
         "ffn=relu,gelu,swiglu", "seed=0"]


def test_a_sweep_run_again_keeps_finished_jobs_resumes_the_interrupted_one_and_starts_the_missing(tmp_path):
    cmd = [sys.executable, "train.py", *SWEEP, f"hydra.sweep.dir={tmp_path}"]
    # The machine dies during job 1, after its first checkpoint: every process of the sweep is SIGKILLed.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    ckpt, deadline = tmp_path / "1" / "checkpoints" / "last.ckpt", time.monotonic() + 300
    while not ckpt.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ckpt.is_file() and (tmp_path / "0" / "summary.json").is_file()
    assert not (tmp_path / "1" / "summary.json").exists() and not (tmp_path / "2").exists()
    first = (tmp_path / "0" / "summary.json").read_bytes()

    again = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"kept: {tmp_path / '0'} finished earlier (completed)" in again.stdout
    assert (tmp_path / "0" / "summary.json").read_bytes() == first  # kept, not rerun
    resumed, started = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("1", "2"))
    assert resumed["status"] == started["status"] == "completed"
    assert resumed["resumes"] == 1 and started["resumes"] == 0 and resumed["steps"] == 200
    for n in "012":  # checkpoints=last: each finished run keeps its weights alone, no best.ckpt
        assert sorted(p.name for p in (tmp_path / n / "checkpoints").iterdir()) == ["last.ckpt"]
        assert "optimizer_states" not in torch.load(tmp_path / n / "checkpoints" / "last.ckpt", weights_only=True)
    report = (tmp_path / "report.md").read_text() if (tmp_path / "report.md").exists() else ""
    jobs = build_report(tmp_path).plan.jobs
    assert [j.state for j in jobs] == ["finished"] * 3
    assert [("resumed 1x" in j.detail) for j in jobs] == [False, True, False], report


def test_a_job_refused_beside_a_kept_one_is_said_refused_not_completed(tmp_path):
    # Naming other variants in a sweep's directory moves them onto other job numbers: job 1 (swiglu) finds job 1's
    # earlier run (gelu), whose summary.json says completed. The sweep's console must say the job was refused.
    base = [sys.executable, "train.py", *SWEEP[:-2], "hydra.launcher.n_jobs=2", "seed=0", "trainer.max_steps=4",
            f"hydra.sweep.dir={tmp_path}"]
    assert zygote.run([*base, "ffn=relu,gelu"], cwd=ROOT, capture_output=True, timeout=600).returncode == 0
    gelu = (tmp_path / "1" / "summary.json").read_bytes()
    again = zygote.run([*base, "ffn=relu,swiglu"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]  # one refused job does not stop or fail the others
    assert f"[#1 ffn=swiglu] refused: hydra.sweep.dir: '{tmp_path / '1'}' holds a finished run with other " \
           "settings (model.ffn.name: earlier run 'gelu', this run 'swiglu')" in out, out[-3000:]
    assert "[#0 ffn=relu] completed" in out and "[#1 ffn=swiglu] completed" not in out
    assert "(2 completed); 1 of this sweep's 2 jobs refused (each said why above)" in out
    assert (tmp_path / "1" / "summary.json").read_bytes() == gelu  # the refused job's directory: untouched
    # The earlier variants first, in their order, then the new one: the earlier runs keep their numbers.
    before = [(tmp_path / n / "summary.json").read_bytes() for n in "01"]
    more = zygote.run([*base, "ffn=relu,gelu,swiglu"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    out = more.stdout + more.stderr
    assert more.returncode == 0 and "] refused:" not in out and "(3 completed)" in out, out[-3000:]
    assert [(tmp_path / n / "summary.json").read_bytes() for n in "01"] == before  # kept, not trained again
    assert "- ffn=swiglu" in (tmp_path / "2" / ".hydra" / "overrides.yaml").read_text()


def _files(root: Path) -> dict[str, bytes]:
    """Every file under root but run.lock (its content is the pid of the last process that held it)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "run.lock"}


def test_a_sweep_continued_on_changed_data_is_refused_and_keeps_its_results(tmp_path):
    """The same characters in another order: the tokenizer and every setting are the same, the text is not. Each
    finished job is refused in one line naming the file, and nothing of the sweep changes; the same text again
    is kept as before."""
    text, words = tmp_path / "corpus.txt", ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog"]
    rng = np.random.default_rng(0)
    text.write_text(" ".join(rng.choice(words, 3000)) + "\n")
    first = text.read_bytes()
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "train.py", *SWEEP[:-2], "ffn=relu", "seed=0,1", "trainer.max_steps=4",
           "data=text_file", f"data.path={text}", "data.context=16", "data.eval_batches=1",
           f"hydra.sweep.dir={sweep}"]
    assert zygote.run(cmd, cwd=ROOT, capture_output=True, timeout=600).returncode == 0
    recorded = json.loads((sweep / "0" / "summary.json").read_text())["data_fingerprint"]
    assert recorded == {"source": f"data.path '{text}'", "sha256": hashlib.sha256(first).hexdigest()}
    before = _files(sweep)
    text.write_text(" ".join(rng.choice(words, 3000)) + "\n")  # other text, the same characters
    assert sorted(set(text.read_text())) == sorted(set(first.decode())) and text.read_bytes() != first
    again = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    refused = [ln for ln in again.stderr.splitlines() if ln.startswith("error:")]
    assert refused == [f"error: hydra.sweep.dir: '{sweep / n}' holds a finished run trained on other data "
                       f"(data.path '{text}' now has sha256 {hashlib.sha256(text.read_bytes()).hexdigest()[:16]}..., "
                       f"the run's {recorded['sha256'][:16]}...); valid: the data it trained on, another "
                       "hydra.sweep.dir, or overwrite=true" for n in "01"] + \
        ["error: all 2 jobs of the sweep were refused (each said why above)"], again.stderr[-3000:]
    assert again.returncode == 2
    assert "Traceback" not in again.stderr and _files(sweep) == before  # the old results, byte for byte
    text.write_bytes(first)  # the data it trained on: kept, as any finished job
    kept = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert kept.returncode == 0 and f"kept: {sweep / '1'} finished earlier (completed)" in kept.stdout, kept.stderr
    assert _files(sweep) == before


def test_a_ladder_on_two_cpu_instruction_sets_says_so(tmp_path):
    """The small rungs on one machine, the large on another: the report of the ladder names both."""
    _write_ladder(tmp_path, {"base": lambda c: 12.0 * c ** -0.06, "arm": lambda c: 11.5 * c ** -0.06}, SIZES)
    for summary in tmp_path.glob("*/summary.json"):
        s = json.loads(summary.read_text())
        isa = "avx512+amx" if "size=l" in s["overrides"] else "avx512+avx512_bf16"
        summary.write_text(json.dumps({**s, "cpu_isa": isa, "cpu_kind": isa.split("+")[1]}))
    report = build_report(tmp_path, baseline="ffn=base")
    assert report.ladder is not None
    write_report(report, tmp_path)
    said = [ln for ln in (tmp_path / "report.md").read_text().splitlines() if ln.startswith("Mixed CPU")]
    assert said and said[0].startswith("Mixed CPU instruction sets: avx512+amx (6 runs), avx512+avx512_bf16 (12 runs).")
