"""Atomic file writes (a reader, or the report, never sees half a file after an interruption), the run directory's
lock, and a command's quick start and exit (the garbage collector kept off what lives for the whole run)."""

from __future__ import annotations

import atexit
import gc
import json
import os
import re
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import IO, Any


def atomic_write(path: str | os.PathLike, write: Callable[[IO], Any], mode: str = "w") -> None:
    """Call write(file) on a temp file in the same directory, fsync it, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give what open() would give
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process umask, read without changing it (os.umask can only be read by setting it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# atomic_write's temp files: "." + the target's name + "." + mkstemp's 8 random characters + ".tmp"
_TEMP_FILE = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")


def remove_temp_files(directory: str | os.PathLike) -> list[Path]:
    """Delete the temp files an interrupted atomic_write left in `directory` (only that pattern, only
    regular files). Call it only while owning the directory (its run lock), never while a write runs."""
    removed = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for p in directory.iterdir():
        if _TEMP_FILE.match(p.name) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


# A run directory is owned by one process at a time: it holds an exclusive flock on RUN_LOCK for as long
# as it runs (the kernel drops the lock when the process dies, even by SIGKILL), so anyone can tell a
# running job from a dead one by trying the lock.
RUN_LOCK = "run.lock"


def lock_run_dir(run_dir: str | os.PathLike) -> IO | None:
    """Take the run directory's lock; returns the open lock file (keep it open), or None if another
    live process holds it."""
    import fcntl

    path = Path(run_dir) / RUN_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def is_running(run_dir: str | os.PathLike) -> bool:
    """True while a live process holds the run directory's lock."""
    import fcntl

    path = Path(run_dir) / RUN_LOCK
    if not path.is_file():
        return False
    with path.open() as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


def busy_message(run_dir: str | os.PathLike) -> str:
    """The one-line refusal for a run directory another live process holds (see lock_run_dir)."""
    try:
        pid = (Path(run_dir) / RUN_LOCK).read_text().strip()
    except OSError:
        pid = ""
    holder = f"pid {pid}" if pid.isdigit() else "pid unknown"
    return f"hydra.run.dir: '{run_dir}' is in use by a running process ({holder}); wait for it to end or " \
           "choose another directory"


def is_secondary_rank() -> bool:
    """True in a distributed worker other than the first (DDP ranks > 0): the first owns the run directory."""
    for var in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "0")
        if value.isdigit() and int(value) != 0:
            return True
    return False


@cache  # registered once, however many entry points call it
def collect_once_at_exit() -> None:
    """Spare a command the second Python spends at exit walking every object torch and Lightning keep alive
    (its shutdown collections visit them all, up to 1.5 s after `import lightning`). At exit, after the handlers
    registered later (loggers, wandb), the run's garbage is collected once, finalizers and all, and whatever is
    still alive is frozen, so shutdown's collections skip it."""
    atexit.register(_collect_then_freeze)


def pause_gc_while_loading() -> None:
    """Switch Python's cyclic garbage collector off while a command imports torch and Lightning: each
    collection walks every object loaded so far (about 750k once Lightning is in), about 1 s in all.
    resume_gc turns it back on."""
    gc.disable()


def resume_gc() -> None:
    """After pause_gc_while_loading: collect the garbage of loading and composing configs once, freeze what
    is alive (modules, classes: later collections skip it) and switch the collector back on. A no-op where
    the collector runs (a second run in one process), so one run's objects are never frozen into the next."""
    if not gc.isenabled():
        _collect_then_freeze()
        gc.enable()


def _collect_then_freeze() -> None:
    gc.collect()
    gc.freeze()
