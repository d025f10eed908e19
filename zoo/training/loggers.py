"""Metric loggers for a run (conf/logger/): built from the config, named after the sweep and the run's
overrides, and finished with the run's summary, so dashboards can compare the runs of a sweep.

Every dashboard gets what a comparison needs and nothing else: the factors the sweep varies (each once, under its
override's name: `ffn`) and the seed as params, the metrics' histories, the final and best (`best/val_loss`)
values; the resolved config is a file (config.yaml), never params.
- wandb: one group per sweep (its directory), a run per job named by its factors and seed (run_label).
- MLflow: one experiment per sweep (its directory; `zoo` for single runs, a model-training experiment that opens on
  its runs) holding a parent run for the sweep and one nested run per job; the factors are also the run name, the
  seed a tag; summary.json and config.yaml are artifacts, and `MLflowSweep` logs the sweep's report to the parent.
- TensorBoard: the factors and seed against the final and best metrics in the HParams view.

MLflow and W&B talk to a server: each request waits at most zoo.net's bound (ZOO_NET_TIMEOUT_S), and a server that
stops answering mid-run costs the run one bounded wait, not the run (`Dashboard`).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import socket
import sys
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from zoo.build import ConfigError, flatten_config
from zoo.commands import pip_install
from zoo.net import RETRIES, bound_network, timeout_s
from zoo.sweep import parse_overrides, planned_jobs
from zoo.training.console import say, warn
from zoo.training.resume import RESUME_MAY_CHANGE
from zoo.training.safety import instantiate_allowed, plain_mapping

DEFAULT_EXPERIMENT = "zoo"  # MLflow experiment of runs outside a multirun
ROLE_TAG, SWEEP_TAG = "zoo.role", "zoo.sweep_dir"
# MLflow 3's UI opens an experiment by its kind: without one it lands on the GenAI "Traces" overview, not the runs.
KIND_TAG, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
STORE_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "file", "")  # MLflow's


def build_loggers(nodes: Mapping[str, Mapping[str, Any]], seed: int, run_dir: Path) -> list[Any]:
    """The Lightning loggers the run's logger section asks for (name -> its `_target_` node: RunPlan.logger),
    writing into `run_dir`; seed: the run's (a dashboard names the run by it)."""
    loggers = []
    for key, cfg in nodes.items():
        target = str(cfg.get("_target_", ""))
        extra: dict[str, Any] = {}
        if target.endswith("WandbLogger"):
            import wandb  # noqa: F401  # optional: wandb (loaded before zoo.net bounds its telemetry; the logger loads it anyway)
            extra = _wandb_naming(cfg, seed)  # names only: no request
        if target.endswith(REMOTE):
            bound_network()
        if target.endswith("MLFlowLogger"):
            extra = _mlflow_run(cfg, f"logger.{key}", seed)  # reads or makes the run on the server: after the bound
        logger = instantiate_allowed(dict(cfg), f"logger.{key}", save_dir=str(run_dir), **extra)
        if target.endswith(REMOTE):
            _start(logger, cfg, f"logger.{key}")
            Dashboard(logger, key, str(cfg.get("tracking_uri") or "W&B"), run_dir)
        loggers.append(logger)
    return loggers


REMOTE = ("WandbLogger", "MLFlowLogger")  # the loggers that talk to a server


def _start(logger: Any, cfg: Mapping[str, Any], key: str) -> None:
    """Attach to the dashboard's run now, while a failure is still a config error (one line, exit code 2):
    MLflow reads the run made above, W&B starts one (in its offline mode, with no server)."""
    if rank_zero_only.rank != 0:  # DDP: Lightning logs from rank 0 only
        return
    try:
        _ = logger.experiment
    except Exception as e:
        raise ConfigError(f"{key}: cannot start the run on {cfg.get('tracking_uri') or 'W&B'} ({_reason(e)}); valid: "
                          "a server that answers, or another logger (csv, tensorboard, none)") from None


class Dashboard:
    """A remote logger (MLflow, W&B) whose server may stop answering mid-run. Each of its calls waits at most zoo.net's
    bound; one that fails is counted, not raised, and the dashboard is not called again for the rest of the run (a
    server that stopped answering would cost the bound at every step). The run goes on: metrics.csv, the checkpoints
    and summary.json are its record, and `report()` says in one line what the dashboard did not get."""

    CALLS = {"log_metrics": "metric rows", "log_hyperparams": "params", "after_save_checkpoint": "checkpoints",
             "save": None, "finalize": "the end status"}  # Lightning's calls, and what each one logs
    COUNTED = ("metric rows", "checkpoints")  # said with their number; the others by name

    def __init__(self, logger: Any, name: str, where: str, run_dir: Path):
        self.name, self.where, self.run_dir = name, where, run_dir
        self.failure: str | None = None  # why the first failed call failed
        self.step: int | None = None  # the last step it was given, when it failed
        self.missed: collections.Counter[str] = collections.Counter()
        for method, what in self.CALLS.items():
            if method == "after_save_checkpoint" and not getattr(logger, "_log_model", False):
                what = None  # checkpoints go to the dashboard only with log_model
            setattr(logger, method, self._guarded(getattr(logger, method), what))
        logger.zoo_dashboard = self

    def _guarded(self, method: Callable[..., Any], what: str | None) -> Callable[..., Any]:
        @functools.wraps(method)  # its __wrapped__: the logger's own method (finish_loggers calls it)
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.failure is None:  # the step it stopped answering at
                self.step = kwargs.get("step", self.step)
            return self.call(what, method, *args, **kwargs)
        return call

    def call(self, what: str | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs), or None, counting `what` as not logged, once the dashboard has failed."""
        if self.failure is None:
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # a timeout after zoo.net's bound, a refused connection, the server's error
                self.failure = _reason(e)
        if what:
            self.missed[what] += 1
        return None

    def report(self) -> str | None:
        """One line on what this dashboard missed, or None when it got everything."""
        if self.failure is None:
            return None
        missed = ", ".join(f"{n} {what}" if what in self.COUNTED else what for what, n in self.missed.items())
        at = f" at step {self.step}" if self.step is not None else ""
        return (f"warning: {self.name}: {missed or 'nothing'} not logged ({self.where} stopped answering{at}: "
                f"{self.failure}); the run's record is in {self.run_dir} (metrics.csv, summary.json, checkpoints/)")


def _reason(e: BaseException) -> str:
    """An exception as a short reason: a timeout says the bound it ran into."""
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if "timed out" in text.lower() or "timeout" in type(e).__name__.lower():
        return f"no answer within {timeout_s():g} s, {1 + RETRIES} tries (ZOO_NET_TIMEOUT_S)"
    return text[:200]


def log_config(loggers: list[Any], plain: Mapping[str, Any]) -> None:
    """The dashboards' params are what a comparison needs: the job's factors (`ffn`: `relu`) and its seed, each
    once under its override's name. The whole resolved config is config.yaml, logged as a file at the end."""
    params = {**job_factors(), "seed": plain["seed"]}
    for lg in loggers:
        if not any(_is(lg, name) for name in DASHBOARDS):
            lg.log_hyperparams(flatten_config(plain))  # the CSV logger's hparams.yaml: the whole config
            continue
        if not _is(lg, "TensorBoardLogger"):  # TensorBoard's HParams get them with the final metrics
            lg.log_hyperparams(params)
        # Lightning logs the module's nested config ({"cfg": ...}) when fit starts: every key of it would
        # become a param (an axis of a compare view) beside the factors.
        lg.log_hyperparams = lambda *args, **kwargs: None


DASHBOARDS = ("MLFlowLogger", "WandbLogger", "TensorBoardLogger")


def finish_loggers(loggers: list[Any], summary: Mapping[str, Any], run_dir: Path) -> None:
    """After summary.json is written: final and best metrics and files to the dashboards, then close the runs."""
    final = summary.get("final") or {}
    logged = set((summary.get("history") or [{}])[-1])
    derived = {k: v for k, v in final.items() if k not in logged}  # computed for the summary (val_ppl, val_bpc)
    best = {f"best/{k}": v["value"] for k, v in (summary.get("best") or {}).items()}  # each metric's best value
    step = summary.get("steps", 0)
    for lg in loggers:
        dashboard: Dashboard | None = getattr(lg, "zoo_dashboard", None)
        if _is(lg, "WandbLogger"):  # closing makes an offline run's files (config, history) complete
            assert dashboard is not None  # build_loggers guards every remote logger
            dashboard.call("the final metrics", lg.experiment.summary.update, {**derived, **best})
            if (run_dir / "config.yaml").is_file():  # an artifact: W&B's own files/config.yaml holds the params
                dashboard.call("config.yaml", _wandb_files, lg.experiment, run_dir, ("config.yaml", "summary.json"))
            dashboard.call("the run's end", lg.experiment.finish)
        elif _is(lg, "TensorBoardLogger"):
            _tensorboard_hparams(lg, {**final, **best}, {**derived, **best}, step, summary.get("seed"))
        elif _is(lg, "MLFlowLogger"):
            assert dashboard is not None  # build_loggers guards every remote logger
            if derived or best:
                dashboard.call("the final metrics", lg.log_metrics.__wrapped__, {**derived, **best}, step=step)
            for name in ("summary.json", "config.yaml"):
                if (run_dir / name).is_file():
                    dashboard.call(name, lg.experiment.log_artifact, lg.run_id, str(run_dir / name))
            status = {"completed": "FINISHED", "diverged": "FAILED"}.get(str(summary.get("status")), "KILLED")
            dashboard.call("the end status", lg.experiment.set_terminated, lg.run_id, status)
        if dashboard is not None and (line := dashboard.report()):
            warn(line)


def _wandb_files(run: Any, run_dir: Path, names: tuple[str, ...]) -> None:
    import wandb  # optional: wandb

    artifact = wandb.Artifact(f"run-{run.id}-files", type="run-files")
    for name in names:
        if (run_dir / name).is_file():
            artifact.add_file(str(run_dir / name), name=name)
    run.log_artifact(artifact)


def experiment_url(server: str, experiment_id: str) -> str:
    """An experiment's page in MLflow's UI, opened on its runs table (MLflow 3 opens on GenAI traces unless the
    address names the model-training workflow)."""
    return f"{server.rstrip('/')}/#/experiments/{experiment_id}?workflowType=machine_learning"


def _is(logger: Any, name: str) -> bool:
    return type(logger).__name__ == name


def job_factors() -> dict[str, str]:
    """What this job varies (key -> value as written): in a sweep, the overrides whose value differs between
    the sweep's jobs (as its multirun.yaml plans them); in a single run, its command-line overrides. Never the
    seed (a param of its own) nor a setting that cannot change the result (where to log, threads, paths, ...:
    those a resume may change). Empty outside Hydra."""
    try:
        hc = HydraConfig.get()
    except ValueError:
        return {}
    exclude = set(hc.job.config.override_dirname.exclude_keys or []) | {"seed"}
    varying = _varying_keys(Path(str(hc.sweep.dir))) if str(hc.mode) == "RunMode.MULTIRUN" else None
    factors = {}
    for override in hc.overrides.task:
        key, _, value = override.lstrip("+~").partition("=")
        if key in exclude or key.startswith("hydra.") or any(key == k or key.startswith(k + ".")
                                                               for k in RESUME_MAY_CHANGE):
            continue
        if varying is None or key in varying:
            factors[key] = value
    return dict(sorted(factors.items()))


def _varying_keys(sweep_dir: Path) -> set[str] | None:
    """The override keys whose value differs between the jobs a sweep planned; None if its plan is unknown."""
    planned, _ = planned_jobs(sweep_dir)
    if not planned:
        return None
    jobs = [parse_overrides(job) for job in planned]
    return {k for k in set().union(*jobs) if len({job.get(k) for job in jobs}) > 1}


def _sweep_dir() -> str | None:
    """The multirun's directory as configured (relative paths stay relative), or None for a single run."""
    try:
        hc = HydraConfig.get()
    except ValueError:  # not under Hydra
        return None
    return str(hc.sweep.dir) if str(hc.mode) == "RunMode.MULTIRUN" else None


def run_label(seed: Any) -> str:
    """A dashboard's name for this job: every factor it varies and its seed (`ffn=gelu,seed=1`), so no two jobs of
    a sweep share a name."""
    return ",".join([*(f"{k}={v}" for k, v in job_factors().items()), f"seed={seed}"])


def _wandb_naming(logger_cfg: Mapping[str, Any], seed: Any) -> dict[str, Any]:
    """Runs of one sweep share a wandb group (the sweep directory); a run is named by its factors and seed."""
    try:
        HydraConfig.get()
    except ValueError:  # not under Hydra
        return {}
    sweep = _sweep_dir()
    return {"group": logger_cfg.get("group") or sweep or "single-runs",
            "name": logger_cfg.get("name") or run_label(seed)}


# --- MLflow -------------------------------------------------------------------------------------------

def tracking_uri(uri: str | None) -> str:
    """A relative SQLite path (`sqlite:///outputs/mlflow.db`) made absolute against the working directory,
    so every job of a sweep, and `mlflow ui` run from the same place, use one store."""
    uri = str(uri or "")
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = Path(uri[len("sqlite:///"):]).absolute()
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    if uri.startswith("sqlite:////"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return uri


def _artifact_location(uri: str, configured: str | None) -> str | None:
    """Beside a SQLite store by default (MLflow would use ./mlruns); a server chooses its own."""
    if configured or not uri.startswith("sqlite:///"):
        return configured
    return str(Path(uri[len("sqlite:///"):]).parent / "mlflow-artifacts")


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Serialise the first use of a SQLite store: two processes creating its tables at once collide."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    with open(uri[len("sqlite:///"):] + ".lock", "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _checked_uri(cfg: Mapping[str, Any], key: str) -> str:
    """The tracking URI, after checking that mlflow is installed and a server answers."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise ConfigError(f"{key}: the mlflow package is not installed; valid: {pip_install('mlflow')}, "
                          "or another logger (csv, tensorboard, wandb, none)") from None
    bound_network()  # MLflow's own wait: 120 s per request, 7 retries
    uri = tracking_uri(cfg.get("tracking_uri"))
    valid = "valid: sqlite:///<file>, http://<host>:<port> of a running server"
    if not uri:
        raise ConfigError(f"{key}.tracking_uri: empty; {valid}")
    parsed = urllib.parse.urlsplit(uri)
    scheme = parsed.scheme.split("+")[0]  # postgresql+psycopg2://...
    if scheme not in STORE_SCHEMES:
        raise ConfigError(f"{key}.tracking_uri: unknown scheme '{parsed.scheme}' in {uri}; {valid} "
                          f"(schemes: {', '.join(s for s in STORE_SCHEMES if s)})")
    if parsed.scheme in ("http", "https"):  # fail now, not after MLflow's minutes of retries
        try:
            socket.create_connection((parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)),
                                     timeout=10).close()
        except OSError as e:
            raise ConfigError(f"{key}.tracking_uri: cannot reach {uri} ({e.strerror or e}); {valid}") from None
    return uri


@contextlib.contextmanager
def _store_errors(key: str, uri: str) -> Iterator[None]:
    """MLflow's errors about the store (unknown scheme, unreadable file) as one line naming the key."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as e:
        raise ConfigError(f"{key}.tracking_uri: {uri}: {_reason(e)}; valid: sqlite:///<file>, "
                          "http://<host>:<port> of a running server") from None


def _experiment_id(client: Any, name: str, artifact_location: str | None) -> str:  # client: an MlflowClient
    """Get or create; two jobs creating the same experiment at once both end up with it."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(found.experiment_id)
        if KIND_TAG not in found.tags:
            client.set_experiment_tag(found.experiment_id, KIND_TAG, MODEL_TRAINING)
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name, artifact_location=artifact_location,
                                            tags={KIND_TAG: MODEL_TRAINING}))
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


def _mlflow_run(cfg: Mapping[str, Any], key: str, seed: int) -> dict[str, Any]:
    """Create this job's MLflow run (in the sweep's experiment, under the sweep's parent run when there is
    one) and return the MLFlowLogger arguments that attach to it."""
    if rank_zero_only.rank != 0:  # DDP: Lightning logs from rank 0 only, so other ranks make no run
        return {"tracking_uri": tracking_uri(cfg.get("tracking_uri"))}
    uri = _checked_uri(cfg, key)
    from mlflow import MlflowClient

    sweep = _sweep_dir()
    name = cfg.get("experiment_name") or sweep or DEFAULT_EXPERIMENT
    run_name = cfg.get("run_name") or run_label(seed)
    tags = {**(cfg.get("tags") or {}), ROLE_TAG: "job", "seed": str(seed), "mlflow.runName": run_name}
    with _store_lock(uri), _store_errors(key, uri):  # a SQLite store's tables are created on first use
        client = MlflowClient(uri)
        experiment = _experiment_id(client, name, _artifact_location(uri, cfg.get("artifact_location")))
        if sweep is not None:
            parent = _parent_run(client, experiment, sweep)
            if parent is not None:
                tags["mlflow.parentRunId"] = parent
        run = client.create_run(experiment, run_name=run_name, tags=tags)
    return {"tracking_uri": uri, "experiment_name": name, "run_name": run_name, "run_id": run.info.run_id}


def _parent_run(client: Any, experiment: str, sweep: str) -> str | None:
    runs = client.search_runs([experiment], f"tags.`{ROLE_TAG}` = 'sweep' and tags.`{SWEEP_TAG}` = '{sweep}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


class MLflowSweep(Callback):
    """A Hydra callback (conf/logger/mlflow.yaml adds it): a multirun gets a parent MLflow run, under which
    its jobs nest, and when the sweep ends its top-level files (the report that zoo.report's callback has
    just written, multirun.yaml) and report_*/ folders are logged to the parent as artifacts.

    Hydra calls the end hooks in reverse order, and this callback comes before the studies' report."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.client: Any | None = None  # an MlflowClient (mlflow is optional)
        self.experiment: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        node = (config.get("logger") or {}).get("mlflow")
        if not node:  # the logger is swept or removed: the jobs log without a parent
            return
        cfg = plain_mapping(node, resolve=True)
        sweep = str(config.hydra.sweep.dir)
        try:
            uri = _checked_uri(cfg, "logger.mlflow")
            from mlflow import MlflowClient

            # under the lock this also creates a new SQLite store's tables before the jobs start
            with _store_lock(uri), _store_errors("logger.mlflow", uri):
                self.client = MlflowClient(uri)
                experiment = _experiment_id(self.client, cfg.get("experiment_name") or sweep,
                                            _artifact_location(uri, cfg.get("artifact_location")))
                run = self.client.create_run(experiment, run_name=f"sweep {sweep}",
                                             tags={ROLE_TAG: "sweep", SWEEP_TAG: sweep})
                self.experiment = experiment
        except ConfigError as e:  # before any job starts: one line and exit code 2, as a job would
            warn(f"error: {e}")
            sys.exit(2)
        self.run_id = run.info.run_id

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.run_id is None:
            return
        assert self.client is not None and self.experiment is not None  # set with run_id by on_multirun_start
        root = Path(str(config.hydra.sweep.dir))
        try:
            for path in sorted(root.glob("*")) if root.is_dir() else []:
                if path.name.startswith(".") or path.name.endswith(".lock"):
                    continue
                if path.is_file():
                    self.client.log_artifact(self.run_id, str(path))
                elif path.is_dir() and path.name.startswith("report"):
                    self.client.log_artifacts(self.run_id, str(path), artifact_path=path.name)
            self.client.set_terminated(self.run_id, "FINISHED")
            uri = str(self.client.tracking_uri)
            if uri.startswith("http"):
                say(f"mlflow: the sweep's runs: {experiment_url(uri, self.experiment)}")
            else:  # a local store: its runs are served by `mlflow ui`, on port 5000 by default
                say(f"mlflow: the sweep's runs: {experiment_url('http://127.0.0.1:5000', self.experiment)} once "
                    f"`mlflow ui --backend-store-uri {uri}` serves them")
        except Exception as e:  # the server stopped answering during the sweep: its files are all on disk
            warn(f"warning: mlflow: the sweep's report and end status not logged ({_reason(e)}); they are in "
                 f"{root}")



def _tensorboard_hparams(logger: Any, metrics: Mapping[str, Any], unlogged: Mapping[str, Any], step: int,
                         seed: Any) -> None:
    """Write the HParams plugin's summaries: the job's factors and seed against its final and best metrics.

    The plugin shows, for each metric named here, the last value of that scalar in the run, so the
    metrics computed only for the summary (`unlogged`) are logged as scalars first."""
    from torch.utils.tensorboard.summary import hparams  # optional: tensorboard

    writer = logger.experiment
    for k, v in unlogged.items():
        writer.add_scalar(k, v, step)
    params = {k: _number(v) for k, v in job_factors().items()}
    if seed is not None:
        params["seed"] = seed
    for summary in hparams(params, dict(metrics)):  # experiment, session start, session end
        writer._get_file_writer().add_summary(summary)
    writer.flush()


def _number(value: str) -> Any:
    """An override's value as the HParams view should sort it: 32 and 1e-3 are numbers, relu a string."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value
