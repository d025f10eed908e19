"""Training-step time of zoo at two git revisions, interleaved: did a change make zoo slower?

    python scripts/compare_revisions.py 8e7e37b                 # that revision against the working tree
    python scripts/compare_revisions.py 8e7e37b --shapes small --rounds 21

Each (revision, family, shape) gets its own worker process, importing zoo from that revision's files
(`git archive` into a temporary folder) with one torch thread. Workers build zoo.bench's training step
(forward + backward + AdamW) and wait; the parent asks them in turn for a block of steps, alternating
which revision goes first, so a noisy shared machine slows both alike. Prints the median step time per
revision, the interquartile range, and new / old.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs in the worker: the same code must work with the zoo of either revision (zoo.bench's public pieces).
WORKER = """
import json, sys, time
import torch
torch.set_num_threads(1)
from zoo.bench import SHAPES, Settings, Variant, make_train_run
run = make_train_run(SHAPES[sys.argv[1]], Variant("zoo", sys.argv[2]), Settings())
for _ in range(3):
    run.step()
print("ready", flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        t = time.perf_counter()
        run.step()
        times.append(time.perf_counter() - t)
    print(json.dumps(times), flush=True)
"""


def export(rev: str, into: Path) -> Path:
    """The files of `rev` (a commit) in a folder, or the working tree itself for rev None."""
    data = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def worker(src: Path, shape: str, family: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-c", WORKER, shape, family], cwd=src, env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if p.stdout.readline().strip() != "ready":
        raise SystemExit(f"worker for {src} ({family}, {shape}) failed to start")
    return p


def ask(p: subprocess.Popen, steps: int) -> list[float]:
    p.stdin.write(f"{steps}\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def cpu_kind() -> str:
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("Model name")), "?")
    flags = next((line for line in info.splitlines() if line.startswith("Flags")), "")
    kind = "AMX" if "amx_bf16" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else "no bf16 units"
    return f"{model} ({kind}), {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base", help="the git revision to compare the working tree against")
    ap.add_argument("--shapes", default="small,large", help="zoo.bench shapes (default: small,large)")
    ap.add_argument("--families", default="gpt2,llama", help="zoo.bench model families (default: gpt2,llama)")
    ap.add_argument("--rounds", type=int, default=15, help="blocks per revision (default: 15)")
    ap.add_argument("--steps", type=int, default=3, help="steps per block (default: 3)")
    args = ap.parse_args(argv)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"{cpu_kind()}; load average {os.getloadavg()[0]:.1f} at start; one torch thread per worker\n")
    print(f"| shape | family | {args.base} ms/step (IQR) | working tree ({head.strip()}) ms/step (IQR) | new / old |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        old_src = export(args.base, Path(tmp))
        for shape in args.shapes.split(","):
            for family in args.families.split(","):
                procs = [worker(old_src, shape, family), worker(ROOT, shape, family)]
                times: list[list[float]] = [[], []]
                for r in range(args.rounds):
                    for i in (0, 1) if r % 2 == 0 else (1, 0):
                        times[i] += ask(procs[i], args.steps)
                for p in procs:
                    p.stdin.close()
                    p.wait()
                med = [statistics.median(t) for t in times]
                iqr = [statistics.quantiles(t, n=4)[2] - statistics.quantiles(t, n=4)[0] for t in times]
                print(f"| {shape} | {family} | {1e3 * med[0]:.1f} ({1e3 * iqr[0]:.1f}) | "
                      f"{1e3 * med[1]:.1f} ({1e3 * iqr[1]:.1f}) | {med[1] / med[0]:.3f} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
