"""Sweeps: Hydra multiruns with zoo's parallel launcher (a failing run, a killed run), Optuna, budget=params."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import zygote
from tests.helpers import TINY

ROOT = Path(__file__).resolve().parents[1]


def test_parallel_multirun_with_a_failing_run_and_matched_parameters(tmp_path):
    """Three heads do not divide d_model=32, and no size of pkm meets the budget (its values alone outweigh the
    baseline's FFN): those jobs are refused, and start before the others (zoo.config.sizing.preflight), so the
    sweep's console says why at its start; the rest run, with swiglu resized to gelu's parameters."""
    cmd = [sys.executable, "train.py", "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", *TINY,
           "logger=csv", "ffn=gelu,swiglu,pkm", "model.n_heads=2,3", "budget=params", f"hydra.sweep.dir={tmp_path}"]
    proc = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (proc.stdout + proc.stderr).splitlines()
    assert any(ln.endswith("4 of 6 jobs fail zoo's checks that need no data; they start first, so each says why "
                           "now and not after the others: #2, #3, #4, #5") for ln in lines), proc.stderr[-3000:]
    # the order they were started in: their processes' ids, which each console's first line gives (the sweep's
    # "started" lines come as each job reports in, not in that order)
    pids = {num: int(re.search(r"--- zoo job started .* \(pid (\d+)\) ---", (tmp_path / str(num) / "console.log")
                               .read_text())[1]) for num in range(6)}
    assert max(pids[n] for n in (2, 3, 4, 5)) < min(pids[0], pids[1]), pids
    [pkm] = [ln for ln in lines if "[#2 model.n_heads=2 ffn=pkm] refused: " in ln]
    assert pkm.endswith("refused: budget: no size of ffn 'pkm' fits with mha: at size 1 the model still has "
                        "41,220 total parameters, more than the baseline's 16,544 (the FFN's parameters that its "
                        "size does not scale); valid: fewer of those (the FFN's other options), or budget=null"), pkm
    from omegaconf import OmegaConf

    # Hydra's layout, as any launcher leaves it: multirun.yaml, and per job <num>/.hydra/ with its job number
    assert (tmp_path / "multirun.yaml").is_file()
    for num in range(6):
        hydra_yaml = OmegaConf.load(tmp_path / str(num) / ".hydra" / "hydra.yaml")
        assert hydra_yaml.hydra.job.num == num and hydra_yaml.hydra.job.id == f"train_{num}"
        assert (tmp_path / str(num) / ".hydra" / "overrides.yaml").is_file()
    runs = {tuple(sorted(o for o in s["overrides"] if o.startswith(("ffn=", "model.n_heads=")))): s
            for s in (json.loads(p.read_text()) for p in tmp_path.glob("*/summary.json"))}
    assert {k: s["status"] for k, s in runs.items()} == {
        ("ffn=gelu", "model.n_heads=2"): "completed", ("ffn=swiglu", "model.n_heads=2"): "completed",
        ("ffn=gelu", "model.n_heads=3"): "failed", ("ffn=swiglu", "model.n_heads=3"): "failed",
        ("ffn=pkm", "model.n_heads=2"): "failed", ("ffn=pkm", "model.n_heads=3"): "failed"}
    gelu, swiglu = runs["ffn=gelu", "model.n_heads=2"], runs["ffn=swiglu", "model.n_heads=2"]
    assert abs(swiglu["params"]["total"] - gelu["params"]["total"]) <= 0.01 * gelu["params"]["total"]
    from zoo.layers.ffn import default_d_ff

    assert swiglu["budget"]["d_ff"] != default_d_ff(32, gated=True)  # resized, and the summary says so
    assert swiglu["model"]["ffn"]["d_ff"] == swiglu["budget"]["d_ff"]


def test_unknown_budget_is_refused(tmp_path, capsys):
    from tests.helpers import compose_cfg
    from zoo.training import main

    assert main(compose_cfg(TINY + ["budget=flops"]), tmp_path) == 2
    assert "budget: unknown 'flops'; valid: params, active_params, null" in capsys.readouterr().err


def _train_py(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "train.py", "-m", *args, f"hydra.sweep.dir={tmp_path}"]
    return zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


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
    search still finishes and writes its result; refused whole, it exits 2 (docs/reliability.md)."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    tiny = [o for o in TINY if not o.startswith("model.n_heads=")]
    proc = _train_py(tmp_path, "hparams_search=lr_warmup", *tiny, "logger=none", "hydra.sweeper.n_trials=2",
                     "model.n_heads=3")
    assert proc.returncode == 2 and "error: all 2 jobs of the sweep were refused" in proc.stderr, proc.stderr[-3000:]
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


def test_a_sweep_run_one_job_after_another_ends_as_a_parallel_one(tmp_path):
    """Hydra's basic launcher: the jobs share the console, so none prints its sample; the sweep's last lines say
    where its runs are and how to compare them, in the command the user typed (`zoo train`: `zoo report`)."""
    cmd = [sys.executable, "-m", "zoo", "train", "-m", *TINY, "logger=csv", "ffn=relu,gelu",
           "sample.max_new_tokens=8", f"hydra.sweep.dir={tmp_path}"]
    proc = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "--- sample" not in proc.stdout and sum("completed: 4 steps" in ln for ln in lines) == 2, proc.stdout
    assert lines[-2:] == [f"sweep: 2 runs in {tmp_path} (2 completed)", f"compare them: zoo report {tmp_path}"]


def test_a_study_ends_with_its_report(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    proc = _train_py(tmp_path, "study=position", *TINY, "logger=csv", "position=learned,alibi", "seed=0,1",
                     "data.long_context=32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (tmp_path / "report.md").read_text()
    variants, effects = report.split("## Effects against learned")  # the study's baseline: position=learned
    lines = [" ".join(ln.split()) for ln in variants.splitlines()]  # without the table's cell padding
    rows = [ln for ln in lines if ln.startswith(("| learned |", "| alibi |"))]
    assert len(rows) == 2 and all(" ± " in r and "[" in r for r in rows)  # mean ± std and a CI over 2 seeds
    assert "| alibi |" in " ".join(effects.split())  # alibi's effect against the baseline
    long = (tmp_path / "report_val_loss_long" / "report.md").read_text()
    assert "val_loss_long" in long and (tmp_path / "report_val_loss_long" / "curves.png").is_file()
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    assert summary["model"]["max_seq_len"] == 32 and "val_loss_long" in summary["final"]


# A test-only Hydra callback: Hydra calls on_job_start in the process that runs the job, so it can SIGKILL
# that process once the run has started training (config.yaml is written just before), as the out-of-memory
# killer would. zoo's training path has no hook for it.
KILL_HOOK = '''
import os, signal, threading, time
from pathlib import Path

from hydra.experimental.callback import Callback


class KillJob(Callback):
    def __init__(self, num):
        self.num = num

    def on_job_start(self, config, **kwargs):
        if config.hydra.job.num != self.num:
            return
        run_dir = Path(config.hydra.runtime.output_dir)

        def kill():
            while not (run_dir / "config.yaml").exists():
                time.sleep(0.002)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()


class MarkEnd(Callback):
    def on_multirun_end(self, config, **kwargs):
        (Path(config.hydra.sweep.dir) / "ended").write_text("")
'''

# A Hydra app without zoo's training: the launcher alone, in seconds. Job `kill` SIGKILLs itself; job
# `kill_server` SIGKILLs the fork server it was forked from, then finishes after the others started.
TINY_APP = '''
import os, signal, time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig


@hydra.main(version_base="1.3", config_path=None, config_name=None)
def main(cfg):
    job = HydraConfig.get()
    by_server = b"forkserver" in Path(f"/proc/{os.getppid()}/cmdline").read_bytes()  # forked by the fork server
    if job.job.num == cfg.kill:
        os.kill(os.getpid(), signal.SIGKILL)
    if job.job.num == cfg.get("kill_server"):
        server = os.getppid()
        assert b"forkserver" in Path(f"/proc/{server}/cmdline").read_bytes()
        os.kill(server, signal.SIGKILL)
        time.sleep(2)
    term = signal.getsignal(signal.SIGTERM)
    (Path(job.runtime.output_dir) / "done").write_text(f"{os.getpid()} {by_server} {term!r}")
    return job.job.num


if __name__ == "__main__":
    main()
'''


def _kill_job(tmp_path: Path, num: int) -> tuple[dict, list[str]]:
    """The environment and overrides that make the sweep's job `num` SIGKILL itself mid-run."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "kill_hook.py").write_text(KILL_HOOK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return env, ["+hydra.callbacks.kill._target_=kill_hook.KillJob", f"+hydra.callbacks.kill.num={num}"]


LONGER = [o for o in TINY if not o.startswith("trainer.max_steps=")]  # + max_steps=200: killed mid-run


def _run_killing(cmd: list[str], job_dir: Path) -> subprocess.CompletedProcess:
    """Run a zoo sweep and SIGKILL the job that owns `job_dir` once it is training (its config.yaml is
    written): the pid comes from the job's run.lock, as the out-of-memory killer would pick a process. From
    outside, because train.py refuses a test-only `_target_` (zoo.training.safety)."""
    import threading

    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def killer():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            lock, config = job_dir / "run.lock", job_dir / "config.yaml"
            if config.is_file() and lock.is_file() and (pid := lock.read_text().strip()).isdigit():
                os.kill(int(pid), signal.SIGKILL)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    out, _ = proc.communicate(timeout=900)
    thread.join(timeout=5)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


@pytest.mark.parametrize("start", ["auto", "forkserver", "spawn", "forkserver killed"])
def test_parallel_launcher_survives_a_killed_job(tmp_path, start):
    """The launcher alone: of 5 jobs, 2 at a time, job 1's process is SIGKILLed; the other 4 run, each in its
    own process with SIGTERM's default handler (not the launcher's), and the multirun exits 0 and runs its end
    callback. Also when job 0 kills the fork server (its sentinels then fire while its children still run): job 0
    still delivers, later jobs get a new server. auto: forked from the sweep's process (a warm interpreter, which
    has torch and one thread)."""
    sweep = tmp_path / "sweep"
    env, _ = _kill_job(tmp_path, 1)
    (tmp_path / "hooks" / "tiny_app.py").write_text(TINY_APP)
    cmd = [sys.executable, str(tmp_path / "hooks" / "tiny_app.py"), "-m", "hydra/launcher=parallel",
           "hydra.launcher.n_jobs=2", f"hydra.launcher.start_method={start.split()[0]}",
           f"hydra.searchpath=[file://{ROOT / 'conf'}]", "+kill=1", "+x=0,1,2,3,4", f"hydra.sweep.dir={sweep}",
           "+hydra.callbacks.end._target_=kill_hook.MarkEnd"] + (["+kill_server=0"] if "killed" in start else [])
    proc = zygote.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert (sweep / "ended").is_file()
    done = {p.parent.name: p.read_text() for p in sweep.glob("*/done")}
    assert sorted(done) == ["0", "2", "3", "4"] and len(set(done.values())) == 4  # one process per job
    assert {d.split(" ", 2)[2] for d in done.values()} == {"<Handlers.SIG_DFL: 0>"}
    if "killed" not in start:  # where it is, a job started beside job 0 may find its server already gone
        # auto forks from a warm interpreter; a new one (ZOO_FRESH_INTERPRETER=1) has no torch: the fork server
        fresh = os.environ.get("ZOO_FRESH_INTERPRETER") == "1"
        assert {d.split(" ")[1] for d in done.values()} == {str(start == "forkserver" or start == "auto" and fresh)}
    assert (sweep / "1" / ".hydra" / "overrides.yaml").is_file()
    # With the server killed, job 1 (started beside job 0) races it: its SIGKILL is reported if the server saw
    # it first; once the server is gone multiprocessing can only give 255, the status lost with it.
    how = "was killed by SIGKILL" if "killed" not in start else "(was killed by SIGKILL|ended with exit code 255)"
    assert re.search(rf"#1 : [^\n]* : its process {how} before the job finished", out), out[-3000:]
    assert "1 of 5 jobs died before finishing: #1" in out


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_sweep_stops_it_and_its_running_jobs(tmp_path, sig):
    """4 runs, 2 at a time, none of which would end by itself, the sweep started with SIGINT ignored (as a script's
    background job or nohup starts it). Once both run, `sig` goes to the sweep's process alone: no other job starts,
    each running one stops at a step (last.ckpt, an `interrupted` summary), and the sweep ends."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "train.py", "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "threads=1",
           *LONGER, "trainer.max_steps=1000000", "trainer.val_check_interval=1000000", "logger=csv",
           "seed=0,1,2,3", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 300
        while not all((sweep / job / "metrics.csv").is_file() for job in "01"):
            assert proc.poll() is None and time.monotonic() < deadline, "the sweep ended before both jobs ran"
            time.sleep(0.1)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)  # a step and a checkpoint each: seconds
    finally:
        with contextlib.suppress(ProcessLookupError):  # the jobs too, if they outlived it
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, out[-3000:]
    assert "interrupted: waiting for 2 running jobs to stop" in out, out[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.name.isdigit()) == ["0", "1"], out[-3000:]  # none started
    for job in "01":
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["steps"] >= 1, summary
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_a_study_survives_a_killed_run(tmp_path):
    """4 runs, 2 at a time (the study presets' launcher); run 1 is SIGKILLed mid-run. The other three finish,
    the killed one is left without summary.json and unlocked (the report counts it as killed), the multirun
    exits 0 and ends with its report. Hydra's joblib launcher fails this: TerminatedWorkerError, exit 1."""
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "train.py", "-m", "study=ffn", *LONGER, "logger=csv", "budget=null", "ffn=gelu",
           "seed=0,1,2,3", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}", "trainer.max_steps=200"]
    proc = _run_killing(cmd, sweep / "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    from zoo.io import is_running
    from zoo.report import load_runs

    statuses = {r.path.name: r.status for r in load_runs(sweep)}
    assert statuses == {"0": "completed", "1": "killed", "2": "completed", "3": "completed"}, statuses
    killed = sweep / "1"
    assert (killed / "config.yaml").is_file() and not (killed / "summary.json").exists()  # killed mid-run
    assert not is_running(killed)
    assert "killed by SIGKILL" in out
    assert (sweep / "report.md").is_file() and (sweep / "multirun.yaml").is_file()


@pytest.mark.slow
def test_optuna_search_with_the_parallel_launcher_survives_a_killed_trial(tmp_path):
    """Two trials at a time through zoo's launcher; trial 1 is SIGKILLed. The search still gets every other
    trial's returned metric, counts the killed trial as failed, and ends with its result."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "train.py", "-m", "hparams_search=lr_warmup", *LONGER, "logger=none",
           "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=4",
           f"hydra.sweep.dir={sweep}", "trainer.max_steps=200"]
    proc = _run_killing(cmd, sweep / "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    summaries = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/summary.json")}
    assert sorted(summaries) == ["0", "2", "3"] and all(s["status"] == "completed" for s in summaries.values())
    assert "Failed experiment" in out  # Optuna's word for the killed trial
    from omegaconf import OmegaConf

    result = OmegaConf.load(sweep / "optimization_results.yaml")
    assert result.best_value == pytest.approx(min(s["final"]["val_loss"] for s in summaries.values()))


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"n_jobs": 0}, "n_jobs: 0 is not a number of parallel jobs; valid: a positive integer, or -1 for one per CPU"),
    ({"n_jobs": -2}, "n_jobs: -2 is not a number of parallel jobs; valid: a positive integer, or -1 for one per CPU"),
    ({"n_jobs": "two"}, "n_jobs: 'two' is not a number of parallel jobs; valid: a positive integer, or -1 for one "
                        "per CPU"),
    ({"start_method": "fork"}, "start_method: unknown 'fork'; valid: auto, forkserver, spawn"),
    ({"preload": "torch"}, "preload: 'torch' is not a list of module names; valid: a list such as "
                           "[zoo.training.runner]")])
def test_parallel_launcher_refuses_bad_settings(kwargs, error, capsys):
    from hydra_plugins.zoo_launcher.parallel_launcher import ParallelLauncher

    with pytest.raises(SystemExit) as exit_:
        ParallelLauncher(**kwargs)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: hydra.launcher.{error}\n"
    assert ParallelLauncher(n_jobs=3).n_jobs == 3 and ParallelLauncher(n_jobs=-1).n_jobs >= 1


def test_a_parallel_sweeps_console_names_the_job_of_every_line(tmp_path):
    """Two jobs side by side: each one's banner, progress bar, result and sample go to its own console.log, and
    the sweep's console has a line per job when it starts and ends, each naming the job."""
    cmd = [sys.executable, "train.py", "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", *TINY,
           "ffn=relu,gelu", "sample.max_new_tokens=8", f"hydra.sweep.dir={tmp_path}"]
    proc = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    sweep_lines = ("ParallelLauncher(n_jobs=2) is launching", "Launching jobs, sweep output dir", "\t#0 : ", "\t#1 : ")
    assert lines[-2:] == [f"sweep: 2 runs in {tmp_path} (2 completed)",
                          f"compare them: python -m zoo.report {tmp_path}"]
    about_jobs = [ln for ln in lines[:-2] if not any(s in ln for s in sweep_lines)]
    [disk] = [ln for ln in about_jobs if "] disk: " in ln]  # a sweep line, said once before the jobs start
    assert "the 2 runs will keep about" in disk \
        and "(checkpoints=best_weights: last with the optimizer's state, best as weights)" in disk
    about_jobs.remove(disk)
    assert about_jobs and all(re.search(r"\[#[01] ffn=(relu|gelu)\]", ln) for ln in about_jobs), about_jobs
    for num, ffn in ((0, "relu"), (1, "gelu")):
        assert any(f"[#{num} ffn={ffn}] started; its console:" in ln for ln in about_jobs)
        assert any(f"[#{num} ffn={ffn}] completed in" in ln and "val_loss" in ln for ln in about_jobs)
        console = (tmp_path / str(num) / "console.log").read_text()
        assert f"/{ffn}" in console and "completed: 4 steps" in console and "--- sample" in console


START_METHOD = """
import os, sys
from hydra_plugins.zoo_launcher._core import start_method
print(start_method("auto"), start_method("spawn"))
"""


@pytest.mark.parametrize(("before", "chosen"), [
    ("", "forkserver"),  # a new interpreter: the fork server imports torch once for the jobs
    ("import torch", "fork"),  # has torch and one thread: a fork is what the server would give
    ("import torch, pyarrow", "fork"),  # and jemalloc's background thread (the report's pandas), which forks well
    ("import torch; torch.set_num_threads(2); torch.randn(1 << 20).exp().sum()", "forkserver"),  # OpenMP's pool
    ("import torch, threading, time; threading.Thread(target=time.sleep, args=(5,), daemon=True).start()",
     "forkserver"),  # another thread, which may hold a lock a fork would find held
])
def test_auto_forks_the_jobs_only_from_a_process_with_torch_and_one_thread(before, chosen):
    """A fork of a process whose OpenMP pool has started hangs at the child's first parallel op: auto forks only
    where the kernel counts no other thread (but jemalloc's). An explicit method is kept."""
    proc = subprocess.run([sys.executable, "-c", before + "\n" + START_METHOD], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [chosen, "spawn"]


def test_auto_sends_the_jobs_to_the_fork_server_when_a_preload_starts_a_thread(tmp_path):
    """auto imports the preload in the sweep's process before forking the jobs from it: a preload module whose
    import starts a thread leaves a fork unsafe again, so the jobs go to the fork server after all."""
    (tmp_path / "spins.py").write_text("import threading, time\n"
                                       "threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n")
    code = ("import torch\nfrom hydra_plugins.zoo_launcher._core import jobs_start_method\n"
            "print(jobs_start_method('auto', ['json']), jobs_start_method('auto', ['spins']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["fork", "forkserver"]


def test_the_disk_estimate_leaves_the_sweeps_own_process_without_torch():
    """The launcher's disk estimate counts parameters with torch, which the fork server has imported for the jobs:
    computed there, it says the same as computed here, and the sweep's own process never imports torch. The same
    process says which preload modules the server lacks."""
    import cloudpickle
    from hydra import compose, initialize_config_dir

    from hydra_plugins.zoo_launcher import _core

    code = textwrap.dedent(f"""
        import multiprocessing, sys, cloudpickle
        from hydra import compose, initialize_config_dir
        from hydra_plugins.zoo_launcher import _core
        with initialize_config_dir(config_dir={str(ROOT / "conf")!r}, version_base=None):
            cfg = compose("config", overrides=["checkpoints=last", "ffn=swiglu"])
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["zoo.build", "no_such_module"])
        disk, unloaded, _ = _core._ask_fork_server(ctx, [cloudpickle.dumps(cfg)] * 3, ["zoo.build", "no_such_module"])
        print(disk, unloaded, "torch" in sys.modules, sep="\\n")""")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        here = _core.disk_estimate([cloudpickle.dumps(compose("config", overrides=["checkpoints=last",
                                                                                   "ffn=swiglu"]))] * 3)
    assert here is not None and "the 3 runs will keep about" in here
    assert proc.stdout.splitlines() == [here, "['no_such_module']", "False"]


def test_the_launcher_judges_zoo_runs_alone_before_starting_them():
    """refusals: each job's refusal by the checks a zoo run makes before its data loads; None for a job that passes
    them, one whose config did not compose, and another Hydra app's (its jobs are not zoo's to judge)."""
    import cloudpickle
    from hydra import compose, initialize_config_dir

    from hydra_plugins.zoo_launcher import _core

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        good, bad = (compose("config", overrides=[*TINY, *extra], return_hydra_config=True)
                     for extra in ([], ["model.n_heads=3"]))
        other = compose("config", overrides=["~model", "~data"], return_hydra_config=True)
    configs = [None] + [cloudpickle.dumps(c) for c in (other, good, bad)]
    assert _core.refusals(configs) == [None, None, None, "model.d_model: 32 is not divisible by n_heads=3"]


@pytest.mark.parametrize("start", ["forkserver", "auto"])
def test_a_preload_the_fork_server_cannot_import_is_one_warning(tmp_path, start):
    """multiprocessing's fork server passes over a preload module it cannot import without a word, and every job
    then imports the training stack itself: the sweep says so once, and runs. The same where the jobs are forked
    from the sweep's process (auto, in a warm interpreter), which imports the preload itself."""
    (tmp_path / "tiny_app.py").write_text(TINY_APP)
    cmd = [sys.executable, "tiny_app.py", "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2",
           f"hydra.searchpath=[file://{ROOT / 'conf'}]", "+kill=-1", "+x=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}",
           "hydra.launcher.preload=[hydra,zoo.trainig.runner]", f"hydra.launcher.start_method={start}"]
    proc = zygote.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "checks that need no data" not in out  # not a zoo run: not zoo's to judge
    warnings = [ln for ln in out.splitlines() if "hydra.launcher.preload" in ln]
    assert len(warnings) == 1 and warnings[0].endswith(
        "hydra.launcher.preload: the jobs' processes could not import zoo.trainig.runner; each job imports what it "
        "needs itself, seconds of CPU each"), out[-3000:]
    assert sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/done")) == ["0", "1"]


@pytest.mark.parametrize("error", [OSError, EOFError])
def test_a_job_handed_to_a_dying_fork_server_is_handed_again(monkeypatch, error):
    """The fork server can die as a job is handed to it: it refuses the connection (OSError), or it forks the job
    and dies before sending back its pid (EOFError from multiprocessing). Either way the launcher starts the job
    again, from a new server, instead of ending the sweep with a traceback; the third failure in a row is raised."""
    import multiprocessing

    from hydra_plugins.zoo_launcher import _core

    ctx = multiprocessing.get_context("spawn")
    starts, fails = [], 3  # the start that succeeds: the third

    def start(self):
        starts.append(self.name)
        if len(starts) < fails:
            raise error("the fork server died")

    monkeypatch.setattr(ctx.Process, "start", start)
    job = _core._start(ctx, b"", None, 0, 7, ["x=1"], own_console=False)
    assert starts == ["hydra job 7"] * 3 and job.num == 7 and job.overrides == ["x=1"]
    starts.clear()
    fails = 4
    with pytest.raises(error):
        _core._start(ctx, b"", None, 0, 7, ["x=1"], own_console=False)
    assert len(starts) == 3
