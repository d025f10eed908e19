"""A run directory's guarantees: never overwritten, locked while running, its history kept across resumes,
untouchable by a crafted checkpoint, resumed only with the settings it was trained with."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests import zygote
from tests.helpers import TINY, compose_cfg
from zoo.training.runner import main, run

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["logger=csv", "threads=1", "sample.max_new_tokens=0"]


def _snapshot(directory: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple[bytes, int]]:
    """Every file under `directory` with its bytes and modification time."""
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name not in skip}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A completed tiny run (4 steps, evaluated at 2 and 4)."""
    run_dir = tmp_path_factory.mktemp("finished")
    assert run(compose_cfg(TINY + QUIET), run_dir=run_dir) == 0
    return run_dir


def _copy_run(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-a", f"{src}/.", str(dst)], check=True)
    return dst


def test_resuming_a_finished_run_keeps_its_metrics(finished, tmp_path, capsys):
    run_dir = _copy_run(finished, tmp_path / "run")
    before = (run_dir / "metrics.csv").read_bytes()
    assert before.count(b"\n") > 4
    assert main(compose_cfg(TINY + QUIET + ["ckpt_path=last"]), run_dir) == 0
    assert (run_dir / "metrics.csv").read_bytes() == before


def test_a_fresh_run_into_a_used_directory_is_refused(finished, tmp_path, capsys):
    run_dir = _copy_run(finished, tmp_path / "run")
    before = _snapshot(run_dir, skip=("run.lock",))  # the refusing run held the lock a moment
    capsys.readouterr()
    assert main(compose_cfg(TINY + QUIET + ["seed=1"]), run_dir) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: overwrite: '{run_dir}' already holds a run (config.yaml, metrics.csv, "
                          "summary.json") and "overwrite=true" in err and "\n" not in err, err
    assert _snapshot(run_dir, skip=("run.lock",)) == before

    assert main(compose_cfg(TINY + QUIET + ["seed=1", "overwrite=true"]), run_dir) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["seed"] == 1 and summary["status"] == "completed"
    with (run_dir / "metrics.csv").open() as f:
        assert [r.split(",")[1] for r in f.read().splitlines()[1:]] == \
            [r.split(",")[1] for r in before["metrics.csv"][0].decode().splitlines()[1:]]  # one run's rows, not two


def test_a_directory_holding_only_hydra_files_is_not_a_run(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (tmp_path / "train.log").write_text("")
    assert run(compose_cfg(TINY + QUIET), run_dir=tmp_path) == 0


def _hold_lock(run_dir: Path) -> subprocess.Popen:
    """Another process that owns `run_dir` until its stdin closes."""
    code = ("import sys; from zoo.io import lock_run_dir; f = lock_run_dir(sys.argv[1]); "
            "print('held' if f else 'busy', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.parametrize("how", ["train.py", "main"])
@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "ckpt_path=last"])
def test_a_second_run_in_a_busy_directory_stops_and_writes_nothing(finished, tmp_path, capsys, how, resume):
    run_dir = _copy_run(finished, tmp_path / "run")
    (run_dir / "summary.json").unlink()  # as while the first run trains: a failed summary would be written
    holder = _hold_lock(run_dir)
    try:
        before = _snapshot(run_dir)
        extra = ["ckpt_path=last"] if resume else []
        if how == "main":
            capsys.readouterr()
            code, err = main(compose_cfg(TINY + QUIET + extra), run_dir), capsys.readouterr().err.strip()
        else:
            proc = zygote.run([sys.executable, "train.py", *TINY, *QUIET, *extra, f"hydra.run.dir={run_dir}"],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
            code, err = proc.returncode, proc.stderr.strip()
        assert code == 2
        assert err == f"error: hydra.run.dir: '{run_dir}' is in use by a running process (pid {holder.pid}); " \
                      "wait for it to end or choose another directory", err
        assert _snapshot(run_dir) == before
    finally:
        holder.communicate("", timeout=60)


def test_the_lock_is_released_when_the_run_ends(finished, tmp_path):
    from zoo.io import is_running, lock_run_dir

    assert not is_running(finished)
    lock = lock_run_dir(finished)
    assert lock is not None
    lock.close()


# --- settings a resume must share with the run it resumes -------------------------------------------

MISMATCHES = [  # (override, the key named, the checkpoint's value, this run's value)
    ("seed=1", "seed", "0", "1"),
    ("data.batch_size=8", "data.batch_size", "4", "8"),
    ("optim.lr=0.002", "optim.lr", "0.001", "0.002"),
    ("optim.warmup_steps=3", "optim.warmup_steps", "100", "3"),
    ("trainer.max_steps=6", "trainer.max_steps", "4", "6"),
    ("trainer.gradient_clip_val=0.5", "trainer.gradient_clip_val", "1.0", "0.5"),
    ("trainer.precision=bf16-mixed", "trainer.precision", "'32-true'", "'bf16-mixed'"),
    ("data.context=24", "data.context", "16", "24"),
    ("compile=true", "compile", "False", "True"),
    ("budget=params", "budget", "None", "{"),
    ("+data.extra=1", "data.extra", "(not set)", "1"),
]


@pytest.mark.parametrize("override,key,theirs,ours", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_resume_with_other_settings_is_refused_naming_the_key(finished, tmp_path, capsys, override, key, theirs,
                                                              ours):
    ckpt = finished / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    assert main(compose_cfg(TINY + QUIET + [override, f"ckpt_path={ckpt}"]), tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: ckpt_path: '{ckpt}' was trained with other settings ({key}: checkpoint "
                          f"{theirs}, this run {ours}") and "\n" not in err, err


def test_resume_with_another_data_file_is_refused(tmp_path, capsys):
    texts = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for i, path in enumerate(texts):
        path.write_text("abcdefgh ijklmnop qrstuvwx yz\n" * 200 + "z" * i)
    base = TINY + QUIET + ["data=text_file"]
    assert run(compose_cfg(base + [f"data.path={texts[0]}"]), run_dir=tmp_path / "run") == 0
    capsys.readouterr()
    assert main(compose_cfg(base + [f"data.path={texts[1]}", "ckpt_path=last"]), tmp_path / "run") == 2
    assert f"(data.path: checkpoint '{texts[0]}', this run '{texts[1]}')" in capsys.readouterr().err


def test_resume_on_the_same_file_with_other_text_is_refused(tmp_path, capsys):
    """The same path, the same characters (so the same tokenizer), another text: the checkpoint's data
    fingerprint names the file; the same text again resumes."""
    text = tmp_path / "a.txt"
    text.write_text("abcdefgh ijklmnop qrstuvwx yz\n" * 200)
    original = text.read_bytes()
    base = TINY + QUIET + ["data=text_file", f"data.path={text}", "checkpoints=all"]
    assert run(compose_cfg(base), run_dir=tmp_path / "run") == 0
    text.write_text("yz qrstuvwx ijklmnop abcdefgh\n" * 200)
    capsys.readouterr()
    assert main(compose_cfg(base + ["ckpt_path=last"]), tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert err.startswith(f"error: ckpt_path: '{ckpt}' was trained on other data (data.path '{text}' now has "
                          "sha256 ") and "the checkpoint's" in err and "\n" not in err, err
    text.write_bytes(original)
    assert main(compose_cfg(base + ["ckpt_path=last"]), tmp_path / "run") == 0


@pytest.mark.parametrize("override", ["threads=2", "sample.max_new_tokens=5", "logger=none"])
def test_resume_may_change_what_does_not_change_the_result(finished, tmp_path, override):
    ckpt = finished / "checkpoints" / "last.ckpt"
    cfg = compose_cfg(TINY + QUIET + [f"ckpt_path={ckpt}", override])
    assert main(cfg, tmp_path / "run") == 0


# --- crafted checkpoints ---------------------------------------------------------------------------------

LONGER = ["trainer.max_steps=100", "trainer.val_check_interval=10", "data.eval_batches=1"]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> tuple[Path, str]:
    """A run stopped by SIGTERM after its first evaluation (steps left to train), and its output."""
    run_dir = tmp_path_factory.mktemp("interrupted")
    cmd = [sys.executable, "train.py", *TINY, *QUIET, *LONGER, f"hydra.run.dir={run_dir}"]
    part = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while not (run_dir / "checkpoints" / "best.ckpt").exists():
        assert part.poll() is None and time.time() < deadline, "run ended before it could be interrupted"
        time.sleep(0.02)
    part.send_signal(signal.SIGTERM)
    out, _ = part.communicate(timeout=300)
    assert part.returncode == 130, out[-2000:]
    return run_dir, out


def _victims(tmp_path: Path) -> tuple[Path, Path]:
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "precious.txt").write_text("keep me")
    (victim / "sub" / "data.bin").write_bytes(b"\0" * 10)
    return victim, tmp_path / "marker"


def _model_checkpoint_key(ckpt: dict) -> str:
    return next(k for k in ckpt["callbacks"] if k.startswith("ModelCheckpoint"))


def _craft_last_model_path(ckpt, victim, marker, run_dir):
    state = ckpt["callbacks"][_model_checkpoint_key(ckpt)]
    state.pop("dirpath")  # Lightning then takes the paths as this run's own
    state["last_model_path"] = f"local://{victim}"


def _craft_best_model_path(ckpt, victim, marker, run_dir):
    state = ckpt["callbacks"][_model_checkpoint_key(ckpt)]
    inside = str(run_dir / "checkpoints" / ".." / ".." / victim.name)  # passes Lightning's "in dirpath" check
    state.update(dirpath=str(run_dir / "checkpoints"), best_model_path=inside, kth_best_model_path=inside,
                 best_k_models={inside: torch.tensor(1e9)}, best_model_score=torch.tensor(1e9),
                 kth_value=torch.tensor(1e9))


def _craft_foreign_callback(ckpt, victim, marker, run_dir):
    ckpt["callbacks"]["ModelCheckpoint{'monitor': None}"] = {"dirpath": str(victim), "last_model_path": str(victim)}
    ckpt["callbacks"]["Evil"] = {"_target_": "os.system", "command": f"touch {marker}"}
    ckpt["evil_top_level"] = {"_target_": "os.system", "command": f"touch {marker}"}


@pytest.mark.parametrize("craft", [_craft_last_model_path, _craft_best_model_path, _craft_foreign_callback],
                         ids=lambda f: f.__name__.removeprefix("_craft_"))
def test_a_crafted_checkpoint_cannot_touch_files_outside_its_run(interrupted, tmp_path, craft):
    source, _ = interrupted
    run_dir = _copy_run(source, tmp_path / "run")
    victim, marker = _victims(tmp_path)
    before = _snapshot(victim)
    path = run_dir / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=True)
    step = ckpt["global_step"]
    craft(ckpt, victim, marker, run_dir)
    torch.save(ckpt, path)
    cmd = [sys.executable, "train.py", *TINY, *QUIET, *LONGER, f"hydra.run.dir={run_dir}", "ckpt_path=last"]
    proc = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _snapshot(victim) == before and not marker.exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 100 > step  # it did resume and train


@pytest.mark.parametrize("state,error", [
    ({"tokens": "many", "train_time": 1.0}, "Throughput.tokens must be a finite integer"),
    ({"tokens": 1, "train_time": float("nan")}, "Throughput.train_time must be a finite number"),
    ({"tokens": 1, "train_time": 1.0, "path": "/etc"}, "Throughput must hold tokens, train_time"),
])
def test_zoo_callback_state_of_the_wrong_shape_is_refused(interrupted, tmp_path, capsys, state, error):
    source, _ = interrupted
    ckpt = torch.load(source / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["callbacks"]["Throughput"] = state
    torch.save(ckpt, tmp_path / "odd.ckpt")
    capsys.readouterr()
    assert main(compose_cfg(TINY + QUIET + LONGER + [f"ckpt_path={tmp_path / 'odd.ckpt'}"]), tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: checkpoint: callback state {error}") and "\n" not in err, err


def test_checkpoint_io_removes_only_checkpoints_of_its_run(tmp_path):
    from zoo.training.checkpoint_io import AtomicCheckpointIO

    victim, _ = _victims(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "old.ckpt").write_bytes(b"x")
    io = AtomicCheckpointIO(tmp_path / "checkpoints")
    for path in (victim, f"local://{victim}", victim / "precious.txt", tmp_path / "checkpoints" / ".." / "victim"):
        io.remove_checkpoint(path)
    assert (victim / "precious.txt").is_file() and (victim / "sub" / "data.bin").is_file()
    io.remove_checkpoint(tmp_path / "checkpoints" / "old.ckpt")
    assert not (tmp_path / "checkpoints" / "old.ckpt").exists()


# --- the whole run's times, no weights_only warning -------------------------------------------------------

def test_resumed_summary_reports_the_whole_runs_time(interrupted, tmp_path, capsys):
    source, out = interrupted
    run_dir = _copy_run(source, tmp_path / "run")
    path = run_dir / "checkpoints" / "last.ckpt"
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["callbacks"]["Throughput"]["wall_time"] > 0  # the interrupted process's time is saved
    assert ckpt["callbacks"]["Throughput"]["eval_time"] > 0
    # as if it had run that long
    ckpt["callbacks"]["Throughput"].update(wall_time=5000.0, train_time=2000.0, eval_time=1000.0)
    torch.save(ckpt, path)
    capsys.readouterr()
    assert main(compose_cfg(TINY + QUIET + LONGER + ["ckpt_path=last"]), run_dir) == 0
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["wall_time_s"] > 5000 and s["train_time_s"] > 2000 and s["eval_time_s"] > 1000
    assert s["history"][-1]["wall_time_s"] > 5000  # evaluations after the resume count the whole run too
    assert s["tokens_per_second"] == pytest.approx(s["tokens_seen"] / s["train_time_s"])
    assert f"completed: 100 steps in {s['wall_time_s']:.1f}s" in capsys.readouterr().out


def test_no_weights_only_warning_when_interrupted_or_resumed(interrupted, tmp_path):
    source, out = interrupted
    run_dir = _copy_run(source, tmp_path / "run")
    cmd = [sys.executable, "train.py", *TINY, *QUIET, *LONGER, f"hydra.run.dir={run_dir}", "ckpt_path=last"]
    proc = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resuming from" in proc.stdout  # the banner says it resumed
    warning = "`weights_only` was not set"
    assert warning not in out and warning not in proc.stdout + proc.stderr


# --- temp files and permissions -------------------------------------------------------------------------

def test_orphan_temp_files_are_removed_at_the_next_run(finished, tmp_path):
    run_dir = _copy_run(finished, tmp_path / "run")
    orphans = [run_dir / ".metrics.csv.k2j_x9a1.tmp", run_dir / "checkpoints" / ".last.ckpt.abcd1234.tmp",
               run_dir / ".summary.json.ZZzz0099.tmp"]
    others = [run_dir / "notes.tmp", run_dir / ".notes.tmp", run_dir / ".x.short.tmp",
              run_dir / "checkpoints" / "a.ckpt"]
    for p in orphans + others:
        p.write_text("half")
    assert main(compose_cfg(TINY + QUIET + ["ckpt_path=last"]), run_dir) == 0
    assert not any(p.exists() for p in orphans) and all(p.exists() for p in others)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_get_the_umask_permissions(tmp_path, umask, mode):
    from zoo.io import atomic_write_text

    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "f.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == mode


def test_a_resumes_history_keeps_the_rows_it_redoes_until_it_logs_them_again(tmp_path):
    """Resumed from step 2: the earlier rows of steps 2 and 3 stay until this run's own rows pass them; a last
    line cut by a kill goes at once. Every file write is a rename."""
    from zoo.training.callbacks import HistoryWriter

    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,train_loss,val_loss\r\n0,0,4.5,\r\n0,1,4.4,\r\n0,1,,4.3\r\n0,2,4.2,\r\n0,3,4.1,\r\n"
                    "0,3,,4.0\r\n0,4,4.")
    writer = HistoryWriter(str(tmp_path), redo_from=2)
    steps = lambda: [(r["step"], r["train_loss"] or r["val_loss"]) for r in csv.DictReader(path.open())]  # noqa: E731
    old = [("0", "4.5"), ("1", "4.4"), ("1", "4.3"), ("2", "4.2"), ("3", "4.1"), ("3", "4.0")]
    assert steps() == old  # the cut line went, nothing else
    writer.log_metrics({"train_loss": 4.25}, step=2)
    writer.save()
    assert steps() == [*old[:3], ("2", "4.25"), *old[3:]]  # step 2 is not known to be complete yet
    writer.log_metrics({"train_loss": 4.15}, step=3)
    writer.save()
    assert steps() == [*old[:3], ("2", "4.25"), ("3", "4.15"), *old[4:]]  # step 2 passed: its old row went
    writer.settle(4)  # a checkpoint at step 4: every step before it is this run's
    assert steps() == [*old[:3], ("2", "4.25"), ("3", "4.15")]
    writer.log_metrics({"train_loss": 3.9}, step=4)
    writer.save()  # appended now
    assert steps()[-1] == ("4", "3.9") and len(steps()) == 6
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]  # rewritten through temp files, renamed
