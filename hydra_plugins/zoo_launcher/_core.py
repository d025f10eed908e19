"""ParallelLauncher's work: at most n_jobs jobs at a time, one fresh process per job.

Hydra's joblib launcher runs jobs in a loky pool; when the kernel kills one worker (the out-of-memory killer's
SIGKILL), loky breaks the whole pool and the multirun dies with TerminatedWorkerError: the jobs still queued
never run and the sweep's end-of-run callbacks (zoo's report) never fire. Here each job owns its process, so a
death ends that job only. Per job, the child does what the joblib launcher's worker does (take the job's config,
composed once by the launcher, set hydra.job.num and id, run_job) and sends the JobReturn back through a pipe.

Processes come from multiprocessing's fork server, which imports `preload` (zoo's training stack) once: a job
then starts in a fraction of a second instead of the ~4 s of CPU a fresh interpreter spends importing torch and
Lightning. Where the sweep's own process has imported torch already and runs no other thread, the jobs are
forked from it instead (start_method auto: what the server would give them, without its 3-4 s of imports). A job
has ended when its pipe closes: that holds even if the fork server itself was killed (its children live on, and
their multiprocessing sentinels would fire early); the next job restarts the server.
"""

from __future__ import annotations

import gc
import importlib
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

import cloudpickle
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from zoo.commands import EXIT_ERROR, JOB_CODES
from zoo.io import CONSOLE_LOG

log = logging.getLogger(__name__)


@dataclass
class _Job:
    pos: int  # index in this batch
    num: int  # hydra.job.num
    overrides: list[str]
    proc: multiprocessing.process.BaseProcess
    conn: Connection | None  # None once the child's end is closed
    output_dir: str | None = None  # sent by the child once its config is composed
    result: JobReturn | None = None
    announced: bool = False
    varying: tuple[str, ...] = ()  # the override keys whose values differ between the jobs launched together
    codes: tuple[int, ...] = ()  # the exit codes its task returned (zoo.commands.JOB_CODES), sent before its result

    def label(self) -> str:
        return f"#{self.num} : {' '.join(filter_overrides(self.overrides))}"

    def tag(self) -> str:
        """How every console line about this job begins: its number and what tells it apart from the others."""
        apart = [o for o in self.overrides if o.split("=", 1)[0] in self.varying]
        return f"[#{self.num}{''.join(' ' + o for o in apart)}]"


def launch(launcher, job_overrides, initial_job_idx: int) -> list[JobReturn]:
    setup_globals()
    assert launcher.config is not None and launcher.task_function is not None and launcher.hydra_context is not None
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log.info(f"ParallelLauncher(n_jobs={launcher.n_jobs}) is launching {len(job_overrides)} jobs, "
             "each in its own process")
    log.info(f"Launching jobs, sweep output dir : {sweep_dir}")
    for i, overrides in enumerate(job_overrides):
        log.info(f"\t#{initial_job_idx + i} : {' '.join(filter_overrides(overrides))}")
    # Each job's config, composed once here: for the disk estimate, then sent to its job, which would otherwise
    # compose it again in a fresh process (a third of a second of CPU each: Hydra's caches start empty there).
    configs = [_compose(launcher, overrides) for overrides in job_overrides]
    method = jobs_start_method(launcher.start_method, launcher.preload)
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(list(launcher.preload))  # read when the server (re)starts
    disk, unloaded, refusals = _ask_fork_server(ctx, configs, launcher.preload)
    if unloaded:  # multiprocessing passes over a preload it cannot import without a word
        log.warning(f"hydra.launcher.preload: the jobs' processes could not import {', '.join(unloaded)}; each "
                    "job imports what it needs itself, seconds of CPU each")
    if disk:
        log.info(disk)

    # cloudpickle, as joblib: the task function is defined in the script's __main__, which plain pickle
    # cannot name. Pickled once, sent to every job.
    payload = cloudpickle.dumps((launcher.hydra_context, launcher.config, launcher.task_function,
                                 Singleton.get_state()))
    # Jobs side by side would interleave their consoles line by line: each writes its own (CONSOLE in its
    # directory), and this console gets a line per job when it starts, now and then while it runs, and when it ends.
    own_console = launcher.n_jobs > 1 and len(job_overrides) > 1
    values = [dict(o.split("=", 1) for o in job if "=" in o) for job in job_overrides]
    varying = tuple(k for k in dict.fromkeys(k for v in values for k in v) if len({v.get(k) for v in values}) > 1)
    # Jobs zoo will refuse (a bad value, a budget no size meets) start first: each says why within seconds, and not
    # after the hours the others take. Their numbers and directories stay theirs.
    doomed = [i for i, why in enumerate(refusals) if why]
    if doomed:
        log.warning(f"{len(doomed)} of {len(job_overrides)} jobs fail zoo's checks that need no data; they start "
                    f"first, so each says why now and not after the others: "
                    f"{', '.join(f'#{initial_job_idx + i}' for i in doomed)}")
    pending = deque(sorted(enumerate(job_overrides), key=lambda job: not refusals[job[0]]))
    running: list[_Job] = []
    results: list[JobReturn | None] = [None] * len(job_overrides)
    lost: list[_Job] = []
    interrupted = False
    with _interrupted_by_signals():
        while pending or running:
            try:
                while pending and len(running) < launcher.n_jobs:
                    pos, overrides = pending.popleft()
                    running.append(_start(ctx, payload, configs[pos], pos, initial_job_idx + pos, list(overrides),
                                          own_console))
                    running[-1].varying = varying
                # A job is over once its pipe is closed (it sent its result, or died) and its process has exited.
                ready = wait([j.conn if j.conn is not None else j.proc.sentinel for j in running],
                             PROGRESS_EVERY_S if own_console else None)
                for job in list(running):
                    if job.conn is not None and job.conn in ready:
                        _receive(job)
                        if own_console and job.output_dir is not None and not job.announced:
                            job.announced = True
                            log.info(f"{job.tag()} started; its console: {Path(job.output_dir) / CONSOLE}")
                    if job.conn is None and wait([job.proc.sentinel], 0):
                        job.proc.join()
                        running.remove(job)
                        if job.result is None:
                            lost.append(job)
                            job.result = _lost(job)
                        elif own_console:
                            log.info(f"{job.tag()} {outcome(job.output_dir, job.codes)}")
                        results[job.pos] = job.result
                if own_console and not ready:  # a quiet spell: where each running job is
                    for job in running:
                        if job.output_dir is not None and (where := progress(job.output_dir)):
                            log.info(f"{job.tag()} {where}")
            except KeyboardInterrupt:
                if interrupted:
                    for job in running:
                        job.proc.kill()
                        job.proc.join()
                    raise
                # Ctrl-C or SIGTERM: start no more jobs, ask the running ones to stop (SIGTERM: zoo's runs finish
                # the step and save last.ckpt; a job that had the signal already just hears it again), keep reading
                # their results until they exit, then end the sweep.
                interrupted = True
                pending.clear()
                for job in running:
                    job.proc.terminate()
                log.warning(f"interrupted: waiting for {len(running)} running jobs to stop (Ctrl-C again kills them)")
    if interrupted:
        raise KeyboardInterrupt
    if lost:
        log.error(f"{len(lost)} of {len(job_overrides)} jobs died before finishing: "
                  f"{', '.join(f'#{j.num}' for j in lost)}; the others ran to the end")
    return results


# Threads a fork leaves nothing broken by: jemalloc's background purger (pyarrow's allocator, which the report's
# pandas imports), whose own fork handlers reset it in the child.
FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})


def start_method(chosen: str) -> str:
    """auto: fork where this process has imported torch already and runs no other thread, else forkserver. A fork of
    such a process is what the fork server gives a job (a process that imported the training stack and has no
    other thread: no OpenMP pool, which a forked child would find unusable and hang on, and no lock held by a
    thread the child lacks), without a new interpreter importing the stack again (3-4 s of CPU a sweep). The
    threads are the kernel's (/proc/self/task), which include OpenMP's; elsewhere, the fork server."""
    if chosen != "auto":
        return chosen
    try:
        me = str(threading.get_native_id())
        others = [(Path("/proc/self/task") / t / "comm").read_text().strip()
                  for t in os.listdir("/proc/self/task") if t != me]
    except OSError:
        return "forkserver"
    return "fork" if "torch" in sys.modules and set(others) <= FORK_SAFE_THREADS else "forkserver"


def jobs_start_method(chosen: str, preload: list[str]) -> str:
    """start_method's choice, with `preload` imported here where the jobs are forked from this process (once, as the
    server would: each fork has them); an import that started a thread sends them to the server after all."""
    method = start_method(chosen)
    if method == "fork":
        _import(preload)
        method = start_method(chosen)
    return method


def _import(modules: list[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # the disk estimate's process names it (_answer), as the fork server's would
            pass


_OUTER_HANDLERS: dict[int, object] = {}  # the handlers before the launcher's own: a forked job gets them back


@contextmanager
def _interrupted_by_signals():
    """While the jobs run, SIGINT and SIGTERM raise KeyboardInterrupt here. SIGINT even where this process
    inherited it ignored (started in the background by a script, or by nohup): the jobs' own handler takes it
    anyway (zoo.training.callbacks.GracefulStop), and a launcher that ignored it would start the next jobs as the
    running ones stop. SIGTERM, Python's default for which is to die at once, leaves the jobs running unwatched."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # signals can only be set there
        yield
        return
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    _OUTER_HANDLERS.update(previous)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _OUTER_HANDLERS.clear()


def _compose(launcher, overrides) -> bytes | None:
    """The job's config, pickled; None where it does not compose (the job composes it again, and fails as a job)."""
    try:
        config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    except Exception:
        return None
    return cloudpickle.dumps(config)  # as the payload: the typed nodes' classes are made at run time (zoo.config)


def _start(ctx, payload: bytes, config: bytes | None, pos: int, num: int, overrides: list[str],
           own_console: bool) -> _Job:
    recv, send = ctx.Pipe(duplex=False)
    for attempt in range(3):
        proc = ctx.Process(target=_child, args=(payload, config, num, overrides, send, own_console),
                           name=f"hydra job {num}")
        try:
            proc.start()
            break
        except (OSError, EOFError):  # the fork server died as the job was handed to it (refused, or no pid back):
            # once reaped, a new one starts
            if attempt == 2:
                raise
            time.sleep(0.5)
    send.close()  # the child holds the only write end: its end shows as EOF
    return _Job(pos, num, overrides, proc, recv)


def _receive(job: _Job) -> None:
    """Read one message from the job's child; a closed or half-written pipe (the child died) ends the talk."""
    try:
        kind, value = job.conn.recv()
    except (EOFError, OSError, pickle.UnpicklingError):
        job.conn.close()
        job.conn = None
        return
    if kind == "dir":
        job.output_dir = value
    elif kind == "codes":  # the job's exit code: a sweep whose every job was refused exits 2 (zoo.cli.train)
        job.codes = tuple(value)
        JOB_CODES.extend(value)
    elif kind == "return":
        try:
            job.result = pickle.loads(value)
        except Exception as e:  # e.g. a return value whose class only the job could import
            job.result = JobReturn(overrides=job.overrides, status=JobStatus.FAILED)
            job.result.return_value = RuntimeError(f"job #{job.num}'s result could not be read: "
                                                   f"{type(e).__name__}: {e}")


def _lost(job: _Job) -> JobReturn:
    """A job whose process died without a result: say so, leave its directory findable, return no value."""
    code = job.proc.exitcode
    try:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"ended with exit code {code}"
    except ValueError:
        how = f"was killed by signal {-code}"
    if job.output_dir is None:
        where = "it had not started"
    else:
        where = f"{job.output_dir} keeps what it wrote (no summary.json: a report counts it as killed)"
        # Died before Hydra saved the job's overrides: save them, so the report still finds and names the run.
        saved = Path(job.output_dir) / ".hydra" / "overrides.yaml"
        if not saved.exists():
            saved.parent.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(OmegaConf.create(job.overrides), saved)
    log.error(f"{job.label()} : its process {how} before the job finished; {where}; the other jobs go on")
    # No return value and, unlike a job that raised, not FAILED: Hydra's basic sweeper raises on a FAILED job
    # and skips the multirun's end callbacks (the report). A search sweeper (Optuna) cannot use None and
    # counts the trial as failed.
    ret = JobReturn(overrides=job.overrides, working_dir=job.output_dir, status=JobStatus.COMPLETED)
    ret.return_value = None
    return ret


CONSOLE = CONSOLE_LOG  # a job's stdout and stderr, in its directory, when jobs run side by side
OWN_CONSOLE_ENV = "ZOO_JOB_CONSOLE"  # set in a job whose output goes to its own CONSOLE
PROGRESS_EVERY_S = 60.0  # how often the sweep's console says where each running job is


def _console_to(output_dir: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so C-level writes too) to the job's
    console file, appended to (a job continued by a rerun keeps its earlier output), never through a link."""
    from zoo.io import open_append, owned_path

    Path(output_dir).mkdir(parents=True, exist_ok=True)
    console = open_append(owned_path(output_dir, CONSOLE), encoding="utf-8")
    console.write(f"--- zoo job started {time.strftime('%Y-%m-%d %H:%M:%S')} (pid {os.getpid()}) ---\n")  # a rerun
    console.flush()  # appends: each start is marked
    sys.stdout.flush()
    sys.stderr.flush()
    for fd in (1, 2):
        os.dup2(console.fileno(), fd)
    console.close()
    os.environ[OWN_CONSOLE_ENV] = str(Path(output_dir) / CONSOLE)  # the job's sample goes there (zoo.training.console)


def outcome(output_dir: str | None, codes: tuple[int, ...] = ()) -> str:
    """A finished job in words, from its summary.json: 'completed in 93 s: val_loss 2.0812', or why not. A job
    whose task refused its input (exit code 2) says the error line it wrote to its console instead: the
    summary.json in its directory, if any, may be an earlier run's that the refusal left as it was."""
    from zoo.io import read_json

    if EXIT_ERROR in codes:
        return f"refused: {_last_error(Path(output_dir) / CONSOLE) if output_dir else 'see the sweep console'}"
    try:
        summary = read_json(Path(output_dir) / "summary.json")  # bounded: one zoo.io.FileFormatError at most
        if not isinstance(summary, dict):
            raise TypeError("not a JSON object")
    except (OSError, TypeError, ValueError):
        return "ended without a summary.json" + (f" (see {Path(output_dir) / CONSOLE})" if output_dir else "")
    status = summary.get("status", "failed")
    if status == "failed":
        return f"failed: {summary.get('error', 'see its console')}"
    final = ", ".join(f"{k} {v:.4f}" for k, v in (summary.get("final") or {}).items() if isinstance(v, float))
    took = summary.get("wall_time_s")
    text = f"{status} in {took:.0f} s" if isinstance(took, (int, float)) else status
    return f"{text}: {final}" if final else text


def _last_error(console: Path) -> str:
    """The last 'error: ' line a job wrote to its console (the end of the file: it grows with each rerun)."""
    try:
        with console.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        lines = []
    return next((line.removeprefix("error: ") for line in reversed(lines) if line.startswith("error: ")),
                f"see {console}")


def progress(output_dir: str) -> str | None:
    """Where a running job is, from its metrics.csv and config.yaml: 'step 400/2100, val_loss 2.3100'."""
    from zoo.io import read_csv, read_yaml

    try:  # bounded reads (zoo.io): a damaged file is no progress line, never a stuck or crashed launcher
        rows = read_csv(Path(output_dir) / "metrics.csv")[1]
        total = read_yaml(Path(output_dir) / "config.yaml")["trainer"]["max_steps"]
    except Exception:  # not started yet, or no history logged
        return None
    steps = [int(r["step"]) for r in rows if (r.get("step") or "").isdigit()]
    val = [r["val_loss"] for r in rows if r.get("val_loss")]
    if not steps:
        return None
    try:
        last = f", val_loss {float(val[-1]):.4f}" if val else ""
    except ValueError:  # not a number: said without it
        last = ""
    return f"step {max(steps) + 1}/{total}{last}"


def _ask_fork_server(ctx, configs: list[bytes | None],
                     preload: list[str]) -> tuple[str | None, list[str], list[str | None]]:
    """(disk_estimate, the preload modules the jobs' processes lack, each job's refusals), from a process like a
    job's: the fork server's has imported torch for the jobs already, which this process has not (a second of CPU
    for one line); a fork leaves this process without anything the estimate computed. Under spawn, here."""
    if ctx.get_start_method() == "spawn":
        return disk_estimate(configs), [], refusals(configs)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_answer, args=(configs, preload, send), name="disk estimate")
    proc.start()
    send.close()
    try:
        return recv.recv()
    except (EOFError, OSError):  # it died: the sweep runs without the estimate
        return None, [], [None] * len(configs)
    finally:
        recv.close()
        proc.join()


def _answer(configs: list[bytes | None], preload: list[str], conn: Connection) -> None:
    unloaded = [m for m in preload if m not in sys.modules]  # before disk_estimate imports its own
    conn.send((disk_estimate(configs), unloaded, refusals(configs)))
    conn.close()


RUN_SECTIONS = ("model", "data", "trainer", "optim")  # what a zoo run's config has (conf/config.yaml)


def refusals(configs: list[bytes | None]) -> list[str | None]:
    """Per job (its config pickled, from _compose): the line zoo's checks that need no data refuse it with
    (zoo.config.sizing.preflight), or None. None too where the config is not a zoo run's (another Hydra app's: no
    RUN_SECTIONS) or those checks cannot read it (an interpolation only the job resolves): the job finds out."""
    from zoo.component import ConfigError
    from zoo.config.sizing import preflight

    found: list[str | None] = []
    for config in configs:
        if config is None:  # it did not compose: the job says why
            found.append(None)
            continue
        try:
            composed = pickle.loads(config)
            with open_dict(composed):
                del composed["hydra"]  # the job's task gets its config without it, as here
            plain = OmegaConf.to_container(composed, resolve=True)
            if all(isinstance(plain.get(k), dict) for k in RUN_SECTIONS):  # type: ignore[union-attr]
                preflight(plain)  # type: ignore[arg-type]
        except ConfigError as e:
            found.append(str(e))
            continue
        except Exception:
            pass
        found.append(None)
    return found


def disk_estimate(configs: list[bytes | None]) -> str | None:
    """What the sweep's runs will leave on disk, from each job's parameter count (float32, 4 bytes each) and what
    it keeps (`checkpoints`): a checkpoint with AdamW's state is 3x the weights; all keeps two, best_weights one
    and the weights, last the weights alone. None when a job's config (pickled, from _compose) is not a zoo run's."""
    from zoo.build import count_params, resolve_config

    if None in configs:  # a job that does not compose: no estimate (the job says why)
        return None
    kept = running = 0.0
    try:
        for config in configs:
            plain = OmegaConf.to_container(pickle.loads(config), resolve=False)
            model, keep = plain["model"], plain.get("checkpoints", "best_weights")
            context = (plain.get("data") or {}).get("context") or 256
            size = 4 * count_params(resolve_config({**model, "vocab_size": model.get("vocab_size") or 256,
                                                    "max_seq_len": model.get("max_seq_len") or context}))["total"]
            kept += {"all": 6 * size, "best_weights": 4 * size, "last": size, "none": 0}.get(keep, 6 * size)
            running = max(running, 6 * size if keep in ("all", "best_weights") else 3 * size)  # both whole, running
    except Exception:  # a config this estimate cannot read: the sweep still runs, without it
        return None
    mb = lambda b: f"{b / 1e6:.0f} MB" if b >= 1e6 else f"{b / 1e3:.0f} kB"  # noqa: E731
    what = {"all": "best and last, with the optimizer's state", "last": "each finished run's weights",
            "best_weights": "last with the optimizer's state, best as weights",
            "none": "none once a run finishes"}.get(keep, keep)
    return (f"disk: the {len(configs)} runs will keep about {mb(kept)} of checkpoints (checkpoints={keep}: "
            f"{what}), and a running one up to {mb(running)}")


def _output_dir(config: DictConfig) -> str:
    """The job's output directory, as run_job computes it (HydraConfig must hold `config`)."""
    sweep_dir = str(OmegaConf.select(config, "hydra.sweep.dir"))
    return os.path.abspath(os.path.join(sweep_dir, str(OmegaConf.select(config, "hydra.sweep.subdir"))))


def _child(payload: bytes, composed: bytes | None, num: int, overrides: list[str], conn: Connection,
           own_console: bool) -> None:
    """One job, in its own process: the joblib launcher's execute_job, then the JobReturn down the pipe."""
    JOB_CODES.clear()  # a forked child starts with the launcher's list: send back its own code alone
    for sig, handler in _OUTER_HANDLERS.items():  # forked from the launcher (auto): not its KeyboardInterrupt
        signal.signal(sig, handler)  # type: ignore[arg-type]
    # What the fork server imported stays alive for the whole job: frozen, the job's garbage collections skip it
    # (a shrunk job: 0.8 s of CPU instead of 1.3) and leave its memory shared with the server instead of copied.
    gc.freeze()
    try:
        hydra_context, config, task_function, singleton_state = pickle.loads(payload)
        setup_globals()
        Singleton.set_state(singleton_state)
        sweep_config = (pickle.loads(composed) if composed is not None
                        else hydra_context.config_loader.load_sweep_config(config, overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{num}"
            sweep_config.hydra.job.num = num
        HydraConfig.instance().set_config(sweep_config)
        output_dir = _output_dir(sweep_config)
        if own_console:
            _console_to(output_dir)
        conn.send(("dir", output_dir))
        ret = run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    except BaseException as e:  # the parent re-raises it, as the joblib launcher would
        ret = JobReturn(overrides=overrides, status=JobStatus.FAILED)
        ret.return_value = e
    if ret.status == JobStatus.FAILED:  # the traceback stays here; the parent gets the exception alone
        traceback.print_exception(ret._return_value)
    try:
        data = cloudpickle.dumps(ret)
    except Exception as e:
        failed = JobReturn(overrides=overrides, status=JobStatus.FAILED)
        failed.return_value = RuntimeError(f"job #{num}'s result could not be sent back: {type(e).__name__}: {e}")
        data = cloudpickle.dumps(failed)
    try:
        conn.send(("codes", list(JOB_CODES)))
        conn.send(("return", data))
        conn.close()
    except OSError:  # the launcher is gone (killed itself): the job's directory has its outcome
        pass
