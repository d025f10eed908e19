"""Every command in README.md and docs/*.md runs as written.

Commands come from the docs themselves: each line of a ```bash block, each `$ ` line of a console block (whose
following lines are the output it must print), each ```python block, and each inline `python ...` command; a
```python <file>.py block is a file the reader saves, written for the commands after it. They run in document order
in one fresh working directory holding links to train.py, sample.py and conf/, as in a user's checkout, so a later
command finds what an earlier one wrote (`outputs/<date>/<time>/checkpoints/best.ckpt`). Each page has its own
directory and runs on one pytest-xdist worker (an `xdist_group` per page): a page's commands rely only on what that
page ran before them, as a reader who opens that page alone would. A training command that reads nothing of its
checkout (`detached`: most studies and sweeps, the slowest commands) runs in a directory and group of its own, on
whichever worker is free; a later command of its page that reads what the page wrote first gets the files of the
run its placeholder reads (`depends_on`, `materialize`), as if it had run there. A study of more than BIG_STUDY
variants runs with the slow tests. The only changes shrink a run: overrides appended for steps, sizes and
seeds the command leaves at their defaults, and steps or sizes it sets lowered to the test's; placeholders
(`<ckpt>`) are filled with the path the command describes. A command that needs what this machine lacks says so in
the docs with a trailing `# needs: <what>` and is skipped with that reason. A training command that several pages
show (the same shrunk argv, reading nothing of its checkout) is trained once per session and its exit code, output
and files shared with the other pages (run_once).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from tests import zygote

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT = 900  # generous: imports alone take a minute on a busy machine

# Appended to every train.py command that does not set the key itself: a few steps of a small model.
SHRINK_TRAIN = {
    "trainer.max_steps": "4", "trainer.val_check_interval": "2", "data.eval_batches": "1",
    "data.batch_size": "2", "data.context": "16", "model.n_layers": "1", "sample.max_new_tokens": "20",
    "seed": "0",  # a study sweeps three seeds; one shows that it runs
    "tokens_per_param": "null",  # a ladder's steps follow its size: trainer.max_steps above takes over
}
SHRINK_BENCH = ["--quick", "--out", "-"]
# Commands that are the set-up itself: .ci/run installs the extras and runs this very suite.
SETUP = {"pip install": "installs packages: done by the set-up (.ci/run) before the tests",
         "python -m pytest": "runs the test suite: this test is part of it"}


@dataclass
class Command:
    where: str  # file:line
    text: str  # as written in the docs
    kind: str  # shell, python, file (a ```python <file>.py block: text saved as that file)
    output: str = ""  # what a console block shows it printing
    needs: str = ""  # a `# needs: ...` marker
    serves: str = ""  # a `# serves: <url>` marker: a server, checked to answer there, then stopped


def _strip_comment(line: str) -> tuple[str, str]:
    """A shell line without its trailing comment, and the comment."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def collect() -> list[Command]:
    commands = []
    for path in DOCS:
        text = path.read_text()
        rel = path.relative_to(ROOT)
        blocks = [(m.start(), m.end()) for m in re.finditer(r"^ *```.*?^ *```", text, re.S | re.M)]
        for m in re.finditer(r"^( *)```(\w*)(?: ([\w.-]+\.py))?\n(.*?)^ *```", text, re.S | re.M):
            lang, saved_as, body = m.group(2), m.group(3), textwrap.dedent(m.group(4))
            first = text.count("\n", 0, m.start()) + 2
            if lang == "python" and saved_as:
                commands.append(Command(f"{rel}:{first}", body, "file", output=saved_as))
            elif lang == "python":
                commands.append(Command(f"{rel}:{first}", body, "python"))
            elif lang in ("bash", "sh"):
                for i, line in enumerate(body.splitlines()):
                    cmd, comment = _strip_comment(line)
                    if cmd:
                        commands.append(Command(f"{rel}:{first + i}", cmd, "shell", needs=_needs(comment),
                                                serves=_marker("serves", comment)))
            elif lang in ("", "console") and body.lstrip().startswith("$ "):
                for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
                    line, _, out = chunk.partition("\n")
                    cmd, comment = _strip_comment(line)
                    commands.append(Command(f"{rel}:{first}", cmd, "shell", out.strip(), _needs(comment)))
        for m in re.finditer(r"`((?:python|zoo-report|zoo-prepare|mlflow|tensorboard|wandb) [^`]+)`", text):
            if any(a <= m.start() < b for a, b in blocks):
                continue
            cmd, comment = _strip_comment(m.group(1))
            commands.append(Command(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}", cmd, "shell",
                                    needs=_needs(comment)))
    return commands


def _marker(name: str, comment: str) -> str:
    m = re.search(rf"{name}: ([^#]+)", comment)
    return m.group(1).strip() if m else ""


def _needs(comment: str) -> str:
    return _marker("needs", comment)


def page(command: Command) -> str:
    return command.where.rsplit(":", 1)[0]


def _line(command: Command) -> int:
    return int(command.where.rsplit(":", 1)[1])


def _writes(command: Command) -> str:
    """What a command leaves for later ones to read: a run, a sweep, a study's sweep, or nothing."""
    if not re.search(r"(^|&& |\s)(python train\.py|zoo train|python -m zoo train)\b", command.text):
        return ""
    return ("study" if "study=" in command.text else "sweep") if " -m " in f"{command.text} " else "run"


def _reads(command: Command) -> set[str]:
    """What the placeholders of a command read (fill_placeholders)."""
    if re.search(r"<ckpt>|<run dir>|outputs/<date>", command.text):
        return {"run"}
    if re.search(r"study-[^ ]*<", command.text):
        return {"study"}
    if "multirun/<date>" in command.text:  # multirun/2*/*: a sweep's own dated directory
        return {"sweep"}
    return {"sweep", "study"} if re.search(r"<sweep dir>|<dir>", command.text) else set()


def _in_order(commands: list[Command]) -> list[Command]:
    """Document order (a file's code blocks and inline commands interleaved). A command runs once on a page; a
    training command that an earlier page ran runs again only where a command after it on its page reads what it
    writes (each page has its own checkout). Other commands may write files the page needs: they always run."""
    files = [str(p.relative_to(ROOT)) for p in DOCS]
    ordered = sorted(commands, key=lambda c: (files.index(page(c)), _line(c)))
    ran: set[str] = set()
    kept: list[Command] = []
    for i, c in enumerate(ordered):
        read_later = any(page(k) == page(c) and _writes(c) in _reads(k) for k in ordered[i + 1:])
        if any(page(k) == page(c) and k.text == c.text for k in kept) or \
                (c.text in ran and _writes(c) and not read_later):
            continue
        ran.add(c.text)
        kept.append(c)
    return kept


COMMANDS = _in_order(collect())


def detached(command: Command) -> bool:
    """A training command whose run depends on its argv alone and that writes only its own Hydra directories (no
    logger's shared store): it needs none of its page's history, so it runs apart (its own checkout and xdist group)."""
    if command.kind != "shell" or command.needs or command.serves or command.output or "&&" in command.text:
        return False
    argv = shlex.split(command.text)
    return argv[:2] == ["python", "train.py"] and \
        not any(READS_CHECKOUT.search(a) or re.match(r"[+~]*logger[=.]", a) for a in argv[2:])


def group(command: Command) -> str:
    """The xdist group and checkout a command runs in: its page's, or its own when detached."""
    return f"{command.where} {command.text}" if detached(command) else page(command)  # two may share a line


def _study(command: Command) -> tuple[str, ...] | None:
    """A study command's sweep directory, by what names it: the study, its ladder, its budget."""
    if not (m := re.search(r"\bstudy=(\w+)", command.text)):
        return None
    return (m.group(1), *re.findall(r"\b(?:ladder|budget)=\w+", command.text))


def depends_on(command: Command) -> list[Command]:
    """The detached commands of the page whose files this command's checkout needs before it runs, in page order. A
    placeholder reads the newest of what the page wrote (fill_placeholders): the newest sweep or study its pattern
    names (`multirun/study-ffn/<date_time>`: that study's), so the last such writer before it, if detached, with what
    that one needs; a run (`<ckpt>`, `<run dir>`: the newest with a checkpoint, or with plain overrides) every earlier
    detached run. A detached study needs the same study's earlier commands (a fixed directory it continues)."""
    earlier = [c for c in COMMANDS[:COMMANDS.index(command)]  # not one that never runs here, nor a slow one
               if page(c) == page(command) and not c.needs and not slow(c)]
    if detached(command):
        return [c for c in earlier if detached(c) and _study(command) and _study(c) == _study(command)]
    kinds = _reads(command)
    if kinds == {"run"}:
        return [c for c in earlier if detached(c) and _writes(c) == "run"]
    named = re.search(r"multirun/study-(\w+)/<", command.text)
    writers = [c for c in earlier if _writes(c) in kinds and (not named or (_study(c) or ("",))[0] == named.group(1))]
    return [*depends_on(writers[-1]), writers[-1]] if writers and detached(writers[-1]) else []


def test_the_docs_have_commands():
    assert len([c for c in COMMANDS if c.kind == "shell"]) >= 20, [c.text for c in COMMANDS]
    assert any("study=" in c.text for c in COMMANDS)


@pytest.fixture(scope="module")
def checkouts() -> dict[str, Path]:
    """One user's checkout per group (a page, or a detached command), made when the group's first command runs."""
    return {}


@pytest.fixture
def workdir(command: Command, checkouts: dict[str, Path], tmp_path_factory) -> Path:
    """A user's checkout: train.py, sample.py and conf/ where the docs expect them, and what this page's earlier
    commands wrote."""
    if group(command) not in checkouts:
        d = checkouts[group(command)] = tmp_path_factory.mktemp(re.sub(r"\W", "_", group(command))[:60])
        for name in ("train.py", "sample.py", "conf"):
            (d / name).symlink_to(ROOT / name)
    return checkouts[group(command)]


def _latest(pattern: str, cwd: Path) -> str:
    found = sorted(cwd.glob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        pytest.fail(f"nothing matches {pattern} under the working directory: an earlier command should have made it")
    return str(found[-1].relative_to(cwd))


def _latest_plain_run(cwd: Path) -> str:
    """The newest run of plain `python train.py` (only the test's shrinking overrides), which
    `<same overrides>` then repeats."""
    import yaml

    for run in sorted(cwd.glob("outputs/[0-9]*/[0-9]*"), key=lambda p: p.stat().st_mtime, reverse=True):
        overrides = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text()) or []
        if (run / "checkpoints" / "last.ckpt").is_file() and \
                all(o.partition("=")[0] in SHRINK_TRAIN for o in overrides):
            return str(run.relative_to(cwd))
    pytest.fail("no run of plain `python train.py` with a checkpoint: an earlier command should have made one")


def fill_placeholders(cmd: str, cwd: Path) -> str:
    """`<ckpt>` and the like become the path the docs describe, from what earlier commands wrote."""
    runs = "outputs/[0-9]*/[0-9]*"  # Hydra's outputs/<date>/<time>
    fills = {
        "outputs/<date>/<time>": lambda: _latest(runs, cwd),
        "multirun/study-<name>/<date_time>": lambda: _latest("multirun/study-*/*", cwd),
        "multirun/study-ffn/<date_time>": lambda: _latest("multirun/study-ffn/*", cwd),
        "multirun/<date>/<time>": lambda: _latest("multirun/2*/*", cwd),
        "<sweep dir>": lambda: _latest("multirun/*/*", cwd),
        "<dir>": lambda: _latest("multirun/*/*", cwd),
        "<run dir>": lambda: _latest_plain_run(cwd),
        "<ckpt>": lambda: _latest(f"{runs}/checkpoints/best.ckpt", cwd),
        "<same overrides> ": lambda: "",
        "<precision>": lambda: "bf16-mixed",
    }
    for placeholder, value in fills.items():
        if placeholder in cmd:
            cmd = cmd.replace(placeholder, value())
    if m := re.search(r"<[a-z][^>]*>", cmd):
        pytest.fail(f"unknown placeholder {m.group(0)} in `{cmd}`: fill it in tests/test_docs.py or write it out")
    return cmd


def _smaller(arg: str) -> str:
    """`trainer.max_steps=500` -> `trainer.max_steps=4`: a size the command sets, lowered to the test's."""
    key, sep, value = arg.partition("=")
    if sep and key in SHRINK_TRAIN and key != "seed" and value.isdigit() and int(value) > int(SHRINK_TRAIN[key]):
        return f"{key}={SHRINK_TRAIN[key]}"
    return arg


def shrink(argv: list[str]) -> list[str]:
    """Append overrides that make a documented command cheap; a size it sets itself is only ever lowered."""
    if argv[:2] == ["python", "train.py"] or argv[:4] == ["python", "-m", "zoo", "train"]:  # zoo train: the same
        # a command that names each block (model.funnel's groups, a list of model.sublayers) keeps its depth, and so
        # does a study whose rows do (study=narang_seq2seq's funnel, study=catalogue's sandwich_sublayers)
        per_block = any(a.startswith(("model.funnel=", "model.sublayers=[", "study=narang", "study=catalogue"))
                        for a in argv)
        argv = [a if per_block and a.startswith("model.n_layers=") else _smaller(a) for a in argv]
        keys = {a.lstrip("+~").partition("=")[0] for a in argv[2:]}
        if "hparams_search=lr_warmup" in argv:  # an Optuna search: a few trials instead of 20
            keys.add("seed")
            argv = argv + ["hydra.sweeper.n_trials=2"]
        return argv + [f"{k}={v}" for k, v in SHRINK_TRAIN.items() if k not in keys]
    if argv[:3] == ["python", "-m", "zoo.bench"] and "--help" not in argv:
        return argv + [a for a in SHRINK_BENCH if a not in argv]
    sample = argv[:3] == ["python", "-m", "zoo.sample"] or argv[:4] == ["python", "-m", "zoo", "sample"]
    if sample and "--max-new-tokens" not in argv:
        return argv + ["--max-new-tokens", "20"]
    return argv


def _digest(value: object) -> str:
    """A short, stable file name for a shared record: a command's argv, a server's address."""
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:20]


def _serves(argv: list[str], env: dict, cwd: Path, command: Command, shared: Path) -> None:
    """Start a documented server, wait until its address answers, then stop it. Two servers cannot listen on one
    address at once, so a lock per address runs them in turn; and a server command that several pages show (`mlflow
    ui`: README.md and docs/dashboards.md) is checked once per session, as run_once shares a run: its first page
    starts it, a later page gets that record. The answer does not depend on the page: the UI's page is served before
    it reads any run from the store."""
    with FileLock(shared / f"serves-{_digest(command.serves)}.lock"):
        answered = shared / f"serves-{_digest(argv)}.answered"
        if not answered.is_file():
            _serve_once(argv, env, cwd, command)
            answered.touch()


def _serve_once(argv: list[str], env: dict, cwd: Path, command: Command) -> None:
    import urllib.request

    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{command.where}: `{command.text}` exited {proc.returncode}:\n" \
                                        f"{proc.stdout.read()[-3000:]}"
            try:
                with urllib.request.urlopen(command.serves, timeout=5) as response:
                    assert response.status == 200
                    return
            except OSError:
                time.sleep(1)
        pytest.fail(f"{command.where}: nothing answered at {command.serves} within 300 s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


# A training command that reads something of the checkout (an earlier command's output, a saved file, a fixed run
# directory another command resumes) is not shared between pages: its run depends on that page's history.
READS_CHECKOUT = re.compile(r"<|ckpt_path=|init_from=|data\.path=|hydra\.(run|sweep)\.dir=|\.py\b")


# Overrides that cannot change a shrunk run: a time limit no 4-step run reaches. A command that differs from
# another only by them (docs/studies.md's speedrun study under a one-minute limit) shares that command's run, and
# is itself checked to compose (train.py's pre-flight and Hydra's --cfg job).
INERT_WHEN_SHRUNK = re.compile(r"\+*trainer\.max_time=\d+:\d\d:\d\d:\d\d$")  # DD:HH:MM:SS; anything else runs


def _shareable(argv: list[str], env: dict, base: dict) -> bool:
    """A training command whose run depends on its argv alone: each page that shows it gets the same run."""
    training = argv[:2] == ["python", "train.py"] or argv[:4] == ["python", "-m", "zoo", "train"]
    return training and env == base and not any(READS_CHECKOUT.search(a) for a in argv[2:])


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory) -> Path:
    """Where a shared run leaves its exit code, its output and the files it wrote, for every pytest-xdist worker of
    this session (their base directories share a parent)."""
    root = tmp_path_factory.getbasetemp()
    d = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "docs-shared-runs"
    d.mkdir(exist_ok=True)
    return d


def _files(cwd: Path) -> dict[str, tuple[int, int]]:
    """The checkout's files (not the links to train.py, sample.py and conf/) with their mtime and size."""
    found = {}
    for top, dirs, names in os.walk(cwd):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
        for name in names:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                st = os.stat(path)
                found[os.path.relpath(path, cwd)] = (st.st_mtime_ns, st.st_size)
    return found


def _copy(files: list[str], src: Path, dst: Path) -> None:
    for rel in files:  # copyfile, not copy2: a copied run is the page's newest, as a run made now would be
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)
    for parent in {p for rel in files for p in Path(rel).parents if p != Path(".")}:
        os.utime(dst / parent)  # its directories too (the run's and the sweep's: what _latest sorts by)


def _run_in(cwd: Path, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    """A command in a checkout, started in a second no run of the checkout has. Hydra names a run's directory by the
    second it starts (`outputs/<date>/<time>`, debug=fast's `outputs/debug/<date>/<time>`): a run started in the
    second of a run already there would find that run's directory, and zoo refuses it. A reader typing the commands
    never starts two in one second; the test waits for the next second, as they would."""
    while any(cwd.glob(f"outputs/**/{time.strftime('%Y-%m-%d')}/{time.strftime('%H-%M-%S')}")):
        time.sleep(1.01 - time.time() % 1)
    return zygote.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def run_once(argv: list[str], cwd: Path, env: dict, shared: Path) -> subprocess.CompletedProcess:
    """Run a shareable command once in this session: the first page to show it runs it and records its exit code,
    output and the files it wrote; a later page (on either worker) gets that record and those files in its own
    checkout, as if it had run the command itself. The lock makes a page that needs a run the other worker is
    making wait for it instead of making it again."""
    key = [a for a in argv if not INERT_WHEN_SHRUNK.match(a)]
    if key != argv:  # it shares the run without its inert overrides: check that it composes as written
        job = [a for a in argv[1:] if a not in ("-m", "--multirun")] + ["--cfg", "job"]
        proc = subprocess.run([sys.executable, *job], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT)
        assert proc.returncode == 0, f"`{' '.join(job)}` exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    entry = shared / _digest(key)
    with FileLock(f"{entry}.lock"):
        if not (entry / "run.json").is_file():
            before = _files(cwd)
            proc = _run_in(cwd, argv, env)
            written = sorted(rel for rel, stamp in _files(cwd).items() if before.get(rel) != stamp)
            # a run that changed a file it did not create (a shared mlflow.db) depends on the page: not shared
            shareable = not any(rel in before for rel in written)
            entry.mkdir(exist_ok=True)  # a refused command writes no file, and still leaves its record
            _copy(written if shareable else [], cwd, entry / "files")
            (entry / "run.json").write_text(json.dumps({"argv": argv, "returncode": proc.returncode, "stdout":
                                                        proc.stdout, "stderr": proc.stderr, "written": written,
                                                        "shared": shareable, "cwd": str(cwd)}))
            return proc
        run = json.loads((entry / "run.json").read_text())
        if not run["shared"]:
            return _run_in(cwd, argv, env)
        _copy(run["written"], entry / "files", cwd)
        here = {name: run[name].replace(run["cwd"], str(cwd)) for name in ("stdout", "stderr")}  # paths it printed
        return subprocess.CompletedProcess(argv, run["returncode"], here["stdout"], here["stderr"])


MATERIALIZED: dict[Path, set[str]] = {}  # checkout -> the detached commands whose files it holds


def materialize(command: Command, cwd: Path, shared: Path) -> None:
    """Bring the files of the detached commands this one depends on into its checkout, in page order (run_once: the
    record another worker made, or the run itself when none did yet)."""
    done = MATERIALIZED.setdefault(cwd, set())
    for dep in depends_on(command):
        if group(dep) not in done:
            proc = run_once(shrink(shlex.split(dep.text)), cwd, _env(cwd), shared)
            assert proc.returncode == 0, f"{command.where} needs {dep.where} `{dep.text}`, which exited " \
                                         f"{proc.returncode}:\n{proc.stderr[-2000:]}"
            done.add(group(dep))
    if detached(command):
        done.add(group(command))


def _env(cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "HYDRA_FULL_ERROR": "0"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


# A study sweeping more variants than this trains one shrunk run per variant for minutes (study=narang and its
# application twins, study=catalogue: 35-47 each): its command runs with the slow tests. The default run keeps the
# presets' machinery (their two-row study, docs/studies.md `study=narang narang=vanilla,swiglu`), and
# tests/test_narang.py composes and builds every row of every one of them.
BIG_STUDY = 30


@functools.cache
def _sweeps(study: str) -> dict[str, str] | None:
    """A study preset's sweeper params (read once: every test asks which earlier commands are slow)."""
    import yaml

    preset = ROOT / "conf" / "study" / f"{study}.yaml"
    if not preset.is_file():
        return None
    params = ((yaml.safe_load(preset.read_text()).get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    return {str(k): str(v) for k, v in params.items()}


def variants(command: Command) -> int:
    """How many variants a study command sweeps (seeds aside): its preset's sweeper params, each as the command
    overrides it."""
    m = re.search(r"\bstudy=(\w+)", command.text)
    if not m or (params := _sweeps(m.group(1))) is None:
        return 0
    given = dict(a.split("=", 1) for a in shlex.split(command.text) if "=" in a)
    return math.prod(len(given.get(k, v).split(",")) for k, v in params.items() if k != "seed")


def slow(c: Command) -> bool:
    """Benchmark commands run with the slow tests: the full benchmark compiles models for minutes even with --quick,
    and each section's --quick run (5-15 s each) repeats what tests/test_bench.py checks section by section. So do
    the big studies (BIG_STUDY), and the ladders of the studies' page: each trains its study three times over (15-26 s
    shrunk), README.md's `study=ffn ladder=cpu3` runs a ladder in the default run, and tests/test_ladder.py composes
    every study's."""
    bench = c.text.startswith("python -m zoo.bench") and "--help" not in c.text
    return bench or variants(c) > BIG_STUDY or (page(c) != "README.md" and _study(c) is not None and
                                                  any(k.startswith("ladder=") for k in _study(c)[1:]))


def _param(c: Command):
    marks = [pytest.mark.xdist_group(group(c)), *([pytest.mark.slow] if slow(c) else [])]
    return pytest.param(c, id=f"{c.where} {c.text[:60]}", marks=marks)


@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_documented_command_runs_as_written(command: Command, workdir: Path, shared_runs: Path):
    if command.needs:
        pytest.skip(f"needs {command.needs} (marked in {command.where})")
    if command.kind == "file":  # the reader saves it: the commands after it use it
        (workdir / command.output).write_text(command.text)
        return
    if command.kind == "python":
        proc = subprocess.run([sys.executable, "-c", command.text], cwd=workdir, env=_env(workdir),
                              capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, f"{command.where}: the Python example fails:\n{proc.stderr[-3000:]}"
        return
    materialize(command, workdir, shared_runs)
    parts = [p.strip() for p in command.text.split("&&")]
    runnable = [p for p in parts if not p.startswith(tuple(SETUP))]
    if not runnable:
        pytest.skip(next(why for prefix, why in SETUP.items() if parts[0].startswith(prefix)))
    for part in runnable:  # `pip install -e . && python train.py`: the set-up is done, the rest runs
        argv = shlex.split(fill_placeholders(part, workdir))
        env = _env(workdir)
        while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # VAR=value python ...
            key, _, value = argv.pop(0).partition("=")
            env[key] = value
        if argv[0] in ("zoo", "zoo-report", "zoo-prepare"):  # console scripts: not installed in the test's checkout
            argv = ["python", "-m", argv[0].replace("-", "."), *argv[1:]]
        argv = shrink(argv)
        if command.serves:
            _serves(argv, env, workdir, command, shared_runs)
            continue
        if _shareable(argv, env, _env(workdir)):  # the same training on several pages: one run (run_once)
            proc = run_once(argv, workdir, env, shared_runs)
        else:
            proc = _run_in(workdir, argv, env)
        shown = f"{command.where}: `{' '.join(argv)}` exited {proc.returncode}\n{proc.stdout[-2000:]}\n" \
                f"{proc.stderr[-3000:]}"
        if command.output:  # a console block: the documented output, and the exit code it implies
            # `...` in the documented output stands for the rest of a long line
            pattern = ".*?".join(re.escape(piece) for piece in command.output.split("..."))
            assert re.search(pattern, proc.stdout + proc.stderr), shown
            assert proc.returncode == (2 if command.output.startswith("error:") else 0), shown
        else:
            assert proc.returncode == 0, shown
        if m := re.search(r"study=(\w+)", part):  # docs/studies.md: the report lands in the sweep directory
            sweep = workdir / _latest(f"multirun/study-{m.group(1)}/*", workdir)
            assert (sweep / "report.md").is_file() and (sweep / "report.html").is_file(), shown
