"""Issue 38: every file zoo parses is bounded (size, depth, aliases, numbers), special files are refused where zoo
reads data, arguments are checked before the first run, overwrite=true removes only zoo's files, and the report
says what it means. Each row is a hostile file or argument; a marker file outside the run must stay byte-identical.
The parse-bound rows run in a subprocess under a memory limit (RLIMIT_AS) and a timeout."""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import zygote
from zoo.io import OVERWRITE_REMOVES, RUN_ENTRIES, RUN_MARKER, remove_run_files, write_marker

ROOT = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 4 << 30  # bytes of address space: torch's import fits; a billion items, or 10^11 jobs, do not
TIMEOUT_S = 120

DEEP_JSON = "[" * 100_000 + "]" * 100_000
DEEP_YAML = "a: " + "[" * 100_000 + "]" * 100_000 + "\n"
# a kilobyte that safe_load turns into 9^9 (387 million) references: expanded by any walk over it
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
PLAN_1E11 = ("hydra:\n  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
             "    params: {}\n  overrides:\n    task:\n    - seed=range(0,100000000000)\n")
SUMMARY = {"status": "completed", "final": {"val_loss": 2.0}, "overrides": ["seed=0"]}


def _outside(tmp_path: Path) -> tuple[Path, bytes]:
    marker = tmp_path / "outside.txt"
    marker.write_bytes(b"a file outside the run: must stay byte-identical\n")
    return marker, marker.read_bytes()


def _big(path: Path, size: int) -> None:
    with open(path, "wb") as f:  # sparse: instant, and over the bound without using the disk
        f.truncate(size)


def _run_bounded(code: str, tmp_path: Path) -> str:
    """`code` (it sets `out` to what it got) in a fresh interpreter under MEMORY_LIMIT and TIMEOUT_S; its one
    line of output. A traceback, a crash or a timeout fails the test."""
    script = "\n".join([
        "import resource, sys",
        f"resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT}, {MEMORY_LIMIT}))",
        "from pathlib import Path",
        f"tmp = Path({str(tmp_path)!r})",
        "try:",
        textwrap.indent(code, "    "),
        "except ValueError as e:  # zoo's one-line errors (ConfigError, DataError, FileFormatError, RunDirError)",
        "    out = 'error: ' + str(e)",
        "print(out)"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ZOO_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return lines[0]


def _summary(text: str):
    return lambda d: (d / "0").mkdir() or (d / "0" / "summary.json").write_text(text)


def _file(name: str, text: str, summary: dict | None = None):
    def make(d: Path):
        (d / "0" / name).parent.mkdir(parents=True, exist_ok=True)
        (d / "0" / name).write_text(text)
        if summary is not None:
            (d / "0" / "summary.json").write_text(json.dumps(summary))
    return make


# metrics.csv is read when the report first needs it (summary.json holds most runs' history): its damage is in the
# run's detail from then on
REPORT_RUN = ("from zoo.report.runs import load_run\nr = load_run(tmp / 'sweep' / '0')\nr.csv_history\n"
              "out = f'{r.status}: {r.detail}'")
# (id, make the hostile file under the sweep directory, code run on it, what its one line says)
PARSE_CASES = [
    ("summary-deep", _summary(DEEP_JSON), REPORT_RUN, "unreadable: summary.json nests more than 100 levels deep"),
    ("summary-400-digits", _summary('{"status": "completed", "params": {"total": ' + "9" * 400 + "}}"),
     REPORT_RUN, "unreadable: summary.json: the number 999999999999... (400 digits) is out of range"),
    ("summary-1e400-steps", _summary('{"status": "completed", "global_step": 1e400}'), REPORT_RUN,
     "unreadable: summary.json: the number 1e400 is out of range"),
    ("summary-too-large", lambda d: (d / "0").mkdir() or _big(d / "0" / "summary.json", 65 << 20), REPORT_RUN,
     "unreadable: summary.json is 68157440 bytes, over the 67108864 bytes zoo reads there"),
    ("summary-not-utf8", lambda d: (d / "0").mkdir() or (d / "0" / "summary.json").write_bytes(b'{"a": "\xff"}'),
     REPORT_RUN, "unreadable: summary.json is not UTF-8 text (byte 7)"),
    ("metrics-1e400-step", _file("metrics.csv", "step,val_loss\n0,2.5\n1e400,2.0\n", SUMMARY), REPORT_RUN,
     "completed: metrics.csv: step 1e400 is out of range (0 to 1000000000000000)"),
    ("metrics-400-digit-step", _file("metrics.csv", f"step,val_loss\n{'9' * 400},2.0\n", SUMMARY), REPORT_RUN,
     "out of range (0 to 1000000000000000)"),
    ("hydra-config-bomb", _file(".hydra/config.yaml", BOMB),
     "from zoo.report.runs import _optimizer\nout = repr(_optimizer(None, tmp / 'sweep' / '0'))", "None"),
    ("overrides-bomb", _file(".hydra/overrides.yaml", BOMB),
     "from zoo.report.runs import _read_overrides_yaml\n"
     "out = repr(_read_overrides_yaml(tmp / 'sweep' / '0' / '.hydra' / 'overrides.yaml'))", "[]"),
    ("multirun-1e11-jobs", lambda d: (d / "multirun.yaml").write_text(PLAN_1E11),
     "from zoo.report.runs import planned_jobs\nout = planned_jobs(tmp / 'sweep')[1]",
     "multirun.yaml' plans more than 1000000 jobs, not expanded: the jobs found on disk"),
    ("multirun-bomb", lambda d: (d / "multirun.yaml").write_text(BOMB),
     "from zoo.report.runs import planned_jobs\nout = planned_jobs(tmp / 'sweep')[1]",
     "holds a YAML alias (*name); zoo writes none and reads none"),
    ("multirun-deep", lambda d: (d / "multirun.yaml").write_text(DEEP_YAML),
     "from zoo.report.runs import planned_jobs\nout = planned_jobs(tmp / 'sweep')[1]", "nests more than 100 levels"),
    ("report-whole-sweep", lambda d: [_summary(DEEP_JSON)(d), (d / "multirun.yaml").write_text(BOMB)],
     "from zoo.report.runs import load_runs, match_jobs\nruns = load_runs(tmp / 'sweep')\n"
     "out = match_jobs(tmp / 'sweep', runs).source + ' | ' + runs[0].detail", "nests more than 100 levels deep"),
    # resume: a sweep job run again reads its earlier summary (damaged: not finished, run it again) and config
    ("resume-summary-deep", _summary(DEEP_JSON),
     "from zoo.training.run_dir import finished_earlier\nout = repr(finished_earlier({}, tmp / 'sweep' / '0'))",
     "None"),
    ("resume-config-bomb", _file("config.yaml", BOMB, SUMMARY),
     "from zoo.training.run_dir import finished_earlier\nout = repr(finished_earlier({}, tmp / 'sweep' / '0'))",
     "holds a finished run with other settings (config.yaml: unreadable)"),
    ("resume-history-too-large", lambda d: (d / "0").mkdir() or _big(d / "0" / "metrics.csv", 257 << 20),
     "from zoo.training.callbacks import read_history\nread_history(tmp / 'sweep' / '0' / 'metrics.csv')\n"
     "out = 'read'", "is not a CSV history zoo can read"),
    ("final-metric-deep", _summary(DEEP_JSON),
     "from zoo.training.summary import final_metric\nout = repr(final_metric(tmp / 'sweep' / '0', 'val_loss'))",
     "inf"),
    ("run-marker-deep", lambda d: (d / "0").mkdir() or (d / "0" / RUN_MARKER).write_text("[" * 4000),
     "from zoo.io import read_marker\nout = repr(read_marker(tmp / 'sweep' / '0'))", "is not a zoo run marker"),
    ("manifest-deep", lambda d: (d / "0").mkdir() or (d / "0" / "manifest.json").write_text(DEEP_JSON),
     "from zoo.data.tokens import read_manifest\nout = repr(read_manifest(tmp / 'sweep' / '0'))",
     "nests more than 100 levels deep"),
    ("manifest-big-number", lambda d: (d / "0").mkdir() or (d / "0" / "manifest.json").write_text(
        '{"format": "zoo-tokens-1", "complete": true, "tokens": ' + "9" * 400 + "}"),
     "from zoo.data.tokens import read_manifest\nout = repr(read_manifest(tmp / 'sweep' / '0'))",
     "(400 digits) is out of range"),
    ("verification-cache-deep", lambda d: None,
     "from zoo.data.tokens import _VerifiedRecord\nfrom zoo.io import cache_dir\n"
     "rec = _VerifiedRecord(tmp / 'sweep')\nrec.file.parent.mkdir(parents=True)\nrec.file.write_text('" + "[" * 5000
     + "')\nout = 'verify again' if _VerifiedRecord(tmp / 'sweep').shards == {} else 'trusted'", "verify again"),
    ("saved-tokenizer-deep", lambda d: (d / "tok.json").write_text(DEEP_JSON),
     "from zoo.data.tokenizers import _read_saved\nout = repr(_read_saved(tmp / 'sweep' / 'tok.json'))",
     "error: tokenizer: cannot read"),
]


@pytest.mark.parametrize("make,code,says", [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_a_hostile_file_is_one_line_under_a_memory_limit(tmp_path, make, code, says):
    marker, before = _outside(tmp_path)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    make(sweep)
    line = _run_bounded(code, tmp_path)
    assert says in line, line
    assert marker.read_bytes() == before


# -- special files where zoo reads data -------------------------------------------------------------------------

def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "fifo")
    return str(tmp / "fifo")


def _socket(tmp: Path) -> str:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp / "sock"))  # the socket file stays after the test's socket object is collected
    return str(tmp / "sock")


SPECIAL = [("fifo", _fifo, "a FIFO"), ("dev-zero", lambda t: "/dev/zero", "a character device"),
           ("dev-urandom", lambda t: "/dev/urandom", "a character device"), ("socket", _socket, "a socket")]


@pytest.mark.parametrize("make,kind", [s[1:] for s in SPECIAL], ids=[s[0] for s in SPECIAL])
def test_a_special_file_is_refused_where_zoo_reads_data(tmp_path, make, kind):
    from zoo.data.corpus import DataError, read_text_file
    from zoo.data.tokenizers import _read_saved
    from zoo.io import FileFormatError, read_csv, read_json, read_yaml

    marker, before = _outside(tmp_path)
    path = make(tmp_path)
    with pytest.raises(DataError) as e:  # data.path (a text file, also eval's data)
        read_text_file(path)
    assert str(e.value) == f"data.path: '{path}' is {kind}, not a regular file; point it at a text file"
    with pytest.raises(DataError, match=f"tokenizer: cannot read '{path}': '{path}' is {kind}"):
        _read_saved(Path(path))  # a saved tokenizer
    for read in (read_json, read_yaml, read_csv):  # every run, sweep and cache file
        with pytest.raises(FileFormatError, match=f"'{path}' is {kind}, not a regular file"):
            read(path)
    assert marker.read_bytes() == before


def test_train_refuses_dev_zero_as_data_in_one_line(tmp_path):
    marker, before = _outside(tmp_path)
    proc = zygote.run([sys.executable, "train.py", "data.path=/dev/zero", f"hydra.run.dir={tmp_path / 'run'}"],
                      cwd=ROOT, capture_output=True, text=True, timeout=120,
                      env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == "error: data.path: '/dev/zero' is a character device, not a regular file; point it at a " \
                          "text file\n"
    assert not (tmp_path / "run").exists() and marker.read_bytes() == before


# -- arguments checked before the first run -----------------------------------------------------------------------

REPORT_ARGS = [
    ({"metrics": "val_loss"}, "hydra.callbacks.report.metrics: expected a non-empty list of metric names"),
    ({"metrics": []}, "hydra.callbacks.report.metrics: expected a non-empty list of metric names ([val_loss]), "
                      "got []"),
    ({"metrics": ["../../up"]}, "hydra.callbacks.report.metrics[0]: expected a metric's name (val_loss) (letters, "
                                "digits, _ . -; no '/' or '..'), got '../../up'"),
    ({"also": {"../../up": "ffn=gelu"}}, "hydra.callbacks.report.also.../../up: expected a report's name"),
    ({"also": {"/tmp/x": "ffn=gelu"}}, "hydra.callbacks.report.also./tmp/x: expected a report's name"),
    ({"also": {"..": "ffn=gelu"}}, "hydra.callbacks.report.also...: expected a report's name"),
    ({"also": ["ffn=gelu"]}, "hydra.callbacks.report.also: expected a mapping of report names to baselines"),
    ({"also": {"gelu": ""}}, "hydra.callbacks.report.also.gelu: expected a variant ('ffn=gelu') or null, got ''"),
    ({"baseline": 5}, "hydra.callbacks.report.baseline: expected a variant ('ffn=gelu') or null, got 5"),
    ({"baseline": " "}, "hydra.callbacks.report.baseline: expected a variant"),
]


@pytest.mark.parametrize("args,says", REPORT_ARGS)
def test_the_report_callbacks_arguments_are_checked_before_the_sweep(tmp_path, args, says):
    from zoo.report.callback import check_callbacks
    from zoo.report.runs import ReportError

    marker, before = _outside(tmp_path)
    with pytest.raises(ReportError) as e:
        check_callbacks({"report": {"_target_": "zoo.report.ReportAfterSweep", **args}})
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)
    assert marker.read_bytes() == before


OPTUNA = {"_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper", "n_trials": 20,
          "n_jobs": 1}
SEARCH_ARGS = [
    ({}, ["optim.lr=tag(log, interval(0, 1e-2))"],
     "optim.lr: tag(log, interval(0.0, 0.01)) starts at 0.0, where a log interval cannot; valid: "
     "tag(log, interval(low, high)) with 0 < low < high"),
    ({}, ["optim.lr=interval(1e-2, 1e-4)"],
     "optim.lr: interval(0.01, 0.0001) is empty or reversed; valid: interval(low, high) with low < high"),
    ({}, ["optim.lr=interval(1e-3, 1e-3)"], "optim.lr: interval(0.001, 0.001) is empty or reversed"),
    ({"n_trials": 0}, [], "hydra.sweeper.n_trials: expected an integer >= 1, got 0"),
    ({"n_trials": -3}, [], "hydra.sweeper.n_trials: expected an integer >= 1, got -3"),
    ({"n_jobs": 0}, [], "hydra.sweeper.n_jobs: expected an integer >= 1, got 0"),
]


@pytest.mark.parametrize("sweeper,overrides,says", SEARCH_ARGS)
def test_a_searchs_intervals_and_trials_are_checked(sweeper, overrides, says):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from zoo.training.safety import check_search

    parsed = OverridesParser.create().parse_overrides(overrides)
    assert check_search({**OPTUNA, **sweeper}, parsed).startswith(says)
    good = OverridesParser.create().parse_overrides(["optim.lr=tag(log, interval(1e-4, 1e-2))"])
    assert check_search(OPTUNA, good) is None


@pytest.mark.parametrize("args,says", [
    (["-m", "seed=range(0,100000000000)"], "the command line: the sweep plans more than 1000000 jobs"),
    (["-m", "seed=shuffle(range(0,100000000000))"], "the command line: the sweep plans more than 1000000 jobs"),
    (["-m", "seed=range(0,2000)", "model.d_model=range(1,1000)"], "the command line: the sweep plans more than"),
])
def test_a_sweep_of_too_many_jobs_is_refused_before_it_is_expanded(tmp_path, args, says):
    line = _run_bounded(f"from zoo.cli.train import check_arguments\nout = check_arguments({args!r})", tmp_path)
    assert line.startswith(says), line


def test_two_plugin_files_of_one_name_are_both_imported(tmp_path, monkeypatch):
    from zoo.registry import NORM, load_plugins

    for sub, name in (("a", "bounds_norm_a"), ("b", "bounds_norm_b")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "parts.py").write_text(
            f"import torch.nn as nn\nfrom zoo.registry import NORM\n\n@NORM.register({name!r})\n"
            "class N(nn.LayerNorm):\n    pass\n")
    monkeypatch.setenv("ZOO_PLUGINS", f"{tmp_path / 'a' / 'parts.py'},{tmp_path / 'b' / 'parts.py'}")
    monkeypatch.setattr(NORM, "_entries", dict(NORM._entries))  # the registrations last this test only
    monkeypatch.setattr(NORM, "_options", dict(NORM._options))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # and so do the plugins' modules
    load_plugins()
    assert {"bounds_norm_a", "bounds_norm_b"} <= set(NORM.names())


@pytest.mark.parametrize("cmd,says", [
    (["-m", "zoo.kernels"], "error: the following arguments are required: command; see python -m zoo.kernels --help"),
    (["-m", "zoo.kernels", "frob"], "error: argument command: invalid choice: 'frob' (choose from 'list', 'build'); "
                                    "see python -m zoo.kernels --help"),
    (["-m", "zoo.bench", "--rounds", "x"], "error: argument --rounds: invalid int value: 'x'; see python -m "
                                           "zoo.bench --help"),
    (["-m", "zoo", "bench", "--frob"], "error: unrecognized arguments: --frob; see zoo bench --help"),
])
def test_bench_and_kernels_usage_errors_are_one_line(tmp_path, cmd, says):
    proc = zygote.run([sys.executable, *cmd], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                      env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and proc.stderr == says + "\n" and proc.stdout == ""


REFUSALS = ["error: model.mup_base_d_model: must be an integer from 1 to 65536, got 0",
            "error: model.mup_base_d_model: must be an integer from 1 to 65536, got 100000000"]


# Hydra's basic launcher runs the jobs in this process; zoo's parallel one in processes of their own, each job's
# refusal in its console.log, its exit code sent back to the launcher.
@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=parallel", "hydra.launcher.n_jobs=2"]],
                         ids=["basic", "parallel"])
def test_a_sweep_whose_every_job_is_refused_exits_2(tmp_path, launcher):
    marker, before = _outside(tmp_path)
    proc = zygote.run([sys.executable, "train.py", "-m", *launcher, "model.mup_base_d_model=0,100000000",
                       "trainer.max_steps=1", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=ROOT,
                      capture_output=True, text=True, timeout=300,
                      env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == [*([] if launcher else REFUSALS),
                      "error: all 2 jobs of the sweep were refused (each said why above)"]
    if launcher:
        consoles = sorted((tmp_path / "sweep").glob("*/console.log"))
        assert [ln for c in consoles for ln in c.read_text().splitlines() if ln.startswith("error: ")] == REFUSALS
    assert marker.read_bytes() == before


def test_a_sweep_with_one_job_refused_exits_0(tmp_path):
    """The neighbour: one refused job among good ones is the sweep going on, not a refused sweep."""
    proc = zygote.run([sys.executable, "train.py", "-m", "model.mup_base_d_model=0,128", "trainer.max_steps=1",
                       "debug=fast", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=ROOT,
                      capture_output=True, text=True, timeout=300,
                      env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")] == REFUSALS[:1]


# -- overwrite=true removes only what zoo wrote --------------------------------------------------------------------

@pytest.mark.parametrize("user_file", ["console.log", "notes.txt", ".hydra/overrides.yaml", "checkpoints/mine.pt"])
def test_overwrite_leaves_the_users_files(tmp_path, user_file):
    marker, before = _outside(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    write_marker(run)
    for name, kind in RUN_ENTRIES.items():
        if name not in (RUN_MARKER, "console.log"):
            (run / name).mkdir() if kind == "dir" else (run / name).write_text("zoo's\n")
    (run / user_file).parent.mkdir(exist_ok=True)
    (run / user_file).write_bytes(b"the user's own (a tee)\n")
    remove_run_files(run)
    assert (run / user_file).read_bytes() == b"the user's own (a tee)\n"
    assert not any(os.path.lexists(run / n) for n in OVERWRITE_REMOVES if n != "checkpoints" or user_file[:4] != "chec")
    assert marker.read_bytes() == before


def test_reliability_md_states_the_bounds_of_the_code():
    from zoo.io import MAX_DEPTH, MAX_INT_DIGITS, MAX_SWEEP_JOBS, READ_LIMITS

    text = " ".join((ROOT / "docs" / "reliability.md").read_text().split())
    bullet = text[text.index("**Every file zoo parses is bounded**"):text.index("**Special files are refused")]
    stated = f"at most {READ_LIMITS['json'] >> 20} MiB of JSON, {READ_LIMITS['yaml'] >> 20} MiB of YAML and " \
             f"{READ_LIMITS['csv'] >> 20} MiB of CSV"
    assert stated in bullet
    assert f"nested at most {MAX_DEPTH} levels" in bullet and f"at most {MAX_INT_DIGITS} digits" in bullet
    assert f"more than {MAX_SWEEP_JOBS:,} jobs" in bullet and f"{MEMORY_LIMIT >> 30} GiB of address space" in bullet


def test_reliability_md_lists_what_overwrite_removes():
    text = (ROOT / "docs" / "reliability.md").read_text()
    bullet = re.search(r"`overwrite=true` removes only (.*?);", text, re.S).group(1)
    listed = re.findall(r"`([^`]+)`", bullet)
    assert listed == [n + "/" if RUN_ENTRIES[n] == "dir" else n for n in OVERWRITE_REMOVES]


# -- the report says what it means --------------------------------------------------------------------------------

@pytest.mark.parametrize("finals", [["NaN", "NaN"], ["Infinity", "NaN"], ["-Infinity"]])
def test_every_final_non_finite_is_said_so(tmp_path, finals, capsys):
    from zoo.report import main as report_main

    marker, before = _outside(tmp_path)
    for i, value in enumerate(finals):
        (tmp_path / "sweep" / str(i)).mkdir(parents=True)
        (tmp_path / "sweep" / str(i) / "summary.json").write_text(
            f'{{"status": "diverged", "final": {{"val_loss": {value}}}, "overrides": ["seed={i}"]}}')
    assert report_main([str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --metric: every run's final 'val_loss' is NaN or infinite (") and \
        err.count("\n") == 1 and "no run has" not in err, err
    assert marker.read_bytes() == before
