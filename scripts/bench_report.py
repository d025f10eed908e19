"""What `zoo report` costs on a large sweep: a fake sweep directory of N small finished runs (the files a real run
leaves: summary.json, metrics.csv, .hydra/overrides.yaml and config.yaml, the .zoo-run marker, and the sweep's
multirun.yaml), then `python -m zoo.report` on it, timed. Deletes the sweep at the end unless --keep.

    python scripts/bench_report.py --runs 5000 20000 --out /tmp/report-bench
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

FFNS = ("relu", "gelu", "swiglu", "reglu")  # the sweep's one factor; seeds make up the rest


def multirun_yaml(n_seeds: int) -> str:
    """The sweep's plan as Hydra saves it (the parts the report reads): BasicSweeper, ffn x seed."""
    return ("hydra:\n  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
            "    max_batch_size: null\n    params: null\n  overrides:\n    task:\n"
            f"    - ffn={','.join(FFNS)}\n    - seed=range(0,{n_seeds})\n")


def write_run(d: Path, ffn: str, seed: int, steps: int = 200, evals: int = 4) -> None:
    """One finished run of a 0.01M model: its summary, its metrics.csv (a training row per step, an evaluation
    every steps/evals steps), Hydra's saved overrides and config."""
    rng = random.Random(seed * 31 + FFNS.index(ffn))
    loss = [4.6 * math.exp(-s / 400) + 0.05 * rng.random() for s in range(steps)]
    evals_at = [steps * (i + 1) // evals for i in range(evals)]
    history = [{"val_loss": loss[s - 1] + 0.02, "step": s, "wall_time_s": 0.01 * s} for s in evals_at]
    overrides = [f"ffn={ffn}", f"seed={seed}"]
    final = history[-1]["val_loss"]
    summary = {"status": "completed", "diverged": False, "diverged_step": None,
               "architecture": {"lineage": "decoder_only", "ffn": ffn}, "optim": {"name": "adamw", "lr": 1e-3},
               "data": {"kind": "text", "path": None}, "seed": seed, "params": {"total": 5968, "active": 5968},
               "flops_per_token": {"forward": 13504, "train": 40512}, "steps": steps, "tokens_seen": steps * 768,
               "wall_time_s": 2.0, "train_time_s": 1.8, "eval_time_s": 0.1, "resumes": 0,
               "tokens_per_second": 85000.0, "final": {"val_loss": final, "val_ppl": math.exp(final)},
               "best": {"val_loss": {"value": min(h["val_loss"] for h in history), "step": steps}},
               "directions": {"val_loss": "min", "val_ppl": "min"}, "history": history, "overrides": overrides,
               "load": {"loadavg": [1.0, 1.0, 1.0], "cpu_count": 2}, "cpu_kind": "avx512_bf16"}
    (d / ".hydra").mkdir(parents=True)
    (d / ".zoo-run").write_text("zoo run directory\n")
    (d / "summary.json").write_text(json.dumps(summary, indent=2))
    (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (d / ".hydra" / "config.yaml").write_text(f"seed: {seed}\noptim:\n  name: adamw\n  lr: 0.001\n")
    rows = ["epoch,step,tok/s,train_loss,val_loss"]
    for s in range(steps):  # Lightning's step column is the 0-based index of the batch
        rows.append(f"0,{s},85000.0,{loss[s]},")
        if s + 1 in evals_at:
            rows.append(f"0,{s},,,{loss[s] + 0.02}")
    (d / "metrics.csv").write_text("\n".join(rows) + "\n")


def make_sweep(root: Path, n_runs: int, steps: int = 200) -> Path:
    """A sweep directory of n_runs finished runs of `steps` steps, numbered as Hydra numbers its jobs (ffn outer,
    seed inner)."""
    n_seeds = -(-n_runs // len(FFNS))
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text(multirun_yaml(n_seeds))
    for job in range(n_runs):
        write_run(root / str(job), FFNS[job // n_seeds], job % n_seeds, steps)
    return root


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, nargs="+", default=[5000, 20000], help="sweep sizes to measure")
    p.add_argument("--out", type=Path, required=True, help="a directory to create the sweeps in (must not exist)")
    p.add_argument("--keep", action="store_true", help="keep the sweeps")
    args = p.parse_args()
    for n in args.runs:
        root = make_sweep(args.out / f"sweep-{n}", n)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "zoo.report", str(root)], capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode:
            sys.exit(f"zoo.report failed on {n} runs: {proc.stderr.strip()}")
        print(f"{n} runs: {seconds:.2f} s ({1e3 * seconds / n:.3f} ms per run)", flush=True)
    if not args.keep:
        shutil.rmtree(args.out)


if __name__ == "__main__":
    main()
