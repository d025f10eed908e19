"""Atomic file writes (a reader, or the report, never sees half a file after an interruption), what zoo owns in a
run directory (its marker, its lock, the names it writes, never through a link), and a command's quick start and
exit (the garbage collector kept off what lives for the whole run)."""

from __future__ import annotations

import atexit
import contextlib
import errno
import gc
import json
import math
import os
import re
import stat
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import IO, Any

from zoo.component import ConfigError  # no torch


class DataError(ValueError):
    """Bad data or data settings; the message is one line naming the config key to change. Defined here, below the
    data layer, so that zoo.net can raise one without importing the zoo.data package (whose tokenizers import it)."""


def cache_dir() -> Path:
    """zoo's per-user cache: `$ZOO_CACHE`, else `$XDG_CACHE_HOME/zoo`, else `~/.cache/zoo`."""
    root = os.environ.get("ZOO_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zoo"
    return Path(root).expanduser()


class RunDirError(ConfigError):
    """A directory zoo will not read or write as it stands (a link, a look-alike run, a file where a directory
    belongs), or a write that failed (full disk, read-only location): one line, exit code 2 from the CLIs."""


class WriteError(OSError):
    """A write that failed (full disk, read-only file system, a directory in the way), said in one line with
    its path. An OSError still, so callers that catch OSError keep working."""

    def __init__(self, path: str | os.PathLike, cause: OSError):
        super().__init__(cause.errno, cause.strerror or str(cause), str(path))
        self.path = Path(path)

    def __str__(self) -> str:
        return f"could not write '{self.path}': {self.strerror}"


# The errors of a write that the environment refused: no space, over a quota or the file size limit
# (RLIMIT_FSIZE gives EFBIG: Python ignores SIGXFSZ), a read-only file system.
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def first_line(e: BaseException) -> str:
    """An exception as one short line: its message's first line (200 characters at most), else its type's name."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def atomic_write(path: str | os.PathLike, write: Callable[[IO], Any], mode: str = "w") -> None:
    """Call write(file) on a temp file in the same directory, fsync it, then rename it over `path`.

    The rename replaces `path` itself, even a symbolic link there (never the link's target). Any OSError on
    the way is a WriteError naming `path`; the temp file is removed."""
    path = Path(path)
    tmp, f = None, None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give what open() would give
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as raw:
            f = _Recording(raw)
            write(f)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        cause = e if isinstance(e, OSError) else getattr(f, "error", None)
        if cause is not None and not isinstance(e, WriteError):
            raise WriteError(path, cause) from e
        raise


class _Recording:
    """The temp file as atomic_write's caller sees it, remembering the first OSError of a write: torch.save's zip
    writer reports a failed write (a full disk) as a RuntimeError about file positions."""

    def __init__(self, f: IO):
        self._f, self.error = f, None

    def write(self, data):
        return self._call(self._f.write, data)

    def flush(self):
        return self._call(self._f.flush)

    def _call(self, method, *args):
        try:
            return method(*args)
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name: str):
        return getattr(self._f, name)


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
    if not directory.is_dir() or directory.is_symlink():  # a link's target is not the run's
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


# --- What zoo owns in a run directory --------------------------------------------------------------------
#
# A run directory is zoo's when it holds RUN_MARKER, a small JSON file (run id, zoo version, creation time) that a
# run writes before any other file of its own; zoo reads, writes, replaces and removes there only the names in
# RUN_ENTRIES, each as what zoo makes it (a directory, or a regular file), never through a symbolic link. Files
# with zoo's names but no marker are a look-alike (or a run of a zoo from before the marker): left alone.
RUN_MARKER = ".zoo-run"
RUN_LOCK = "run.lock"
CONSOLE_LOG = "console.log"  # the parallel launcher's console of a job (hydra_plugins/zoo_launcher), appended to
# What a run writes there, each "file" or "dir"; a parent comes before what it holds.
RUN_ENTRIES = {RUN_MARKER: "file", RUN_LOCK: "file", "config.yaml": "file", "metrics.csv": "file",
               "summary.json": "file", "hparams.yaml": "file", "checkpoints": "dir", "checkpoints/last.ckpt": "file",
               "checkpoints/best.ckpt": "file", "tb": "dir", "wandb": "dir", CONSOLE_LOG: "file"}
# What overwrite=true removes, in this order (docs/reliability.md lists them; a test compares): what a run writes,
# not the marker and lock (the new run's), nor console.log: the launcher appends the running job's console there
# (each start marked by a line), and a console.log the user made (a tee) is theirs.
OVERWRITE_REMOVES = tuple(n for n in RUN_ENTRIES if n not in (RUN_MARKER, RUN_LOCK, CONSOLE_LOG))
# Finding any of these means the directory holds a run (Hydra's .hydra/ and log do not count).
RUN_FILES = ("config.yaml", "metrics.csv", "summary.json", "hparams.yaml", "checkpoints")


def _problem(path: Path, kind: str) -> str | None:
    """Why zoo may not read or write `path` as a `kind` ("file" or "dir"), or None (it is one, or absent)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(mode):
        return f"'{path}' is a symbolic link (to '{os.readlink(path)}'); zoo never reads or writes through a " \
               "link in a run directory: remove the link"
    if kind == "dir" and not stat.S_ISDIR(mode):
        return f"'{path}' is a file where zoo keeps a directory: move it away"
    if kind == "file" and not stat.S_ISREG(mode):
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        return f"'{path}' is {what} where zoo keeps a file: move it away"
    return None


def owned_path(run_dir: str | os.PathLike, name: str) -> Path:
    """run_dir/name, checked for zoo to read or write: each part of `name` is absent or what zoo keeps there
    (directories, then the kind RUN_ENTRIES gives, a file by default), never a link. Else RunDirError."""
    parts = Path(name).parts
    for i in range(len(parts)):
        sub = "/".join(parts[:i + 1])
        kind = "dir" if i < len(parts) - 1 else RUN_ENTRIES.get(sub, "file")
        if problem := _problem(Path(run_dir, sub), kind):
            raise RunDirError(problem)
    return Path(run_dir, name)


def check_run_dir(run_dir: str | os.PathLike) -> tuple[dict | None, list[str]]:
    """What the directory holds, read without writing anything: (its marker or None, the RUN_FILES present).
    RunDirError for a directory zoo will not use: not a directory, any of RUN_ENTRIES a link or of the wrong
    kind, a marker that is not zoo's, or zoo's file names without a marker."""
    run_dir = Path(run_dir)
    if os.path.lexists(run_dir) and not run_dir.is_dir():
        raise RunDirError(f"hydra.run.dir: '{run_dir}' is a file, not a directory; valid: a new directory, or one "
                          "holding a zoo run")
    if not run_dir.is_dir():
        return None, []
    for name in RUN_ENTRIES:
        owned_path(run_dir, name)
    marker = read_marker(run_dir)
    held = [n for n in RUN_FILES if os.path.lexists(run_dir / n)]
    if marker is None and (held or not _is_zoo_lock(run_dir / RUN_LOCK)):
        found = ", ".join(held + ([] if _is_zoo_lock(run_dir / RUN_LOCK) else [RUN_LOCK]))
        raise RunDirError(f"hydra.run.dir: '{run_dir}' holds {found} but no {RUN_MARKER} marker, so zoo cannot tell "
                          "it is its own run and will not replace, resume or write into it; valid: another "
                          "hydra.run.dir, or delete those by hand (a run of an earlier zoo, which wrote no marker, "
                          "resumes in a new directory: ckpt_path=<its dir>/checkpoints/last.ckpt)")
    return marker, held


def _is_zoo_lock(path: Path) -> bool:
    """Absent, or what lock_run_dir leaves there (empty, or a pid): a run killed before writing its marker."""
    try:
        with open(path, "rb", opener=_no_follow(os.O_RDONLY)) as f:
            return re.fullmatch(rb"\d*\n?", f.read(64)) is not None
    except FileNotFoundError:
        return True
    except OSError:
        return False


def read_marker(run_dir: str | os.PathLike) -> dict | None:
    """The run directory's marker, or None when there is none; RunDirError when what is there is not one."""
    path = owned_path(run_dir, RUN_MARKER)
    try:
        marker = read_json(path, limit=4096, follow=False)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # too large, too deep, not JSON (FileFormatError): not a marker
        marker = None
    if not (isinstance(marker, dict) and isinstance(marker.get("run_id"), str)):
        raise RunDirError(f"'{path}' is not a zoo run marker (a JSON object with a run_id), so zoo cannot tell "
                          "the directory is its own run; valid: another hydra.run.dir, or delete it by hand")
    return marker


def write_marker(run_dir: str | os.PathLike, replace: bool = False) -> dict:
    """Mark run_dir as a zoo run: atomically, and only if no marker is there yet (two runs starting at once get
    one marker; the run lock then decides between them), unless `replace` (overwrite=true: a new run id)."""
    path = owned_path(run_dir, RUN_MARKER)
    marker = {"run_id": uuid.uuid4().hex, "zoo": _version(),
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if replace:
        atomic_write_json(path, marker)
        return marker
    # written under a temp name, then hard-linked to its name, which fails if a marker appeared meanwhile
    tmp = path.with_name(f".{RUN_MARKER}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        atomic_write_json(tmp, marker)
        os.link(tmp, path)
    except FileExistsError:
        return read_marker(run_dir) or marker
    except OSError as e:  # said of the marker, not of its temp name
        raise WriteError(path, e) from e
    finally:
        tmp.unlink(missing_ok=True)
    return marker


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zoo")
    except PackageNotFoundError:
        return "unknown"


def _no_follow(flags: int) -> Callable[[str, int], int]:
    """An opener for open(): refuses (ELOOP) to open a symbolic link, whatever the mode."""
    return lambda path, mode: os.open(path, mode | flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)


def open_append(path: str | os.PathLike, **kwargs) -> IO:
    """open(path, "a") that never appends through a symbolic link (ELOOP there)."""
    return open(path, "a", opener=lambda p, mode: os.open(p, mode | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666), **kwargs)


def remove_run_files(run_dir: str | os.PathLike) -> None:
    """overwrite=true: remove what an earlier zoo run wrote (call after check_run_dir found its marker): the names
    in OVERWRITE_REMOVES, checkpoints/ only once empty; .hydra/, the marker, the lock, console.log and anything
    else stay."""
    import shutil

    run_dir = Path(run_dir)
    for name in OVERWRITE_REMOVES:
        path, kind = owned_path(run_dir, name), RUN_ENTRIES[name]
        if name.startswith("checkpoints") or not os.path.lexists(path):
            continue
        if kind == "dir":
            shutil.rmtree(path)  # rmtree removes links inside, never what they point to
        else:
            path.unlink()
    checkpoints = owned_path(run_dir, "checkpoints")
    if checkpoints.is_dir():
        for name in OVERWRITE_REMOVES:
            if name.startswith("checkpoints/"):
                owned_path(run_dir, name).unlink(missing_ok=True)
        remove_temp_files(checkpoints)
        with contextlib.suppress(OSError):  # a directory the user added files to stays
            checkpoints.rmdir()


# A run directory is owned by one process at a time: it holds an exclusive flock on RUN_LOCK for as long
# as it runs (the kernel drops the lock when the process dies, even by SIGKILL), so anyone can tell a
# running job from a dead one by trying the lock.


def lock_run_dir(run_dir: str | os.PathLike) -> IO | None:
    """Take the run directory's lock; returns the open lock file (keep it open), or None if another
    live process holds it. The lock file must be a regular file or absent (RunDirError otherwise)."""
    import fcntl

    path = owned_path(run_dir, RUN_LOCK)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        f = open(path, "a+", opener=_no_follow(os.O_CREAT))
    except OSError as e:
        raise WriteError(path, e) from e
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    try:  # unbuffered: nothing is left to flush (and fail again) when the file closes
        os.ftruncate(f.fileno(), 0)
        os.write(f.fileno(), f"{os.getpid()}\n".encode())
    except OSError as e:
        f.close()
        raise WriteError(path, e) from e
    return f


def is_running(run_dir: str | os.PathLike) -> bool:
    """True while a live process holds the run directory's lock (a link there is no zoo lock: False)."""
    import fcntl

    path = Path(run_dir) / RUN_LOCK
    try:
        f = open(path, opener=_no_follow(os.O_RDONLY))
    except OSError:
        return False
    with f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return False
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


def busy_message(run_dir: str | os.PathLike) -> str:
    """The one-line refusal for a run directory another live process holds (see lock_run_dir)."""
    try:
        with open(Path(run_dir) / RUN_LOCK, opener=_no_follow(os.O_RDONLY)) as f:
            pid = f.read(64).strip()
    except (OSError, ValueError):
        pid = ""
    holder = f"pid {pid}" if pid.isdigit() else "pid unknown"
    return f"hydra.run.dir: '{run_dir}' is in use by a running process ({holder}); wait for it to end or " \
           "choose another directory"


def write_failure(e: OSError, run_dir: str | os.PathLike) -> str:
    """One line for a write the environment refused during a run: what could not be written, and where the run's
    last good checkpoint is (checkpoints are written to a temp file and renamed: a failed write keeps the last)."""
    what = str(e) if isinstance(e, WriteError) else \
        f"could not write '{e.filename or run_dir}': {e.strerror or e}"
    last = Path(run_dir, "checkpoints", "last.ckpt")
    kept = f"the last good checkpoint is '{last}' (ckpt_path=last resumes from it)" \
        if last.is_file() and not last.is_symlink() else "no checkpoint was written"
    return f"{what}; {kept}"


def is_write_failure(e: BaseException) -> bool:
    return isinstance(e, WriteError) or (isinstance(e, OSError) and e.errno in DISK_ERRORS)


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
    (its shutdown collections visit them all: docs/benchmarks.md, "Start-up and exit"). At exit, after the handlers
    registered later (loggers, wandb), the run's garbage is collected once, finalizers and all, and whatever is
    still alive is frozen, so shutdown's collections skip it."""
    atexit.register(_collect_then_freeze)


def pause_gc_while_loading() -> None:
    """Switch Python's cyclic garbage collector off while a command imports torch and Lightning: each
    collection walks every object loaded so far, hundreds of thousands once Lightning is in (docs/benchmarks.md,
    "Start-up and exit").
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


# --- Reading what a run, a sweep or a cache left: bounded ------------------------------------------------
#
# Every JSON, YAML and CSV file zoo parses from a run or sweep directory, a corpus, or its caches goes through
# these: a regular file only (a FIFO would block the read, /dev/zero would never end), at most a size read
# (checked before reading), nested at most MAX_DEPTH levels (the parsers recurse), no YAML aliases (a kilobyte
# of them can stand for a billion items), and numbers a float holds (1e400 and 400-digit integers are refused,
# not turned into inf or an OverflowError later). What breaks a bound is a FileFormatError: one line naming the
# file and the bound. Limits are far above anything zoo writes.
MAX_DEPTH = 100  # zoo's own files nest 5 levels at most
MAX_INT_DIGITS = 30  # 10^30: above any count zoo records, far below a float's range
READ_LIMITS = {"json": 64 << 20, "yaml": 16 << 20, "csv": 256 << 20}  # bytes
SPECIAL_FILES = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                 (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class FileFormatError(ConfigError):
    """A file zoo will not parse as it stands (too large, too deep, a number out of range, YAML aliases, not a
    regular file, not the format): one line naming the file. A ValueError, so 'damaged: read it again' callers
    that catch ValueError treat it as damaged."""


def special_file(path: str | os.PathLike) -> str | None:
    """'a FIFO', 'a character device', 'a block device' or 'a socket' when `path` (links followed) is one, else
    None (a regular file, a directory, or nothing there). Reading one would block, never end, or fail oddly."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((name for test, name in SPECIAL_FILES if test(mode)), None)


def read_bounded(path: str | os.PathLike, limit: int, follow: bool = True) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (FileFormatError otherwise, before reading it).
    follow=False: a symbolic link is refused (ELOOP). FileNotFoundError and other OSErrors propagate."""
    if kind := special_file(path):
        raise FileFormatError(f"'{path}' is {kind}, not a regular file; zoo reads no data from one")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)  # O_NONBLOCK: a FIFO swapped in after the check cannot block the open
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise FileFormatError(f"'{path}' is {what}; zoo reads a regular file there")
        if st.st_size > limit:
            raise FileFormatError(f"'{path}' is {st.st_size} bytes, over the {limit} bytes zoo reads there")
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew while read
        raise FileFormatError(f"'{path}' is over the {limit} bytes zoo reads there")
    return data


def read_text_bounded(path: str | os.PathLike, limit: int, follow: bool = True) -> str:
    """read_bounded, decoded as UTF-8 (FileFormatError if it is not)."""
    try:
        return read_bounded(path, limit, follow).decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileFormatError(f"'{path}' is not UTF-8 text (byte {e.start})") from None


class _OutOfRange(ValueError):
    pass


def _bounded_int(text: str) -> int:
    if len(text.lstrip("+-").lstrip("0")) > MAX_INT_DIGITS:
        raise _OutOfRange(f"the number {text[:12]}... ({len(text)} digits) is out of range")
    return int(text)


def _bounded_float(text: str) -> float:
    x = float(text)
    if math.isinf(x):  # a literal too large for a float; inf itself is written Infinity (or .inf)
        raise _OutOfRange(f"the number {text[:40]} is out of range")
    return x


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _json_depth(text: str) -> int:
    """How deep the text's arrays and objects nest (brackets inside strings skipped); exact enough for a bound."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return MAX_DEPTH
    depth = deepest = 0
    for c in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if c in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def parse_json(text: str, name: str) -> Any:
    """json.loads within the bounds above; `name` is what the one-line error calls the text."""
    if _json_depth(text) > MAX_DEPTH:
        raise FileFormatError(f"'{name}' nests more than {MAX_DEPTH} levels deep; zoo reads no deeper JSON")
    try:
        return json.loads(text, parse_int=_bounded_int, parse_float=_bounded_float)
    except _OutOfRange as e:
        raise FileFormatError(f"'{name}': {e}") from None
    except (ValueError, RecursionError) as e:
        raise FileFormatError(f"'{name}' is not JSON ({first_line(e)})") from None


def read_json(path: str | os.PathLike, limit: int = READ_LIMITS["json"], follow: bool = True) -> Any:
    """A JSON file, bounded (see above): FileFormatError in one line when it is not one zoo will read."""
    return parse_json(read_text_bounded(path, limit, follow), str(path))


@cache
def _yaml_loader() -> type:
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        """PyYAML's safe loader (plain data only), refusing aliases and nesting deeper than MAX_DEPTH."""

        depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise _OutOfRange("holds a YAML alias (*name); zoo writes none and reads none (an alias can "
                                  "stand for a billion items)")
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise _OutOfRange(f"nests more than {MAX_DEPTH} levels deep")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    base_int = yaml.SafeLoader.yaml_constructors["tag:yaml.org,2002:int"]
    base_float = yaml.SafeLoader.yaml_constructors["tag:yaml.org,2002:float"]

    def bounded_int(loader, node):
        _bounded_int(node.value.replace("_", ""))
        return base_int(loader, node)

    def bounded_float(loader, node):
        x = base_float(loader, node)
        if math.isinf(x) and "inf" not in node.value.lower():
            raise _OutOfRange(f"the number {node.value[:40]} is out of range")
        return x

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", bounded_int)
    BoundedLoader.add_constructor("tag:yaml.org,2002:float", bounded_float)
    return BoundedLoader


def parse_yaml(text: str, name: str) -> Any:
    """yaml.safe_load within the bounds above; `name` is what the one-line error calls the text."""
    import yaml

    loader = _yaml_loader()(text)
    try:
        return loader.get_single_data()
    except _OutOfRange as e:
        raise FileFormatError(f"'{name}' {e}" if str(e).startswith(("holds", "nests")) else f"'{name}': {e}") \
            from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as e:
        raise FileFormatError(f"'{name}' is not YAML ({first_line(e)})") from None
    finally:
        loader.dispose()


def read_yaml(path: str | os.PathLike, limit: int = READ_LIMITS["yaml"], follow: bool = True) -> Any:
    """A YAML file, bounded (see above): FileFormatError in one line when it is not one zoo will read."""
    return parse_yaml(read_text_bounded(path, limit, follow), str(path))


def read_csv(path: str | os.PathLike, limit: int = READ_LIMITS["csv"], follow: bool = True) \
        -> tuple[list[str], list[dict]]:
    """(header, rows as dicts) of a CSV file, bounded; a last line cut by a kill (no newline) is left out."""
    import csv

    text = read_text_bounded(path, limit, follow)
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    lines = text.splitlines()
    try:
        header = next(csv.reader(lines[:1]), [])
        return header, list(csv.DictReader(lines))
    except csv.Error as e:  # a field over csv's size limit, a NUL byte
        raise FileFormatError(f"'{path}' is not a CSV file zoo can read ({first_line(e)})") from None


# A sweep's plan (Hydra's parsed overrides, from a command line or a multirun.yaml) is counted, never expanded,
# before anything is launched or listed: x=range(0,100000000000) is 10^11 jobs.
MAX_SWEEP_JOBS = 1_000_000


def sweep_size(overrides: list, cap: int = MAX_SWEEP_JOBS) -> int:
    """How many jobs Hydra's parsed `overrides` expand to (the product of their sweeps' lengths, the last override
    of a key counting), cap + 1 when more; no sweep is expanded. A search's intervals count 1 (its trials decide)."""
    from itertools import islice

    last = {o.key_or_group: o for o in overrides}
    total = 1
    for o in last.values():
        if not o.is_sweep_override():
            continue
        v = o.value()
        if all(hasattr(v, a) for a in ("start", "stop", "step")):  # a range: its length, computed
            span = (v.stop - v.start) / v.step if v.step else math.inf
            n = max(0, math.ceil(span)) if math.isfinite(span) else cap + 1
        elif hasattr(v, "end"):  # an interval: a search samples it
            n = 1
        else:
            n = sum(1 for _ in islice(o.sweep_iterator(), cap + 1))
        total = min(total * n, cap + 1)
    return total


def checkpoint_file_error(path: str | Path) -> str | None:
    """A checkpoint argument that names no file, in one line, or None: asked before torch loads (zoo sample,
    zoo eval) and by zoo.training.checkpoint.read_checkpoint itself."""
    given = Path(path)
    if given.is_dir():  # a run directory given for its checkpoint
        found = [p for p in (given / "checkpoints" / "best.ckpt", given / "checkpoints" / "last.ckpt") if p.is_file()]
        hint = f"e.g. '{found[0]}'" if found else "<run dir>/checkpoints/best.ckpt or last.ckpt"
        return f"checkpoint: '{path}' is a directory; give a checkpoint file ({hint})"
    if not given.is_file():
        return f"checkpoint: no such file '{path}'"
    return None
