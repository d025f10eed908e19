"""Hostile run directories: every path a run writes or reads back, made a link out of the directory, a directory
where a file belongs (and the reverse), truncated or with flipped bytes, on a read-only or a full file system.
Each case ends in one line on stderr starting `error:` and exit code 2 (or, where zoo rewrites what it does not
need, a completed run), and a marker outside the directory stays byte-identical."""

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import zygote
from tests.helpers import TINY, compose_cfg
from zoo.io import RUN_ENTRIES
from zoo.training.runner import main, run

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["logger=csv", "threads=1", "sample.max_new_tokens=0"]
MODES = {"resume": ["ckpt_path=last"], "overwrite": ["overwrite=true", "seed=1"], "fresh": ["seed=1"]}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A completed tiny run (4 steps, checkpoints at 2 and 4), copied by each case."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert run(compose_cfg(TINY + QUIET), run_dir=run_dir) == 0
    return run_dir


@pytest.fixture
def outside(tmp_path) -> Path:
    """A directory outside every run, holding a marker file; the test fails if anything in it changes."""
    out = tmp_path / "outside"
    (out / "sub").mkdir(parents=True)
    (out / "marker.txt").write_bytes(b"outside: must stay byte-identical\n")
    (out / "sub" / "last.ckpt").write_bytes(b"not a checkpoint of this run")
    (out / ".last.ckpt.abcd1234.tmp").write_bytes(b"looks like a temp file zoo would clean up")
    before = _snapshot(out)
    yield out
    assert _snapshot(out) == before, "a file outside the run directory changed"


def _snapshot(directory: Path) -> dict:
    return {str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _copy(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return dst


def _main(capsys, overrides: list[str], run_dir: Path) -> tuple[int, str]:
    capsys.readouterr()
    code = main(compose_cfg(TINY + QUIET + overrides), run_dir)
    return code, capsys.readouterr().err


def _one_line(err: str, *words: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


# --- damages: each turns `path` into something zoo must not write through or trust -------------------------

def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def link_out(path: Path, outside: Path, kind: str) -> None:
    _remove(path)
    path.symlink_to(outside / "marker.txt" if kind == "file" else outside)


def dir_for_file(path: Path, outside: Path, kind: str) -> None:
    _remove(path)
    path.mkdir()
    (path / "keep.txt").write_text("a user's file")


def file_for_dir(path: Path, outside: Path, kind: str) -> None:
    _remove(path)
    path.write_text("a user's file")


def truncate(path: Path, outside: Path, kind: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip(path: Path, outside: Path, kind: str) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(max(0, middle - 32), min(len(data), middle + 32)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


# What a resume does with a damaged file that is there and of the right kind: refuses in one line (the words
# it must say), or rewrites it and completes (None): config.yaml, summary.json, hparams.yaml and best.ckpt are
# written, never read back, by a resume; run.lock holds only a pid.
CONTENT = {
    (".zoo-run", truncate): ["is not a zoo run marker"], (".zoo-run", flip): ["is not a zoo run marker"],
    ("checkpoints/last.ckpt", truncate): ["error: checkpoint: ", "last.ckpt'"],
    ("checkpoints/last.ckpt", flip): ["error: checkpoint: ", "last.ckpt'"],
    ("metrics.csv", flip): ["is not a CSV history zoo can read", "move it aside"],
}
FILES = [n for n, kind in RUN_ENTRIES.items() if kind == "file"]
DIRS = [n for n, kind in RUN_ENTRIES.items() if kind == "dir"]
CASES = ([(n, link_out, m) for n in RUN_ENTRIES for m in MODES]
         + [(n, dir_for_file, m) for n in FILES for m in ("resume", "overwrite")]
         + [(n, file_for_dir, m) for n in DIRS for m in ("resume", "overwrite")]
         # console.log: a parallel sweep's launcher appends to it and nothing reads it back; a run has none here
         + [(n, damage, "resume") for n in FILES if n != "console.log" for damage in (truncate, flip)])


@pytest.mark.parametrize("name,damage,mode", CASES, ids=[f"{n}-{d.__name__}-{m}" for n, d, m in CASES])
def test_a_damaged_run_directory(finished, outside, tmp_path, capsys, name, damage, mode):
    run_dir = _copy(finished, tmp_path / "run")
    path = run_dir / name
    damage(path, outside, RUN_ENTRIES[name])
    damaged = _snapshot(run_dir)
    code, err = _main(capsys, MODES[mode], run_dir)
    if damage in (truncate, flip) and (name, damage) not in CONTENT:
        assert code == 0, err  # rewritten (or, run.lock, only a pid): the resume completes
        return
    expected = {link_out: ["is a symbolic link"], dir_for_file: ["where zoo keeps a file"],
                file_for_dir: ["where zoo keeps a directory"]}.get(damage) or CONTENT[(name, damage)]
    assert code == 2, err
    _one_line(err, *expected)
    after = _snapshot(run_dir)
    if damage in (truncate, flip):  # refused once it held the lock (the checkpoint, the history are read then)
        after.pop("run.lock"), damaged.pop("run.lock")
    assert after == damaged, "a refused run changed its directory"


def test_overwrite_leaves_a_look_alike_alone(tmp_path, outside, capsys):
    """A user's directory with zoo's file names but no marker: refused in one line naming what is there."""
    look = tmp_path / "mine"
    (look / "checkpoints").mkdir(parents=True)
    (look / "config.yaml").write_text("my: own config\n")
    (look / "checkpoints" / "weights.pt").write_bytes(b"my weights")
    (look / "metrics.csv").write_text("a,b\n1,2\n")
    before = _snapshot(look)
    for mode in MODES.values():
        code, err = _main(capsys, mode, look)
        assert code == 2
        _one_line(err, f"'{look}' holds config.yaml, metrics.csv, checkpoints but no .zoo-run marker")
    assert _snapshot(look) == before and sorted(p.name for p in look.iterdir()) == \
        ["checkpoints", "config.yaml", "metrics.csv"]


def test_overwrite_removes_only_what_zoo_wrote(finished, tmp_path, capsys):
    run_dir = _copy(finished, tmp_path / "run")
    old_id = (run_dir / ".zoo-run").read_text()
    (run_dir / "notes.txt").write_text("mine")
    (run_dir / "checkpoints" / "my.pt").write_bytes(b"mine too")
    code, err = _main(capsys, MODES["overwrite"], run_dir)
    assert code == 0, err
    assert (run_dir / "notes.txt").read_text() == "mine" and (run_dir / "checkpoints" / "my.pt").exists()
    assert (run_dir / ".zoo-run").read_text() != old_id  # a new run, a new id
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]["cfg"]["seed"] == 1


def test_a_run_directory_below_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("a file")
    code, err = _main(capsys, [], tmp_path / "file" / "run")
    assert code == 2
    _one_line(err, f"could not write '{tmp_path / 'file' / 'run'}': Not a directory")


def test_a_marker_that_is_a_link_or_a_directory_is_no_marker(tmp_path, outside, capsys):
    for make in (lambda p: p.symlink_to(outside / "marker.txt"), lambda p: p.mkdir()):
        run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run_dir.mkdir()
        make(run_dir / ".zoo-run")
        code, err = _main(capsys, [], run_dir)
        assert code == 2
        _one_line(err, f"'{run_dir / '.zoo-run'}' is ")
        assert sorted(p.name for p in run_dir.iterdir()) == [".zoo-run"]  # no lock, nothing else


# --- read-only and full file systems -------------------------------------------------------------------------

@contextlib.contextmanager
def _mount(target: Path, *args: str):
    """mount(8) on `target` for the block's duration; the test is skipped where mounting is not allowed."""
    target.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here ({proc.stderr.strip()}): run as root to test full and read-only disks")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)


@contextlib.contextmanager
def _read_only(directory: Path):
    with _mount(directory, "--bind", str(directory)):
        subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True)
        yield directory


def _fill(mount: Path) -> None:
    """Take every free byte of the file system at `mount`."""
    with contextlib.suppress(OSError), open(mount / "filler", "ab", buffering=0) as f:
        while True:
            f.write(b"\0" * 4096)


@pytest.mark.parametrize("mode", ["resume", "fresh"])
def test_a_read_only_run_directory(finished, tmp_path, outside, capsys, mode):
    ro = tmp_path / "ro"
    ro.mkdir()
    run_dir = _copy(finished, ro / "run") if mode == "resume" else ro / "new"
    with _read_only(ro):
        code, err = _main(capsys, MODES[mode] if mode == "resume" else [], run_dir)
    assert code == 2
    _one_line(err, "could not write", "Read-only file system")


# Where each of a run's writes happens: the disk is filled (for real: a small tmpfs) just before it.
WRITES = {".zoo-run": ("zoo.training.run_dir", "write_marker"), "run.lock": ("zoo.training.run_dir", "lock_run_dir"),
          "config.yaml": ("zoo.training.runner", "atomic_write_text"),
          "hparams.yaml": ("zoo.training.callbacks", "HistoryWriter.log_hparams"),
          "metrics.csv": ("zoo.training.callbacks", "HistoryWriter.save"),
          "checkpoints/best.ckpt": ("zoo.training.checkpoint_io", "AtomicCheckpointIO.save_checkpoint"),
          "summary.json": ("zoo.training.runner", "summarize")}


@pytest.mark.parametrize("target", WRITES)
def test_a_disk_that_fills_before_a_write(tmp_path, capsys, monkeypatch, target):
    import importlib

    module, attr = WRITES[target]
    owner = importlib.import_module(module)
    if "." in attr:
        cls, attr = attr.split(".")
        owner = getattr(owner, cls)
    real = getattr(owner, attr)

    def filled_first(*args, **kwargs):
        if not (target == "metrics.csv" and not args[0].metrics):  # a save with no rows writes nothing
            _fill(disk)
        return real(*args, **kwargs)

    with _mount(tmp_path / "disk", "-t", "tmpfs", "-o", "size=2m", "tmpfs") as disk:
        monkeypatch.setattr(owner, attr, filled_first)
        code, err = _main(capsys, [], disk / "run")
    assert code == 2
    _one_line(err, f"could not write '{disk / 'run' / target}': No space left on device",
              "; no checkpoint was written" if target != "summary.json" else "; the last good checkpoint is")


def test_a_disk_that_fills_at_a_checkpoint_keeps_the_last_good_one(finished, tmp_path, capsys):
    """Room for the first evaluation's two checkpoints and the small files, not for the second's."""
    ckpt = (finished / "checkpoints" / "last.ckpt").stat().st_size
    size = 2 * ckpt + ckpt // 2 + 64 * 1024
    with _mount(tmp_path / "disk", "-t", "tmpfs", "-o", f"size={size}", "tmpfs") as disk:
        code, err = _main(capsys, [], disk / "run")
        last = disk / "run" / "checkpoints" / "last.ckpt"
        step = torch.load(last, weights_only=True)["global_step"]
    assert code == 2
    _one_line(err, f"No space left on device; the last good checkpoint is '{last}' (ckpt_path=last resumes")
    assert "could not write" in err and ".ckpt'" in err and step == 2


def test_a_file_size_limit_is_a_full_disk(tmp_path):
    """RLIMIT_FSIZE (`ulimit -f`): writes past it fail with EFBIG (Python ignores SIGXFSZ), said as a full disk."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))  # the small files fit, a checkpoint not

    run_dir = tmp_path / "run"
    proc = zygote.run([sys.executable, "train.py", *TINY, *QUIET, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                      capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert proc.returncode == 2, proc.stderr[-2000:]
    _one_line(proc.stderr, "could not write", "best.ckpt': File too large", "no checkpoint was written")


# --- train.py: what Hydra would write before zoo's code runs ------------------------------------------------

def _train_py(*args: str) -> subprocess.CompletedProcess:
    return zygote.run([sys.executable, "train.py", *TINY, *QUIET, *args], cwd=ROOT, capture_output=True,
                      text=True, timeout=300)


@pytest.mark.parametrize("case", ["file", "file-overwrite", "below-a-file", "sweep-file", "hydra-link", "multirun-link",
                                  "job-hydra-link", "read-only", "sweep-read-only", "look-alike"])
def test_train_py_refuses_an_unusable_output_directory_before_hydra_writes(tmp_path, outside, case):
    target = tmp_path / "out"
    args = [f"hydra.run.dir={target}"]
    words = []
    if case.startswith("file"):
        target.write_text("a file")
        args += ["overwrite=true"] if case == "file-overwrite" else []
        words = [f"hydra.run.dir: '{target}' is a file, not a directory"]
    elif case == "below-a-file":
        target.write_text("a file")
        args = [f"hydra.run.dir={target / 'run'}"]
        words = [f"hydra.run.dir: '{target / 'run'}' cannot be written ('{target}' is not a directory)"]
    elif case == "sweep-file":
        target.write_text("a file")
        args = ["-m", f"hydra.sweep.dir={target}", "seed=0,1"]
        words = [f"hydra.sweep.dir: '{target}' is a file, not a directory"]
    elif case == "hydra-link":
        target.mkdir()
        (target / ".hydra").symlink_to(outside)
        words = ["is a symbolic link"]
    elif case == "multirun-link":
        target.mkdir()
        (target / "multirun.yaml").symlink_to(outside / "marker.txt")
        args = ["-m", f"hydra.sweep.dir={target}", "seed=0,1"]
        words = ["multirun.yaml' is a symbolic link"]
    elif case == "job-hydra-link":
        (target / "0" / ".hydra").mkdir(parents=True)
        (target / "0" / ".hydra" / "overrides.yaml").symlink_to(outside / "marker.txt")
        args = ["-m", f"hydra.sweep.dir={target}", "seed=0,1"]
        words = ["overrides.yaml' is a symbolic link"]
    elif case == "look-alike":
        (target / "checkpoints").mkdir(parents=True)
        (target / "config.yaml").write_text("mine")
        args += ["overwrite=true"]
        words = ["holds config.yaml, checkpoints but no .zoo-run marker"]
    else:  # read-only
        target.mkdir()
        if case == "sweep-read-only":
            args = ["-m", f"hydra.sweep.dir={target}", "seed=0,1"]
        words = ["cannot be written (read-only file system)"]
    before = _snapshot(tmp_path) if target.exists() else None
    with _read_only(target) if "read-only" in case else contextlib.nullcontext():
        proc = _train_py(*args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    _one_line(proc.stderr, *words)
    assert "HYDRA_FULL_ERROR" not in proc.stderr
    if before is not None:
        assert _snapshot(tmp_path) == before


# --- zoo.report reading a hostile sweep directory ---------------------------------------------------------

@pytest.fixture
def sweep(finished, tmp_path) -> Path:
    root = tmp_path / "sweep"
    root.mkdir()
    for i in range(2):
        _copy(finished, root / str(i))
    (root / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
        "    params: null\n  overrides:\n    task: []\n")
    return root


REPORT_CASES = [(n, d) for n in ("0/summary.json", "0/metrics.csv", "multirun.yaml")
                for d in (link_out, dir_for_file, truncate, flip)]


@pytest.mark.parametrize("name,damage", REPORT_CASES, ids=[f"{n}-{d.__name__}" for n, d in REPORT_CASES])
def test_the_report_on_a_damaged_sweep(sweep, outside, capsys, name, damage):
    """A damaged run is counted unreadable (a link or a directory is not read; a truncated or garbled summary
    does not parse), a damaged plan falls back to the runs on disk; the report is written, never a traceback."""
    from zoo.report import main as report_main
    from zoo.report.runs import load_run, planned_jobs

    damage(sweep / name, outside, "file")
    capsys.readouterr()
    assert report_main([str(sweep)]) == 0
    assert capsys.readouterr().err == ""
    status = load_run(sweep / "0").status
    if name == "multirun.yaml":
        assert planned_jobs(sweep)[0] is None and status == "completed"
    elif name.endswith("metrics.csv") and damage in (truncate, flip):
        assert status == "completed"  # the summary holds the history; a broken CSV is read as far as it goes
    else:
        assert status == "unreadable"
    assert (sweep / "report.md").is_file()


@pytest.mark.parametrize("case", ["report-dir", "read-only", "report-link"])
def test_the_report_cannot_be_written(sweep, outside, capsys, case):
    from zoo.report import main as report_main

    capsys.readouterr()
    if case == "report-link":  # replaced by the report's own file, never written through
        (sweep / "report.md").symlink_to(outside / "marker.txt")
        assert report_main([str(sweep)]) == 0
        assert (sweep / "report.md").is_file() and not (sweep / "report.md").is_symlink()
        return
    if case == "report-dir":
        (sweep / "report.md").mkdir()
    with _read_only(sweep) if case == "read-only" else contextlib.nullcontext():
        code = report_main([str(sweep)])
    assert code == 2
    _one_line(capsys.readouterr().err, "could not write", "report.md'" if case == "report-dir" else "")
