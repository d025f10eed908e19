"""The overhead section: zoo's training command (`python train.py`, `zoo train`) against a bare PyTorch loop over
the same model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from zoo.bench.contenders import lm_loss, zoo_config, zoo_model
from zoo.bench.machine import load_average
from zoo.bench.markdown import num, ratio, table
from zoo.bench.processes import TRAIN, child_env, run_training, shown
from zoo.bench.registry import section
from zoo.bench.session import Session
from zoo.bench.settings import SHAPES, Settings
from zoo.commands import train_command
from zoo.data import load_default_corpus

OVERHEAD_SHAPE = "small"  # assumed to be what `experiment=nanogpt_cpu` trains; adjust with it


def bare_loop(steps: int, spawned_at: float, spec: dict | None = None) -> dict:
    """A plain PyTorch loop (runs in a subprocess): zoo model, AdamW, random windows of the Shakespeare characters.

    spec: {"model": zoo model config, "batch": B, "context": T}; train.py's summary.json supplies them, and the
    default is the small GPT-2-style shape. time_to_first_step_s counts from the parent's spawn time, so
    interpreter start and imports are in it."""
    spec = spec or {}
    small = SHAPES[OVERHEAD_SHAPE]
    cfg = spec.get("model") or zoo_config(small, "gpt2")
    batch_size, context = spec.get("batch") or small.batch, spec.get("context") or small.context
    codes = torch.from_numpy(np.frombuffer(load_default_corpus().encode("utf-32-le"), dtype=np.uint32).astype(np.int64))
    _, data = torch.unique(codes, return_inverse=True)  # character ids in code-point order
    data = data % cfg["vocab_size"]
    model = zoo_model(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    t_first, t0 = 0.0, 0.0
    for i in range(steps):
        idx = torch.randint(0, len(data) - context - 1, (batch_size,), generator=g).tolist()
        x = torch.stack([data[j: j + context] for j in idx])
        y = torch.stack([data[j + 1: j + 1 + context] for j in idx])
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i == 0:
            t_first, t0 = time.time(), time.perf_counter()
    rest = time.perf_counter() - t0
    sps = (steps - 1) / rest if steps > 1 else float("nan")
    return dict(time_to_first_step_s=t_first - spawned_at, steps_per_second=sps,
                tokens_per_second=sps * batch_size * context, steps=steps, loss=loss.item())


def bench_train_overhead(s: Settings, workdir: Path | None = None, train: Sequence[str] = TRAIN) -> str:
    """zoo's training command against a bare loop over the same zoo model; time to first step.

    Runs `python -m zoo train experiment=nanogpt_cpu trainer.max_steps=N [--train-args ...]` (`train`: the command)
    in `workdir` (default: the current directory, where its outputs/ go) and reads `summary.json` (keys
    tokens_per_second, wall_time_s, time_to_first_step_s) from the run directory it prints; then
    `python -m zoo.bench --bare-loop N`, the same model in a plain loop."""
    head = "## train.py overhead\n\n"
    workdir = Path.cwd() if workdir is None else workdir
    n = s.overhead_steps
    # float32, as the bare loop: this section measures the training command's overhead, not precision (auto may
    # pick bf16)
    cmd = [*train, "experiment=nanogpt_cpu", f"trainer.max_steps={n}", "trainer.precision=32-true", *s.train_args]
    run = run_training(cmd, workdir)
    if isinstance(run, str):
        return head + run
    summary, summary_path, wall, train_load = run
    data = summary.get("data") or {}
    spec = {"model": summary.get("model"), "batch": data.get("batch_size"), "context": data.get("context")}
    bare_cmd = [sys.executable, "-m", "zoo.bench", "--bare-loop", str(n), "--bare-spec", json.dumps(spec),
                "--spawned-at", repr(time.time()), *(["--threads", str(s.threads)] if s.threads else [])]
    load_before = load_average(short=True)
    bp = subprocess.run(bare_cmd, capture_output=True, text=True, cwd=workdir, timeout=3600, env=child_env())
    bare_load = f"{load_before} -> {load_average(short=True)}"
    lines = [ln for ln in bp.stdout.splitlines() if ln.startswith("{")]
    if bp.returncode != 0 or not lines:
        return head + f"failed: bare loop: {(bp.stderr.strip().splitlines() or ['?'])[-1][:200]}\n"
    bare = json.loads(lines[-1])

    def get(d: dict, k: str) -> str:
        v = d.get(k)
        return num(v) if isinstance(v, (int, float)) and v > 0 else "-"

    tps = summary.get("tokens_per_second")
    rows = [[train_command(), get(summary, "tokens_per_second"), get(summary, "time_to_first_step_s"),
             get(summary, "wall_time_s"), num(wall), train_load],
            ["bare PyTorch loop", num(bare["tokens_per_second"]), num(bare["time_to_first_step_s"]), "-", "-",
             bare_load]]
    rel = ratio(tps / bare["tokens_per_second"]) if isinstance(tps, (int, float)) and tps > 0 else "-"
    return head + "\n".join([
        f"`{shown(cmd[len(train):])}` (summary: `{_relative(summary_path, workdir)}`) against "
        "a bare loop (`zoo.bench.sections.overhead.bare_loop`: the same zoo model config, batch and context as the "
        "summary's, "
        f"AdamW, random windows of the Shakespeare characters), {n} steps each. The bare loop's time to first "
        "step counts from process spawn; the training command's figures are its own summary's (its own "
        "definitions of throughput and time to first step, which may exclude start-up or include evaluation). The "
        "two runs are sequential, not interleaved: compare their load averages before trusting the ratio.", "",
        table(["run", "tokens/s", "time to first step s", "wall s (summary)", "wall s (process)", "load average"],
              rows), "",
        f"{train_command()} throughput / bare loop: **{rel}**", ""])


def _relative(path: Path, workdir: Path) -> Path:
    """The summary's path as the report shows it: from the working directory when it is under it."""
    return path.relative_to(workdir) if path.is_relative_to(workdir) else path


@section("overhead")
def section_overhead(sess: Session) -> str:
    return bench_train_overhead(sess.settings)
