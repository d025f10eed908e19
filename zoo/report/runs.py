"""Finding the runs of a sweep, reading them, and matching them to the jobs the sweep planned."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from zoo.io import (
    MAX_SWEEP_JOBS,
    READ_LIMITS,
    FileFormatError,
    first_line,
    is_running,
    read_csv,
    read_json,
    read_text_bounded,
    read_yaml,
    sweep_size,
)
from zoo.report.stats import higher_is_better

# Run statuses: completed | diverged | interrupted | failed (the summary says so) | killed (no summary.json,
# nobody holds run.lock) | running (no summary.json yet, run.lock held) | unreadable (a broken summary.json, or
# summary.json / metrics.csv a link or not a file: the report reads nothing through a link).
FAILED = ("failed", "interrupted", "killed", "unreadable")  # counted in the table's `failed` column
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


OPTIM = "optim"  # the factor naming a run's optimizer, which summary.json records whatever chose it


class ReportError(ValueError):
    """Bad input to the report (no runs, unknown metric, unknown baseline), reported as one line."""


@dataclass
class Run:
    path: Path
    status: str
    overrides: dict[str, str]
    summary: dict | None = None
    metrics_csv: Path | None = None  # read when first needed: summary.json holds the history of most runs
    detail: str = ""  # why a run is not completed, for the job list
    optim: str | None = None  # the optimizer it trained with (summary.json, else .hydra/config.yaml); None: unknown
    _csv: tuple[list[dict], list[tuple[float, float]]] | None = field(default=None, repr=False)

    def _metrics(self) -> tuple[list[dict], list[tuple[float, float]]]:
        if self._csv is None:
            evals, train, damage = _read_metrics_csv(self.metrics_csv) if self.metrics_csv else ([], [], None)
            if damage:  # read as far as it goes; the run stands, said in its detail
                self.detail = "; ".join(filter(None, [self.detail, _said(damage, self.path)]))
            self._csv = evals, train
        return self._csv

    @property
    def csv_history(self) -> list[dict]:
        """metrics.csv's evaluation rows, {metric: value, step}."""
        return self._metrics()[0]

    @property
    def train_history(self) -> list[tuple[float, float]]:
        """(step, train_loss) of metrics.csv."""
        return self._metrics()[1]

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    @property
    def directions(self) -> dict[str, str]:
        d = (self.summary or {}).get("directions")
        return d if isinstance(d, dict) else {}

    @property
    def busy(self) -> bool:
        """The machine's 1-minute load average exceeded its core count when the run ended."""
        load = (self.summary or {}).get("load") or {}
        try:
            return float(load["loadavg"][0]) > float(load["cpu_count"])
        except (KeyError, IndexError, TypeError, ValueError):
            return False

    def history(self, metric: str, at: str = "step") -> list[tuple[float, float]]:
        """(step, value) of every evaluation; from summary.json, else from metrics.csv. at="wall_time_s": (seconds
        into the run, value) instead, where the summary records them."""
        rows = (self.summary or {}).get("history") or self.csv_history
        out = []
        for row in rows:
            value, x = row.get(metric), row.get(at)
            if value is not None and x is not None and math.isfinite(float(value)):
                out.append((float(x), float(value)))
        return out

    def final(self, metric: str) -> float | None:
        value = ((self.summary or {}).get("final") or {}).get(metric)
        if value is None:
            hist = self.history(metric)
            value = hist[-1][1] if hist else None
        return None if value is None or not math.isfinite(value) else float(value)

    def best(self, metric: str, higher: bool) -> float | None:
        entry = ((self.summary or {}).get("best") or {}).get(metric)
        if entry is not None:
            return float(entry["value"])
        values = [v for _, v in self.history(metric)]
        if not values:
            return None
        return max(values) if higher else min(values)

    def value(self, factor: str) -> str:
        """This run's value of a factor: its override; for `optim`, else the optimizer it trained with (the
        default's name, or a preset's choice); else (default)."""
        if factor in self.overrides:
            return self.overrides[factor]
        return self.optim if factor == OPTIM and self.optim else "(default)"

    def get(self, *keys):
        d = self.summary or {}
        for k in keys:
            if not isinstance(d, dict) or k not in d:
                return None
            d = d[k]
        return d


def instruction_sets(runs: list[Run]) -> dict[str, int]:
    """How many runs trained on each CPU instruction set: summary.json's cpu_isa (zoo.hardware.instruction_set);
    where a run is older than that record, every run's coarser cpu_kind, so that old and new records compare."""
    key = "cpu_isa" if all(isinstance(r.get("cpu_isa"), str) for r in runs if r.summary and r.get("cpu_kind")) \
        else "cpu_kind"
    counts: dict[str, int] = {}
    for r in runs:
        if isinstance(value := r.get(key), str):
            counts[value] = counts.get(value, 0) + 1
    return counts


def variant_label(key: tuple[tuple[str, str], ...]) -> str:
    """How a variant is named from its (factor, value) pairs: `relu` for one plain group, else `f=v, ...`."""
    if not key:
        return "all runs"
    if len(key) == 1 and "." not in key[0][0]:
        return key[0][1]
    return ", ".join(f"{f}={val}" for f, val in key)


def _natural_key(path: Path) -> list:
    return [int(p) if p.isdigit() else p for part in path.parts for p in re.split(r"(\d+)", part) if p]


def find_run_dirs(root: Path) -> list[Path]:
    """Directories holding summary.json, metrics.csv or .hydra/overrides.yaml, outermost only. Linear in the
    directories walked: the walk does not enter a run holding summary.json or metrics.csv, and a directory found
    below another run (one holding only .hydra) is dropped by looking its ancestors up in a set."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here.name == ".hydra" and "overrides.yaml" in filenames:
            found.add(here.parent)
        if {"summary.json", "metrics.csv"} & set(filenames + dirnames):  # a directory of that name: unreadable
            found.add(here)
            dirnames[:] = []  # nothing below an outer run is listed
        else:
            dirnames[:] = [d for d in dirnames if d != "checkpoints"]
    outer = {p for p in found if not any(a in found for a in p.parents)}
    return sorted(outer, key=_natural_key)


def parse_overrides(items) -> dict[str, str]:
    """['ffn=relu', '+x=1', '~y'] -> {'ffn': 'relu', 'x': '1', 'y': '(deleted)'}."""
    out = {}
    for item in items or []:
        item = str(item).strip()
        key, sep, value = item.partition("=")
        if key.startswith("~"):
            out[key[1:]] = "(deleted)" if not sep else f"(deleted {value})"
        elif sep:
            out[key.lstrip("+")] = value
    return out


def _optimizer(summary: dict | None, path: Path) -> str | None:
    """The optimizer's name a run records: summary.json's `optim`, else the config Hydra saved when it started
    (a run that died before its summary); None for a run from before the optim group, or unreadable."""
    recorded = (summary or {}).get(OPTIM)
    config = path / ".hydra" / "config.yaml"
    if recorded is None and config.is_file() and not not_a_file(config):
        try:
            recorded = (read_yaml(config) or {}).get(OPTIM)
        except (OSError, ValueError, AttributeError):
            return None
    name = recorded.get("name") if isinstance(recorded, dict) else None
    return name if isinstance(name, str) else None


def _read_overrides_yaml(path: Path) -> list[str]:
    """Hydra's .hydra/overrides.yaml: a YAML list of strings."""
    try:
        data = read_yaml(path)
        return [str(x) for x in data] if isinstance(data, list) else []
    except FileFormatError:  # a truncated file: read the '- item' lines by hand (if it is a small, plain file)
        try:
            text = read_text_bounded(path, READ_LIMITS["yaml"])
        except (OSError, ValueError):
            return []
        return [line[2:].strip() for line in text.splitlines() if line.startswith("- ")]
    except OSError:
        return []


def _read_metrics_csv(path: Path) -> tuple[list[dict], list[tuple[float, float]], str | None]:
    """(evaluation rows as {metric: value, step}, (step, train_loss) pairs, what is wrong or None) of metrics.csv,
    read as far as it goes: up to a row whose step is out of range, nothing if it is not a CSV zoo reads. Lightning logs
    an evaluation during fit at the 0-based index of the last batch, one less than summary.json's global
    step: add 1 (training rows likewise)."""
    rows: list[dict] = []
    train: list[tuple[float, float]] = []
    try:
        for row in read_csv(path)[1]:
            if not row.get("step"):
                continue
            step = _step(row["step"], path)
            values = {}
            for k, v in row.items():
                if k in (None, "epoch", "step") or not v:
                    continue
                try:
                    x = float(v)
                except ValueError:
                    continue
                if k.startswith(("val_", "exact_match")):
                    values[k] = x
                elif k == "train_loss" and math.isfinite(x):
                    train.append((step, x))
            if values:
                rows.append({**values, "step": step})
    except FileFormatError as e:
        return rows, train, first_line(e)
    except (OSError, ValueError):
        return [], [], None
    return rows, train, None


MAX_STEP = 10**15  # far beyond any run; a step past it (1e400, 400 digits) is a damaged file, not a run


def _step(text: str, path: Path) -> int:
    """metrics.csv's 0-based step as summary.json's 1-based one; FileFormatError for one out of range."""
    try:
        x = float(text)
    except ValueError:
        raise FileFormatError(f"'{path}': step {text[:40]!r} is not a number") from None
    if not 0 <= x < MAX_STEP:
        raise FileFormatError(f"'{path}': step {text[:40]} is out of range (0 to {MAX_STEP})")
    return int(x) + 1


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
              type(None): "null"}


def check_summary(s) -> str | None:
    """Why a parsed summary.json cannot be read (None when it can): the report uses these fields as numbers."""
    if not isinstance(s, dict):
        return f"summary.json holds {JSON_TYPES.get(type(s), type(s).__name__)}, not a JSON object"
    for key in ("final", "best", "directions", "params", "flops_per_token", "load"):
        if s.get(key) is not None and not isinstance(s[key], dict):
            return f"summary.json: '{key}' is {s[key]!r}, not an object"
    if s.get("history") is not None and not (isinstance(s["history"], list)
                                             and all(isinstance(h, dict) for h in s["history"])):
        return "summary.json: 'history' is not a list of objects"
    for name, value in (s.get("final") or {}).items():
        if not _number(value):
            return f"summary.json: final.{name} is {value!r}, not a number"
    for name, entry in (s.get("best") or {}).items():
        if not isinstance(entry, dict) or not _number(entry.get("value")):
            return f"summary.json: best.{name} is {entry!r}, not {{'value': <number>, ...}}"
    for i, row in enumerate(s.get("history") or []):
        bad = next((k for k, v in row.items() if not _number(v)), None)
        if bad is not None:
            return f"summary.json: history[{i}].{bad} is {row[bad]!r}, not a number"
    for keys in (("tokens_per_second",), ("params", "total"), ("flops_per_token", "train")):
        value = s
        for k in keys:
            value = value.get(k) if isinstance(value, dict) else None
        if value is not None and not _number(value):
            return f"summary.json: {'.'.join(keys)} is {value!r}, not a number"
    if s.get("overrides") is not None and not isinstance(s["overrides"], list):
        return "summary.json: 'overrides' is not a list"
    return None


def not_a_file(path: Path) -> str | None:
    """Why the report will not read `path` (a link, a directory, not a regular file), or None (a file or absent)."""
    if path.is_symlink():
        return f"{path.name} is a symbolic link"
    if os.path.lexists(path) and not path.is_file():
        return f"{path.name} is {'a directory' if path.is_dir() else 'not a regular file'}"
    return None


def _said(e: FileFormatError | str, run_dir: Path) -> str:
    """A file's one-line error as the job list says it: the file by its name in the run directory."""
    text = e if isinstance(e, str) else first_line(e)
    for name in ("summary.json", "metrics.csv"):
        text = text.replace(f"'{run_dir / name}'", name)
    return text


def load_run(path: Path) -> Run:
    summary = None
    problem = not_a_file(path / "summary.json") or not_a_file(path / "metrics.csv")
    if problem is None and (path / "summary.json").is_file():
        try:
            summary = read_json(path / "summary.json")
        except FileFormatError as e:
            problem = _said(e, path)
        except OSError as e:
            problem = f"summary.json: cannot read it ({e.strerror or e})"
        else:
            problem = check_summary(summary)
        if problem:
            summary = None
    if summary is not None and summary.get("overrides") is not None:
        overrides = parse_overrides(summary["overrides"])
    elif (path / ".hydra" / "overrides.yaml").is_file() and not not_a_file(path / ".hydra" / "overrides.yaml"):
        overrides = parse_overrides(_read_overrides_yaml(path / ".hydra" / "overrides.yaml"))
    else:
        overrides = {}
    if problem:
        status, detail = "unreadable", problem
    elif summary is None:
        # no summary yet: the run is alive if it holds its lock; otherwise it died before writing one
        if is_running(path):
            status, detail = "running", "run.lock held by a live process"
        else:
            status, detail = "killed", "no summary.json and run.lock not held: the process died"
    else:
        status = str(summary.get("status") or "failed")
        detail = str(summary.get("error") or "")
        if summary.get("diverged"):
            status = "diverged"
            step = summary.get("diverged_step")
            detail = f"non-finite loss at step {step}" if step is not None else "non-finite loss"
    resumes = (summary or {}).get("resumes")
    if isinstance(resumes, int) and not isinstance(resumes, bool) and resumes > 0:
        detail = "; ".join(filter(None, [detail, f"resumed {resumes}x from a checkpoint"]))
    csv_path = path / "metrics.csv"
    metrics = csv_path if csv_path.is_file() and not problem else None
    return Run(path, status, overrides, summary, metrics, detail, _optimizer(summary, path))


def load_runs(root: Path) -> list[Run]:
    return [load_run(p) for p in find_run_dirs(root)]


def metric_direction(runs: list[Run], metric: str) -> bool:
    """Higher is better? As the runs' summaries record it (the most common answer), else by the name."""
    votes = [r.directions[metric] == "max" for r in runs if r.directions.get(metric) in ("min", "max")]
    if votes:
        return sum(votes) * 2 > len(votes)
    return higher_is_better(metric)


# ----------------------------------------------------------------------------------------------
# The sweep's plan: which jobs it launches, and what became of each
# ----------------------------------------------------------------------------------------------

JOB_STATES = ("finished", "running", "failed", "diverged", "missing")


@dataclass
class Job:
    overrides: list[str]  # the job's task overrides, as Hydra passes them
    run: Run | None  # None: planned, but no directory holds it

    @property
    def state(self) -> str:
        if self.run is None:
            return "missing"
        s = self.run.status
        return {"completed": "finished", "running": "running", "diverged": "diverged"}.get(s, "failed")

    @property
    def detail(self) -> str:
        if self.run is None:
            return "no run directory"
        if self.run.status in ("interrupted", "killed", "unreadable"):
            return f"{self.run.status}: {self.run.detail}"
        return self.run.detail


@dataclass
class Plan:
    jobs: list[Job]
    source: str  # where the job list came from, said in the report

    def count(self, state: str) -> int:
        return sum(j.state == state for j in self.jobs)


def planned_jobs(root: Path) -> tuple[list[list[str]] | None, str]:
    """The sweep's job list from its multirun.yaml, expanded as Hydra's BasicSweeper does (its own
    override parser and split_arguments); (None, why) when there is no plan to read."""
    path = root / "multirun.yaml"
    if problem := not_a_file(path):
        return None, f"{problem}, not read: the jobs found on disk"
    if not path.is_file():
        return None, "no multirun.yaml: the jobs found on disk"
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf

        cfg = OmegaConf.create(read_yaml(path))
        sweeper = OmegaConf.select(cfg, "hydra.sweeper._target_", default=None)
        if sweeper != BASIC_SWEEPER:  # Optuna and other searches decide their jobs as they go
            return None, f"sweeper {sweeper}: the jobs found on disk"
        params = OmegaConf.to_container(cfg.hydra.sweeper.get("params") or OmegaConf.create({}), resolve=False)
        task = [str(o) for o in OmegaConf.to_container(cfg.hydra.overrides.task, resolve=False)]
        # as BasicSweeper.sweep: the config's sweeper params first, then the command line's overrides
        arguments = [f"{k}={v}" for k, v in params.items()] + task
        overrides = OverridesParser.create().parse_overrides(arguments)
        if sweep_size(overrides) > MAX_SWEEP_JOBS:
            return None, f"'{path}' plans more than {MAX_SWEEP_JOBS} jobs, not expanded: the jobs found on disk"
        batches = BasicSweeper.split_arguments(overrides, None)
    except Exception as e:  # an unreadable plan is no reason to withhold the report
        return None, f"multirun.yaml unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return [list(job) for batch in batches for job in batch], "multirun.yaml"


def skipped_variants(root: Path) -> dict[str, str]:
    """The variants the sweep's study leaves out, each with its reason: hydra.callbacks.report.skipped in its
    multirun.yaml (study=narang's rows that do not apply to its application); {} where there is none."""
    path = root / "multirun.yaml"
    if not_a_file(path) or not path.is_file():
        return {}
    try:
        from omegaconf import OmegaConf

        found = OmegaConf.select(OmegaConf.create(read_yaml(path)), "hydra.callbacks.report.skipped", default=None)
        return {str(k): str(v) for k, v in (OmegaConf.to_container(found) if found is not None else {}).items()}
    except Exception:  # an unreadable plan is no reason to withhold the report
        return {}


def match_jobs(root: Path, runs: list[Run]) -> Plan:
    """Each planned job with the run directory holding its overrides; runs on disk if there is no plan."""
    planned, source = planned_jobs(root)
    if planned is None:
        return Plan([Job([f"{k}={v}" for k, v in r.overrides.items()], r) for r in runs], source)
    by_overrides: dict[tuple, list[Run]] = {}
    for r in runs:
        by_overrides.setdefault(tuple(sorted(r.overrides.items())), []).append(r)
    jobs = []
    for job in planned:
        found = by_overrides.get(tuple(sorted(parse_overrides(job).items())))
        jobs.append(Job(job, found.pop(0) if found else None))
    # run directories that no planned job names (another sweep's, or copied in) are still listed
    jobs += [Job([f"{k}={v}" for k, v in r.overrides.items()], r) for rs in by_overrides.values() for r in rs]
    return Plan(jobs, f"{len(planned)} planned in {source}")
