"""The command line: `python -m zoo.bench [--only SECTIONS] [flags]` (and `zoo bench`): the settings from the
flags, the sections run in order, the report written after each one. Bad flags are one line and exit code 2."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from zoo.bench import writer
from zoo.bench.contenders import PEERS
from zoo.bench.machine import kind_label, load_average, load_value, machine_info
from zoo.bench.registry import SECTIONS
from zoo.bench.sections.convert import convert_probe
from zoo.bench.sections.memory import memory_probe
from zoo.bench.sections.overhead import bare_loop
from zoo.bench.sections.ttt import TTT_RUNS
from zoo.bench.session import Session
from zoo.bench.settings import SHAPES, Settings
from zoo.build import ConfigError
from zoo.commands import OneLineParser
from zoo.io import atomic_write_text

# --help's description: the first line of the package's docstring (zoo/bench/__init__.py, which imports this module)
DESCRIPTION = "`python -m zoo.bench`: zoo's speed and memory against peer implementations, written to Markdown."


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = OneLineParser("bench", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    names = ",".join(SECTIONS.names())
    p.add_argument("--only", default=names, help=f"comma-separated sections: {names}")
    p.add_argument("--quick", action="store_true", help="a fast smoke run with few steps")
    p.add_argument("--out", default="docs/benchmarks.md", help="Markdown file to write ('-' for stdout only)")
    p.add_argument("--shapes", default=None, help=f"comma-separated, of {','.join(SHAPES)} (default small,large)")
    p.add_argument("--peers", default=",".join(PEERS), help=f"contenders to include: {','.join(PEERS)}")
    p.add_argument("--nanogpt", default=None, help="a karpathy/nanoGPT checkout (directory with model.py)")
    p.add_argument("--rounds", type=int, default=None, help="fixed number of interleaved rounds")
    p.add_argument("--target-s", type=float, default=None, help="timed seconds per contender (default 3)")
    p.add_argument("--gen-contexts", default=None, help="comma-separated prompt lengths for generation")
    p.add_argument("--gen-shape", default=None, help="shape of the generation model (default large)")
    p.add_argument("--kv-context", type=int, default=None, help="context for the KV-cache size table")
    p.add_argument("--train-steps", type=int, default=None, help="steps of the overhead section's training run")
    p.add_argument("--train-args", default="", help="extra overrides for the training runs (one string)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--text", default=None, help="ttt: the text file both sides train on (e.g. tinyshakespeare.txt)")
    p.add_argument("--ttt-pairs", type=int, default=None, help="ttt: rounds of every contender (default 3)")
    p.add_argument("--ttt-target", type=float, default=None,
                   help="ttt: the yardstick loss to reach (default: nanoGPT's final model's there)")
    p.add_argument("--ttt-margin", type=float, default=None,
                   help="ttt: time zoo's contenders to the target less this (nanoGPT to the target; default 0)")
    p.add_argument("--ttt-runs", default=None,
                   help=f"ttt: zoo's contenders, comma-separated, of {','.join(TTT_RUNS)} (default: all)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N for the mfu section on a GPU")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="a datasheet's dense bf16 peak in TFLOP/s (e.g. 989 for an H100 SXM): MFU against it too")
    p.add_argument("--memory-steps", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)  # SHAPE:VARIANT, internal
    p.add_argument("--convert-probe", default=None, help=argparse.SUPPRESS)  # PATH:DIRECTORY, internal
    p.add_argument("--bare-loop", type=int, default=None, help=argparse.SUPPRESS)  # internal
    p.add_argument("--bare-spec", default=None, help=argparse.SUPPRESS)  # internal: JSON for bare_loop
    p.add_argument("--spawned-at", type=float, default=None, help=argparse.SUPPRESS)  # internal
    return p.parse_args(argv)


def _names(flag: str, text: str, valid: Sequence[str], what: str = "") -> tuple[str, ...]:
    """A flag's comma-separated names, each one of `valid`; else ConfigError naming the first unknown one."""
    names = tuple(x for x in text.split(",") if x)
    bad = [x for x in names if x not in valid]
    if bad:
        raise ConfigError(f"{flag}: unknown {what}'{bad[0]}'; valid: {', '.join(valid)}")
    return names


def sections_from_args(a: argparse.Namespace) -> list[str]:
    """The sections `--only` names, each a registered one."""
    return list(_names("--only", a.only, SECTIONS.names(), "section "))


def settings_from_args(a: argparse.Namespace) -> Settings:
    over: dict = {}
    if a.shapes:
        over["shapes"] = _names("--shapes", a.shapes, list(SHAPES))
    over["peers"] = tuple(x for x in a.peers.split(",") if x)
    if a.nanogpt:
        over["nanogpt"] = Path(a.nanogpt).expanduser().resolve()
    if a.rounds:
        over.update(min_rounds=a.rounds, max_rounds=a.rounds, target_s=0.0)
    if a.target_s is not None:
        over["target_s"] = a.target_s
    if a.gen_contexts:
        over["gen_contexts"] = tuple(int(x) for x in a.gen_contexts.split(",") if x)
    if a.gen_shape:
        over["gen_shape"] = a.gen_shape
    if a.kv_context:
        over["kv_context"] = a.kv_context
    if a.train_steps:
        over["overhead_steps"] = a.train_steps
    if a.memory_steps:
        over["memory_steps"] = a.memory_steps
    if a.text:
        over["text"] = Path(a.text).expanduser().resolve()
    if a.ttt_pairs:
        over["ttt_pairs"] = a.ttt_pairs
    if a.ttt_target is not None:
        over["ttt_target"] = a.ttt_target
    if a.ttt_margin is not None:
        if not a.ttt_margin >= 0:
            raise ConfigError(f"--ttt-margin: got {a.ttt_margin}; valid: a loss difference >= 0")
        over["ttt_margin"] = a.ttt_margin
    if a.ttt_runs:
        over["ttt_runs"] = _names("--ttt-runs", a.ttt_runs, list(TTT_RUNS))
    over["train_args"] = tuple(shlex.split(a.train_args))
    over["threads"] = a.threads
    over["device"], over["peak_tflops"] = a.device, a.peak_tflops
    if not re.fullmatch(r"cpu|cuda(:\d+)?", a.device):
        raise ConfigError(f"--device: unknown '{a.device}'; valid: cpu, cuda, cuda:N")
    if a.device != "cpu":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device: '{a.device}' but this machine has no CUDA GPU; valid here: cpu")
        bad = [x for x in a.only.split(",") if x and x != "mfu"]
        if bad:
            raise ConfigError(f"--only: section '{bad[0]}' runs on CPU only; valid with --device {a.device}: mfu")
        if not a.quick:
            over["matmul_n"] = 8192  # a GPU's peak needs a large product (2048 is launch-bound)
    return Settings.quick_run(**over) if a.quick else Settings(**over)


def run_sections(names: Sequence[str], s: Settings, argv: Sequence[str] = (), out: Path | None = None,
                 echo: bool = True) -> str:
    """Run the named sections in registry order; write `out` after each one, so a crash keeps what finished.

    Only the block of this run's processor kind changes (zoo.bench.writer): a run of every section rewrites it, a
    run of some replaces just those, each stamped with its own command and machine. Nothing is written under docs/
    by a section whose load average, at its start or end, was above the core count: a busy machine's timings must
    not become the record. Returns the report of this run alone."""
    sess, done, info, kind = Session(s), {}, machine_info(s), kind_label(s)
    whole = set(names) == set(SECTIONS.names())
    old = out.read_text() if out is not None and out.is_file() else None
    for name in [n for n in SECTIONS.names() if n in names]:
        t0 = time.perf_counter()
        if echo:
            print(f"[zoo.bench] {name} ...", flush=True)
        load = load_average()
        busy = load_value(load)
        text = SECTIONS.get(name)(sess)
        done[name] = writer.with_kind(text, kind).rstrip() + \
            f"\n\n_Section time {time.perf_counter() - t0:.0f} s; load average {load} at its start, " \
            f"{load_average()} at its end._\n"
        if echo:
            print(done[name], f"[zoo.bench] {name}: {time.perf_counter() - t0:.0f} s", sep="\n", flush=True)
        busy = max(busy, load_value())
        if out is not None and "docs" in out.resolve().parts and busy > (os.cpu_count() or 1) and not s.quick:
            print(f"[zoo.bench] not written to {out}: the load average reached {busy:.2f} on {os.cpu_count()} "
                  "cores during this section; rerun on a quiet machine (or pass --out elsewhere)", flush=True)
            out = None
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out, writer.write(old, kind, done, argv, info, whole, s.quick))
            print(f"[zoo.bench] wrote {name} to {out}", flush=True)
    return writer.write(None, kind, done, argv, info, True, s.quick)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    try:
        names = sections_from_args(a)
        s = settings_from_args(a)
        probe = a.memory_probe or a.convert_probe or a.bare_loop  # a child process of a section: writes no report
        if not probe and a.out != "-" and Path(a.out).is_file():  # a report it cannot update, said before any section
            writer.check(Path(a.out).read_text(), kind_label(s))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    if s.device != "cpu":
        torch.backends.cuda.matmul.allow_tf32 = True  # as trainer=gpu's tf32=true
    if a.memory_probe:
        shape_name, key = a.memory_probe.split(":", 1)
        print(json.dumps(memory_probe(shape_name, key, s)))
        return 0
    if a.convert_probe:
        path, directory = a.convert_probe.split(":", 1)
        print(json.dumps(convert_probe(directory, path)))
        return 0
    if a.bare_loop:
        spec = json.loads(a.bare_spec) if a.bare_spec else None
        print(json.dumps(bare_loop(a.bare_loop, a.spawned_at or time.time(), spec)))
        return 0
    out = None if a.out == "-" else Path(a.out)
    run_sections(names, s, argv, out)
    return 0

