"""The ttt section: time to a target validation loss, zoo's training command against nanoGPT's own train.py on the
same text file and the same recipe, from process start."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from zoo.bench.markdown import ratio, table
from zoo.bench.processes import TRAIN, child_env, typed
from zoo.bench.registry import section
from zoo.bench.session import Session
from zoo.commands import train_command

# nanoGPT README's Shakespeare-char recipe for a CPU, as written there (its config file plus these flags).
NANOGPT_CPU_ARGS = ("--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
                    "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
                    "--lr_decay_iters=2000", "--dropout=0.0")
# zoo's contenders: name (for --ttt-runs) -> its label in the table and its training overrides (the same recipe:
# conf/experiment/nanogpt_cpu.yaml).
TTT_RUNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "defaults": ("zoo, defaults", ("experiment=nanogpt_cpu",)),
    "float32": ("zoo, float32", ("experiment=nanogpt_cpu", "trainer.precision=32-true")),
    "fast": ("zoo, fast preset", ("experiment=nanogpt_cpu_fast",)),
    # the same compiled: its first round compiles into an empty cache, later rounds reuse it (section_ttt)
    "fast_compiled": ("zoo, fast preset, compiled", ("experiment=nanogpt_cpu_fast", "compile=true")),
}
_NANOGPT_EVAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)")


@dataclass
class TargetRun:
    """One process: its evaluations as (step, val_loss, seconds since spawn), its wall time, eval share."""
    evals: list[tuple[int, float, float]]
    wall: float
    eval_share: float | None = None  # of the wall time; None where the program does not say

    def time_to(self, target: float) -> float | None:
        return next((t for _, v, t in self.evals if v <= target), None)


def _nanogpt_workdir(checkout: Path, text: Path, work: Path) -> Path:
    """A directory nanoGPT's train.py can run in: its shakespeare_char data made from `text` by its own
    prepare.py (given input.txt, it downloads nothing), and its configurator.py, which it reads from the cwd."""
    data = work / "data" / "shakespeare_char"
    data.mkdir(parents=True, exist_ok=True)
    shutil.copy(text, data / "input.txt")
    shutil.copy(checkout / "data" / "shakespeare_char" / "prepare.py", data / "prepare.py")
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True, timeout=600)
    shutil.copy(checkout / "configurator.py", work / "configurator.py")
    return work


def run_nanogpt_to_target(checkout: Path, work: Path, steps: int | None) -> TargetRun | str:
    """nanoGPT's train.py with the CPU recipe; each `step N: ... val loss X` line timed as it arrives."""
    extra = () if steps is None else (f"--max_iters={steps}", f"--lr_decay_iters={steps}",
                                      f"--eval_interval={max(1, steps // 2)}", "--warmup_iters=2")
    cmd = [sys.executable, str(checkout / "train.py"), str(checkout / "config" / "train_shakespeare_char.py"),
           *NANOGPT_CPU_ARGS, *extra]
    evals, spawned = [], time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    tail = []
    for line in proc.stdout:
        if m := _NANOGPT_EVAL.match(line):
            evals.append((int(m.group(1)), float(m.group(2)), time.perf_counter() - spawned))
        tail = (tail + [line.strip()])[-3:]
    code, wall = proc.wait(), time.perf_counter() - spawned
    if code != 0 or not evals:
        return f"nanoGPT's train.py exited {code} with {len(evals)} evaluations: {' | '.join(tail)[:300]}"
    return TargetRun(evals, wall)


def run_zoo_to_target(args: Sequence[str], text: Path, run_dir: Path, steps: int | None, extra: Sequence[str] = (),
                      train: Sequence[str] = TRAIN) -> TargetRun | str:
    """zoo's training command (`train`) on `text`; each evaluation's time from summary.json's history, put on the
    spawn's clock through the summary's own write time (its mtime, taken right after its wall_time_s)."""
    short = () if steps is None else (f"trainer.max_steps={steps}", f"trainer.val_check_interval={max(1, steps // 2)}",
                                      "optim.warmup_steps=2")
    cmd = [*train, *args, "data=text_file", f"data.path={text}", f"hydra.run.dir={run_dir}", *short, *extra]
    spawned_at = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=run_dir.parent, timeout=3600, env=child_env())
    wall = time.time() - spawned_at
    path = run_dir / "summary.json"
    if proc.returncode != 0 or not path.is_file():
        err = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
        return f"`{typed(cmd)}` exited {proc.returncode}: {err}"
    summary = json.loads(path.read_text())
    started = path.stat().st_mtime - summary["wall_time_s"] - spawned_at  # the run's clock, from the spawn
    evals = [(h["step"], h["val_loss"], started + h["wall_time_s"]) for h in summary["history"] if "val_loss" in h]
    return TargetRun(evals, wall, summary["eval_time_s"] / wall)


@section("ttt")
def section_ttt(sess: Session, train: Sequence[str] = TRAIN) -> str:
    """Wall time from process start to the first evaluation at or below the target, zoo against nanoGPT,
    the contenders one after another in rotating order, `ttt_pairs` rounds."""
    s = sess.settings
    head = "## Time to target: zoo against nanoGPT\n\n"
    if s.nanogpt is None or s.text is None:
        return head + "skipped: needs `--nanogpt <karpathy/nanoGPT checkout>` and `--text <text file>`\n"
    if not s.text.is_file():
        return head + f"skipped: --text {s.text}: no such file\n"
    chosen = {label: args for key, (label, args) in TTT_RUNS.items() if key in (s.ttt_runs or TTT_RUNS)}
    names = ["nanoGPT", *chosen]
    runs: dict[str, list[TargetRun]] = {n: [] for n in names}
    failures: list[str] = []
    # torch.compile's on-disk cache starts empty: a compiled contender's first round pays the whole compile
    with tempfile.TemporaryDirectory(prefix="zoo-ttt-") as tmp, \
            mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor")}):
        work = _nanogpt_workdir(s.nanogpt, s.text, Path(tmp) / "nanogpt")
        for r in range(s.ttt_pairs):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name == "nanoGPT":
                    run = run_nanogpt_to_target(s.nanogpt, work, s.ttt_steps)
                else:
                    run = run_zoo_to_target(chosen[name], s.text, Path(tmp) / f"zoo-{r}-{names.index(name)}",
                                            s.ttt_steps, s.train_args, train)
                said = run if isinstance(run, str) else f"final val_loss {run.evals[-1][1]:.4f}, wall {run.wall:.1f} s"
                print(f"[zoo.bench] ttt round {r + 1}/{s.ttt_pairs} {name}: {said}", flush=True)
                if isinstance(run, str):
                    failures.append(f"{name}: {run}")
                else:
                    runs[name].append(run)

    def med(values: list[float | None]) -> float | None:
        return None if not values or None in values else statistics.median(values)

    # the target: nanoGPT's own final validation loss on this file, unless one is given
    own = med([run.evals[-1][1] for run in runs["nanoGPT"]])
    target = s.ttt_target if s.ttt_target is not None else own
    if target is None:
        return head + f"Failed: nanoGPT finished no round, so there is no target. {'; '.join(failures)}\n"
    base = med([run.time_to(target) for run in runs["nanoGPT"]])
    base_wall = med([run.wall for run in runs["nanoGPT"]])

    def walls(name: str) -> list[str]:
        wall = med([run.wall for run in runs[name]])
        return ["-", "-"] if wall is None else [f"{wall:.1f}", ratio(wall / base_wall) if base_wall else "-"]

    rows = []
    for name in names:
        times = [run.time_to(target) for run in runs[name]]
        t = med(times)
        finals = [run.evals[-1][1] for run in runs[name]]
        shares = [run.eval_share for run in runs[name] if run.eval_share is not None]
        rows.append([name, ", ".join("not reached" if x is None else f"{x:.1f}" for x in times) or "-",
                     "-" if t is None else f"{t:.1f}", "-" if t is None or not base else ratio(t / base),
                     f"{statistics.median(finals):.4f}" if finals else "-", *walls(name),
                     f"{statistics.median(shares):.1%}" if shares else "-"])
    zoo_cmds = "; ".join(f"{name}: `{shlex.join(args)}`" for name, args in chosen.items())
    return head + "\n".join([
        f"Wall time from process start until the validation loss first reaches **{target:.4f}** "
        + ("(given)" if s.ttt_target is not None else "(nanoGPT's own final validation loss here, the median of its "
           "rounds)") + ", for nanoGPT's own "
        f"`train.py` with its Shakespeare-char CPU recipe (`train.py config/train_shakespeare_char.py "
        f"{shlex.join(NANOGPT_CPU_ARGS)}`, data made by its own prepare.py from `{s.text.name}`) and for zoo's "
        f"`{train_command()}` with `data=text_file data.path=<the file>` and ({zoo_cmds}): the same 4-layer model, "
        "batch and context on the same file (the last 10% is validation for both; nanoGPT estimates the loss on 20 "
        "random batches of it, zoo on 20 fixed windows), nanoGPT's schedule "
        "(2000 steps, evaluating every 250) but for the fast preset's own (its parts, optimizer, steps and "
        "evaluations, and the Optuna search on zoo's embedded corpus that picked its learning rates, are in "
        "conf/experiment/nanogpt_cpu_fast.yaml). "
        "torch.compile's on-disk cache (`TORCHINDUCTOR_CACHE_DIR`) is empty at the section's start, so a compiled "
        "contender's first round includes compiling from scratch and its later rounds reuse the cache, as a "
        "user's later runs on the same machine do. "
        f"{s.ttt_pairs} rounds, the contenders one after another in rotating order, torch's default threads. A time "
        "is that of the first evaluation at or below the target; `wall vs nanoGPT` compares whole processes, "
        "target reached or not; `eval share` is zoo's time in validation passes over its process wall time."
        + (f" Steps shortened to {s.ttt_steps} for a smoke run." if s.ttt_steps else ""), "",
        table(["contender", "time to target s (each round)", "median s", "vs nanoGPT", "final val_loss",
               "process wall s", "wall vs nanoGPT", "eval share"], rows), "",
        *([f"Failed: {'; '.join(failures)}", ""] if failures else [])])
