"""The ttt section: time to a target validation loss, zoo's training command against nanoGPT's own train.py on the
same text file and the same recipe, from process start."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from zoo.bench.contenders.nanogpt import read_nanogpt_checkpoint
from zoo.bench.markdown import ratio, table
from zoo.bench.processes import TRAIN, child_env, typed
from zoo.bench.registry import section
from zoo.bench.session import Session
from zoo.bench.yardstick import Score, Yardstick, score, zoo_checkpoint
from zoo.commands import train_command

# nanoGPT README's Shakespeare-char recipe for a CPU, as written there (its config file plus these flags).
NANOGPT_CPU_ARGS = ("--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
                    "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
                    "--lr_decay_iters=2000", "--dropout=0.0")
# a checkpoint at every evaluation (ckpt.pt, replaced each time), for the yardstick
NANOGPT_SAVE_ARGS = ("--always_save_checkpoint=True",)
# zoo's contenders: name (for --ttt-runs) -> its label in the table and its training overrides (the same recipe:
# conf/experiment/nanogpt_cpu.yaml).
TTT_RUNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "defaults": ("zoo, defaults", ("experiment=nanogpt_cpu",)),
    "float32": ("zoo, float32", ("experiment=nanogpt_cpu", "trainer.precision=32-true")),
    "fast": ("zoo, fast preset", ("experiment=nanogpt_cpu_fast",)),
    # issue 44: the fast preset with batch 32, larger learning rates and 200 steps
    "margin": ("zoo, margin preset", ("experiment=nanogpt_cpu_margin",)),
    # the same compiled: its first round compiles into an empty cache, later rounds reuse it (section_ttt)
    "fast_compiled": ("zoo, fast preset, compiled", ("experiment=nanogpt_cpu_fast", "compile=true")),
}
CONTEXT = 64  # the recipe's context (NANOGPT_CPU_ARGS, experiment=nanogpt_cpu): the yardstick's windows
_NANOGPT_EVAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)")


@dataclass
class Eval:
    """One evaluation of a run: its step, the program's own estimate of the validation loss, its time (seconds
    since the spawn) and, from the checkpoint saved there, the yardstick's score."""
    step: int
    own: float
    at: float
    score: Score | None = None


@dataclass
class TargetRun:
    """One process: its evaluations, its wall time, eval share."""
    evals: list[Eval]
    wall: float
    eval_share: float | None = None  # of the wall time; None where the program does not say

    @property
    def final(self) -> Score | None:
        return self.evals[-1].score

    def reached(self, target: float) -> Eval | None:
        """The first evaluation whose checkpoint scores at or below the target on the yardstick."""
        return next((e for e in self.evals if e.score is not None and e.score.loss <= target), None)


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


def _whole(path: Path) -> bool:
    """A complete torch.save archive: its zip directory readable and every member's CRC-32 right."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (zipfile.BadZipFile, OSError, EOFError):
        return False


def run_nanogpt_to_target(checkout: Path, work: Path, steps: int | None, ys: Yardstick) -> TargetRun | str:
    """nanoGPT's train.py with the CPU recipe; each `step N: ... val loss X` line timed as it arrives. It saves
    ckpt.pt after each evaluation (always_save_checkpoint); each is copied aside once written (at the next line
    it prints: it writes nothing to ckpt.pt until the next evaluation) and scored on the yardstick after the run."""
    extra = () if steps is None else (f"--max_iters={steps}", f"--lr_decay_iters={steps}",
                                      f"--eval_interval={max(1, steps // 2)}", "--warmup_iters=2")
    out, kept = work / "out", work / "evaluated"
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir()
    cmd = [sys.executable, str(checkout / "train.py"), str(checkout / "config" / "train_shakespeare_char.py"),
           *NANOGPT_CPU_ARGS, *extra, *NANOGPT_SAVE_ARGS, f"--out_dir={out}"]
    evals: list[Eval] = []
    saved: dict[int, Path] = {}
    pending = False  # a save announced, the file complete once the next line comes

    def keep() -> None:
        nonlocal pending
        if pending and evals:
            to = kept / f"step-{evals[-1].step}.pt"
            for _ in range(50):  # torch.save writes in place: a copy taken mid-write is taken again
                shutil.copy(out / "ckpt.pt", to)
                if _whole(to):
                    saved[evals[-1].step] = to
                    break
                time.sleep(0.1)
        pending = False

    spawned = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    tail: list[str] = []
    for line in proc.stdout:
        keep()
        if m := _NANOGPT_EVAL.match(line):
            evals.append(Eval(int(m.group(1)), float(m.group(2)), time.perf_counter() - spawned))
        pending = line.startswith("saving checkpoint to")
        tail = (tail + [line.strip()])[-3:]
    code, wall = proc.wait(), time.perf_counter() - spawned
    keep()
    if code != 0 or not evals:
        return f"nanoGPT's train.py exited {code} with {len(evals)} evaluations: {' | '.join(tail)[:300]}"
    meta = work / "data" / "shakespeare_char" / "meta.pkl"
    for e in evals:
        if e.step in saved:
            e.score = score(*read_nanogpt_checkpoint(saved[e.step], meta), ys)
    shutil.rmtree(kept)
    return TargetRun([e for e in evals if e.step > 0], wall)  # step 0 has no checkpoint: an untrained model


class _CheckpointWatch(threading.Thread):
    """Keeps each checkpoint zoo's run writes to checkpoints/last.ckpt (it replaces the file by a rename at every
    evaluation, so each version is a new file): a hard link to each new one, polled every 20 ms."""

    def __init__(self, last: Path, kept: Path):
        super().__init__(daemon=True)
        self.last, self.kept, self.seen, self.done = last, kept, set(), threading.Event()

    def grab(self) -> None:
        try:
            inode = self.last.stat().st_ino
            if inode not in self.seen:
                to = self.kept / f"{len(self.seen)}.ckpt"
                try:
                    os.link(self.last, to)
                except OSError:  # another file system: a copy (the name always holds a whole file)
                    shutil.copy(self.last, to)
                self.seen.add(inode)
        except FileNotFoundError:
            pass

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.grab()


def run_zoo_to_target(args: Sequence[str], text: Path, run_dir: Path, steps: int | None, ys: Yardstick,
                      extra: Sequence[str] = (), train: Sequence[str] = TRAIN) -> TargetRun | str:
    """zoo's training command (`train`) on `text`; each evaluation's time from summary.json's history, put on the
    spawn's clock through the summary's own write time (its mtime, taken right after its wall_time_s); the
    checkpoint of each evaluation kept as it is written and scored on the yardstick after the run."""
    short = () if steps is None else (f"trainer.max_steps={steps}", f"trainer.val_check_interval={max(1, steps // 2)}",
                                      "optim.warmup_steps=2")
    cmd = [*train, *args, "data=text_file", f"data.path={text}", f"hydra.run.dir={run_dir}", *short, *extra]
    kept = run_dir.parent / f"{run_dir.name}-evaluated"
    kept.mkdir(parents=True)
    watch = _CheckpointWatch(run_dir / "checkpoints" / "last.ckpt", kept)
    spawned_at = time.time()
    watch.start()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=run_dir.parent, timeout=3600,
                              env=child_env())
    finally:
        watch.done.set()
        watch.join()
    wall = time.time() - spawned_at
    watch.grab()
    path = run_dir / "summary.json"
    if proc.returncode != 0 or not path.is_file():
        err = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
        return f"`{typed(cmd)}` exited {proc.returncode}: {err}"
    summary = json.loads(path.read_text())
    started = path.stat().st_mtime - summary["wall_time_s"] - spawned_at  # the run's clock, from the spawn
    evals = [Eval(h["step"], h["val_loss"], started + h["wall_time_s"]) for h in summary["history"]
             if "val_loss" in h]
    by_step = {}
    for ckpt in sorted(kept.iterdir(), key=lambda p: int(p.stem)):  # a later save of a step replaces an earlier
        model, stoi, step = zoo_checkpoint(ckpt, ys)
        by_step[step] = score(model, stoi, ys)
    shutil.rmtree(kept)
    for e in evals:
        e.score = by_step.get(e.step)
    return TargetRun(evals, wall, summary["eval_time_s"] / wall)


def _se(values: list[float]) -> str:
    """The standard error of the mean of rounds' values, or - with fewer than two."""
    return f"{statistics.stdev(values) / math.sqrt(len(values)):.{3 if max(values) > 10 else 4}f}" \
        if len(values) > 1 else "-"


def _med(values: list[float | None]) -> float | None:
    return None if not values or None in values else statistics.median(values)


@section("ttt")
def section_ttt(sess: Session, train: Sequence[str] = TRAIN) -> str:
    """Wall time from process start to the first evaluation whose checkpoint reaches the target on the yardstick
    (nanoGPT's final model's loss there), zoo against nanoGPT, the contenders one after another in rotating order,
    `ttt_pairs` rounds."""
    s = sess.settings
    head = "## Time to target: zoo against nanoGPT\n\n"
    if s.nanogpt is None or s.text is None:
        return head + "skipped: needs `--nanogpt <karpathy/nanoGPT checkout>` and `--text <text file>`\n"
    if not s.text.is_file():
        return head + f"skipped: --text {s.text}: no such file\n"
    ys = Yardstick.of_file(s.text, CONTEXT)
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
                    run = run_nanogpt_to_target(s.nanogpt, work, s.ttt_steps, ys)
                else:
                    run = run_zoo_to_target(chosen[name], s.text, Path(tmp) / f"zoo-{r}-{names.index(name)}",
                                            s.ttt_steps, ys, s.train_args, train)
                said = run if isinstance(run, str) else (
                    f"own final estimate {run.evals[-1].own:.4f}, yardstick "
                    f"{'-' if run.final is None else f'{run.final.loss:.4f}'}, wall {run.wall:.1f} s")
                print(f"[zoo.bench] ttt round {r + 1}/{s.ttt_pairs} {name}: {said}", flush=True)
                if isinstance(run, str):
                    failures.append(f"{name}: {run}")
                elif run.final is None:
                    failures.append(f"{name}: round {r + 1}: no checkpoint of its last evaluation to score")
                else:
                    runs[name].append(run)

    # the target: nanoGPT's final model on the yardstick (the median of its rounds), unless one is given
    nano_finals = [run.final.loss for run in runs["nanoGPT"]]
    own = _med(nano_finals)
    target = s.ttt_target if s.ttt_target is not None else own
    if target is None:
        return head + f"Failed: nanoGPT finished no round, so there is no target. {'; '.join(failures)}\n"
    # the nanoGPT model the others are paired with: its round whose final loss is nearest the target
    ref = min(runs["nanoGPT"], key=lambda run: abs(run.final.loss - target)).final if runs["nanoGPT"] else None
    base = _med([None if (e := run.reached(target)) is None else e.at for run in runs["nanoGPT"]])
    base_wall = _med([run.wall for run in runs["nanoGPT"]])

    score_rows, time_rows, curves = [], [], []
    for name in names:
        finals = [run.final for run in runs[name]]
        mid = sorted(finals, key=lambda f: f.loss)[(len(finals) - 1) // 2] if finals else None
        diff = "-" if mid is None or ref is None else "{:+.4f} ± {:.4f}".format(*mid.minus(ref))
        score_rows.append([name, ", ".join(f"{f.loss:.4f}" for f in finals) or "-",
                           "-" if mid is None else f"{mid.loss:.4f} ± {mid.se:.4f}", _se([f.loss for f in finals]),
                           diff, f"{_med([run.evals[-1].own for run in runs[name]]):.4f}" if finals else "-"])
        # nanoGPT to its own final quality, zoo's contenders to it less the margin (issue 44: "with a margin")
        hits = [run.reached(target if name == "nanoGPT" else target - s.ttt_margin) for run in runs[name]]
        times = [None if e is None else e.at for e in hits]
        t = _med(times)
        wall = _med([run.wall for run in runs[name]])
        shares = [run.eval_share for run in runs[name] if run.eval_share is not None]
        time_rows.append([
            name, ", ".join("not reached" if x is None else f"{x:.1f}" for x in times) or "-",
            "-" if t is None else f"{t:.1f}", "-" if t is None else _se(times),
            "-" if t is None or not base else ratio(t / base),
            ", ".join("-" if e is None else str(e.step) for e in hits) or "-",
            "-" if wall is None else f"{wall:.1f}", "-" if wall is None or not base_wall else ratio(wall / base_wall),
            f"{statistics.median(shares):.1%}" if shares else "-"])
        if runs[name]:
            curves.append(f"- {name}: " + ", ".join(f"{e.step}: {'-' if e.score is None else f'{e.score.loss:.4f}'} "
                                                    f"({e.own:.4f})" for e in runs[name][0].evals))
    zoo_cmds = "; ".join(f"{name}: `{shlex.join(args)}`" for name, args in chosen.items())
    given = s.ttt_target is not None
    return head + "\n".join([
        "**The yardstick.** Every contender's checkpoints, one saved at each of its evaluations (nanoGPT's "
        f"`{shlex.join(NANOGPT_SAVE_ARGS)}`, each ckpt.pt copied aside once written; zoo's checkpoints/last.ckpt, "
        "kept at each evaluation), scored after the run by one evaluator: " + ys.describe() + " of "
        f"`{s.text.name}`, every model run by zoo in float32 (nanoGPT's ckpt.pt read into zoo's GPT-2-shaped "
        "model by zoo.bench.contenders.nanogpt), the loss the mean next-character cross-entropy (zoo.bench.yardstick). "
        "`± SE (windows)`: the standard error of that mean with the windows as the sample; `- target` is paired "
        "with nanoGPT's final model (the round nearest the target), its ± the standard error of the paired "
        "difference; `SE (rounds)`: the standard error of the mean of the rounds' figures. `own estimate` is "
        "what each program printed itself (nanoGPT: 20 random batches; zoo: 20 fixed windows), for reference.", "",
        f"**The target: {target:.4f}** " + ("(given)" if given else "(nanoGPT's final model on the yardstick, the "
        "median of its rounds)" + (f" ± {ref.se:.4f} (windows)" if ref is not None else "")) + ". "
        "Time to target: wall time from process start until the first evaluation whose checkpoint scores at or "
        "below it" + (f" (zoo's contenders: at or below it less a margin of {s.ttt_margin:g}, "
                      f"{target - s.ttt_margin:.4f})" if s.ttt_margin else "") + ", for nanoGPT's own "
        f"`train.py` with its Shakespeare-char CPU recipe (`train.py config/train_shakespeare_char.py "
        f"{shlex.join(NANOGPT_CPU_ARGS)}`, data made by its own prepare.py from `{s.text.name}`) and for zoo's "
        f"`{train_command()}` with `data=text_file data.path=<the file>` and ({zoo_cmds}): the same 4-layer model, "
        "batch and context on the same file (the last 10% is validation for both), nanoGPT's schedule "
        "(2000 steps, evaluating every 250) but for the fast preset's own (its parts, optimizer, batch, steps and "
        "evaluations are in conf/experiment/nanogpt_cpu_fast.yaml and nanogpt_cpu_margin.yaml). "
        "torch.compile's on-disk cache (`TORCHINDUCTOR_CACHE_DIR`) is empty at the section's start, so a compiled "
        "contender's first round includes compiling from scratch and its later rounds reuse the cache, as a "
        "user's later runs on the same machine do. "
        f"{s.ttt_pairs} rounds, the contenders one after another in rotating order, torch's default threads. "
        "`wall vs nanoGPT` compares whole processes, target reached or not; `eval share` is zoo's time in its own "
        "validation passes over its process wall time (the yardstick's scoring is outside every clock)."
        + (f" Steps shortened to {s.ttt_steps} for a smoke run." if s.ttt_steps else ""), "",
        table(["contender", "yardstick, final (each round)", "median ± SE (windows)", "SE (rounds)",
               "- target ± SE (paired)", "own estimate, final"], score_rows), "",
        table(["contender", "time to target s (each round)", "median s", "SE s (rounds)", "vs nanoGPT",
               "step reached", "process wall s", "wall vs nanoGPT", "eval share"], time_rows), "",
        "Yardstick (own estimate) at each evaluation, round 1:", "", *curves, "",
        *([f"Failed: {'; '.join(failures)}", ""] if failures else [])])
