"""Dashboards: TensorBoard's HParams view and MLflow (a local store, a real server, its web UI)."""

import contextlib
import csv
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from tests import zygote
from tests.helpers import CONF, TINY

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hydra_job():
    """Compose like a job of `python train.py <overrides>`: HydraConfig set, so the run sees its overrides."""

    def _compose(overrides: list[str]):
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        return cfg

    yield _compose
    HydraConfig.instance().cfg = None


def test_job_factors_are_the_overrides_without_seed_and_logger(hydra_job):
    from zoo.training.loggers import job_factors

    hydra_job(["ffn=relu", "seed=3", "logger=tensorboard", "model.d_model=32", "+hydra.job.name=x"])
    assert job_factors() == {"ffn": "relu", "model.d_model": "32"}


def test_job_factors_in_a_sweep_are_the_overrides_that_vary_between_its_jobs(hydra_job, tmp_path):
    from zoo.training.loggers import job_factors

    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
        "    params:\n      seed: 0,1\n  overrides:\n    task:\n    - ffn=relu,gelu\n    - model.d_model=32\n"
        "    - threads=1\n    - logger.mlflow.tracking_uri=sqlite:///x.db\n")
    hydra_job(["ffn=relu", "seed=1", "model.d_model=32", "threads=1", f"hydra.sweep.dir={tmp_path}",
               "hydra.mode=MULTIRUN"])
    assert job_factors() == {"ffn": "relu"}  # not the settings every job shares, nor the seed


def _wandb_records(path: Path) -> list:
    """The protobuf records of an offline run's .wandb file (a LevelDB-style log: 32 KiB blocks of chunks with
    a 7-byte header: crc32, length, type), after W&B's own 7-byte file header."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, block, records, chunk = path.read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = chunk + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or a record's last chunk
            records.append(wandb_internal_pb2.Record.FromString(chunk))
            chunk = b""
    return records


def test_wandb_gets_the_factors_the_final_and_best_metrics_and_the_config_as_a_file(hydra_job, tmp_path,
                                                                                     monkeypatch, capfd):
    pytest.importorskip("wandb")
    from zoo.training import run
    from zoo.training.loggers import job_factors

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = hydra_job(TINY + ["logger=wandb", "ffn=relu", "seed=1", "sample.max_new_tokens=0"])
    assert run(cfg, run_dir=tmp_path / "run") == 0
    err = capfd.readouterr().err
    assert "not logged" not in err, err  # a dashboard that gave up says why, before the records miss it
    [path] = (tmp_path / "run").rglob("offline-run-*/run-*.wandb")  # what `wandb sync` would upload
    records = _wandb_records(path)
    config, summary = {}, {}
    for r in records:
        kind = r.WhichOneof("record_type")
        updates = {"config": r.config.update, "run": r.run.config.update, "summary": r.summary.update}.get(kind, [])
        (summary if kind == "summary" else config).update(
            {u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in updates})
    config.pop("_wandb", None)
    assert config == {**job_factors(), "seed": 1} and config["ffn"] == "relu"  # no cfg/... nor flat config keys
    final = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["val_loss"] == pytest.approx(final["final"]["val_loss"])
    assert summary["best/val_loss"] == pytest.approx(final["best"]["val_loss"]["value"])
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert any(a.type == "run-files" for a in artifacts)  # config.yaml and summary.json, as files


def test_relative_sqlite_store_is_made_absolute(tmp_path, monkeypatch):
    from zoo.training.loggers import tracking_uri

    monkeypatch.chdir(tmp_path)
    assert tracking_uri("sqlite:///outputs/mlflow.db") == f"sqlite:///{tmp_path}/outputs/mlflow.db"
    assert (tmp_path / "outputs").is_dir()
    assert tracking_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"


def test_tensorboard_hparams_view_gets_the_factors_and_final_metrics(hydra_job, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from zoo.training import run

    cfg = hydra_job(TINY + ["logger=tensorboard", "ffn=relu", "seed=1", "sample.max_new_tokens=0"])
    assert run(cfg, run_dir=tmp_path / "run") == 0
    acc = EventAccumulator(str(tmp_path / "run" / "tb"))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    data = {tag: plugin_data_pb2.HParamsPluginData.FromString(c) for tag, c in content.items()}
    start = next(d.session_start_info for d in data.values() if d.HasField("session_start_info"))
    experiment = next(d.experiment for d in data.values() if d.HasField("experiment"))
    from zoo.training.loggers import job_factors

    assert start.hparams["ffn"].string_value == "relu" and start.hparams["seed"].number_value == 1
    assert set(start.hparams) == {*job_factors(), "seed"}  # what the run was given, nothing of the config else
    metrics = {m.name.tag for m in experiment.metric_infos}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert metrics == set(summary["final"]) | {f"best/{k}" for k in summary["best"]}  # no hp_metric placeholder
    scalars = {tag: acc.Scalars(tag)[-1] for tag in metrics}  # the values the HParams view shows
    for tag in summary["final"]:
        assert scalars[tag].value == pytest.approx(summary["final"][tag], rel=1e-5)
    assert scalars["best/val_loss"].value == pytest.approx(summary["best"]["val_loss"]["value"], rel=1e-5)


# --- MLflow ---------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(base: str, path: str, body: dict | None = None, query: dict | None = None) -> dict:
    url = f"{base}/api/2.0/mlflow/{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def mlflow_sweep(tmp_path_factory):
    """A real MLflow server on loopback with a SQLite store, and a 4-run sweep logged to it over HTTP."""
    pytest.importorskip("mlflow")
    tmp = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [shutil.which("mlflow") or "mlflow", "server", "--backend-store-uri", f"sqlite:///{tmp}/server.db",
         "--artifacts-destination", str(tmp / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], cwd=tmp, stdout=open(tmp / "server.log", "w"), stderr=subprocess.STDOUT,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # no job-runner processes
        start_new_session=True)  # its own process group: stopping it stops its workers
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5)
                break
            except OSError:
                assert server.poll() is None, (tmp / "server.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(1)
        sweep = tmp / "sweep"
        # the README's MLflow sweep (its launcher, two jobs at a time, one thread each), at TINY's size
        cmd = [sys.executable, "train.py", "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "threads=1",
               "logger=mlflow", f"logger.mlflow.tracking_uri={base}", "ffn=relu,gelu", "seed=0,1",
               "sample.max_new_tokens=0", f"hydra.sweep.dir={sweep}",
               "+hydra.callbacks.report._target_=zoo.report.ReportAfterSweep", *TINY]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = zygote.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stderr[-3000:]
        experiment = _api(base, "experiments/get-by-name", query={"experiment_name": str(sweep)})["experiment"]
        yield base, experiment["experiment_id"], tmp
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):  # whatever of its group outlived the TERM
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=60)


def _runs(base: str, experiment: str, role: str) -> list[dict]:
    found = _api(base, "runs/search", {"experiment_ids": [experiment], "max_results": 100,
                                       "filter": f"tags.`zoo.role` = '{role}'"})
    return found.get("runs", [])


@pytest.mark.slow
def test_mlflow_server_gets_a_sweep_with_factors_seeds_and_metric_histories(mlflow_sweep):
    base, experiment, _ = mlflow_sweep
    jobs = _runs(base, experiment, "job")
    assert len(jobs) == 4
    [parent] = _runs(base, experiment, "sweep")
    seen = set()
    for r in jobs:
        params = {p["key"]: p["value"] for p in r["data"]["params"]}
        tags = {t["key"]: t["value"] for t in r["data"]["tags"]}
        ffn = params["ffn"]
        seen.add((ffn, tags["seed"]))
        assert tags["mlflow.runName"] == f"ffn={ffn},seed={tags['seed']}"  # no two jobs share a name
        assert tags["mlflow.parentRunId"] == parent["info"]["run_id"] and params["seed"] == tags["seed"]
        # the sweep's one varying factor and the seed: not what every job shares (model.d_model, threads,
        # the tracking URI) nor the config's keys (model.ffn.name would be a second axis of the same choice)
        assert set(params) == {"ffn", "seed"} and r["info"]["status"] == "FINISHED"
        assert {"val_loss", "val_ppl", "val_bpc", "best/val_loss"} <= {m["key"] for m in r["data"]["metrics"]}
        history = _api(base, "metrics/get-history", query={"run_id": r["info"]["run_id"], "metric_key": "val_loss"})
        assert [m["step"] for m in history["metrics"]] == [1, 3]  # every evaluation (val_check_interval=2)
        artifacts = _api(base, "artifacts/list", query={"run_id": r["info"]["run_id"]})
        assert {"summary.json", "config.yaml"} <= {f["path"] for f in artifacts["files"]}
    assert seen == {(f, s) for f in ("relu", "gelu") for s in ("0", "1")}
    tags = {t["key"]: t["value"] for t in _api(base, "experiments/get", query={"experiment_id": experiment})
            ["experiment"].get("tags", [])}
    assert tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens it on its runs
    artifacts = _api(base, "artifacts/list", query={"run_id": parent["info"]["run_id"]})
    assert {"report.md", "report.html", "multirun.yaml"} <= {f["path"] for f in artifacts["files"]}


def _chromium(tmp: Path) -> list[str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-background-networking", "--user-data-dir=" + str(tmp / "chromium"),
            "--virtual-time-budget=30000", "--window-size=1400,1000"]


@pytest.mark.slow
def test_mlflow_experiment_opens_on_its_runs_table_in_headless_chromium(mlflow_sweep):
    """The link the sweep prints at its end (MLflow 3's UI opens an experiment on GenAI traces unless told the
    model-training workflow) shows the runs table, with the sweep's run holding its jobs."""
    base, experiment, tmp = mlflow_sweep
    from zoo.training.loggers import experiment_url

    url = experiment_url(base, experiment)
    dom = zygote.run(_chromium(tmp) + ["--dump-dom", url], capture_output=True, text=True, timeout=300).stdout
    [parent] = _runs(base, experiment, "sweep")
    name = next(t["value"] for t in parent["data"]["tags"] if t["key"] == "mlflow.runName")
    assert name in dom and "Runs</h2>" in dom and "matching runs" in dom, dom[-2000:]


@pytest.mark.slow
def test_mlflow_compare_view_renders_the_runs_in_headless_chromium(mlflow_sweep):
    base, experiment, tmp = mlflow_sweep
    jobs = _runs(base, experiment, "job")
    ids = [r["info"]["run_id"] for r in jobs]
    url = f"{base}/#/compare-runs?" + urllib.parse.urlencode(
        {"runs": json.dumps(ids), "experiments": json.dumps([experiment])})
    flags = _chromium(tmp)
    dom = zygote.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=300).stdout
    names = [next(t["value"] for t in r["data"]["tags"] if t["key"] == "mlflow.runName") for r in jobs]
    for name in names:
        assert name in dom, name
    assert "val_loss" in dom and "ffn" in dom
    shot = tmp / "mlflow.png"
    zygote.run(flags + [f"--screenshot={shot}", url], capture_output=True, timeout=300)
    assert shot.is_file() and shot.stat().st_size > 10_000
    if os.environ.get("ZOO_KEEP_SCREENSHOT"):  # a path: keep the screenshot to look at
        shutil.copy(shot, os.environ["ZOO_KEEP_SCREENSHOT"])


def test_unreachable_mlflow_server_stops_a_sweep_before_its_jobs_with_one_line(tmp_path):
    """The sweep's callback checks the store first, so no job trains for a server that is not there."""
    pytest.importorskip("mlflow")
    uri = f"http://127.0.0.1:{_free_port()}"
    cmd = [sys.executable, "train.py", "-m", "logger=mlflow", f"logger.mlflow.tracking_uri={uri}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", *TINY]
    proc = zygote.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                      text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: logger.mlflow.tracking_uri: cannot reach {uri}") and "; valid: " in line
    assert not list((tmp_path / "sweep").rglob("summary.json"))  # no job ran


def test_unknown_mlflow_store_is_one_line_and_exit_code_2(tmp_path, capsys):
    pytest.importorskip("mlflow")
    from tests.helpers import compose_cfg
    from zoo.training import main

    cfg = compose_cfg(TINY + ["logger=mlflow", "logger.mlflow.tracking_uri=nosuch://x"])
    assert main(cfg, tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: logger.mlflow.tracking_uri: unknown scheme 'nosuch'") and "\n" not in err, err
    assert "; valid: sqlite:///<file>" in err
    assert not (tmp_path / "checkpoints").exists()  # nothing trained


@pytest.mark.slow
def test_ddp_run_is_one_mlflow_run(tmp_path):
    """Every DDP rank builds its loggers; only rank 0 may create the MLflow run (Lightning logs from it)."""
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "train.py", "trainer=ddp", "logger=mlflow", f"logger.mlflow.tracking_uri={store}",
           "sample.max_new_tokens=0", f"hydra.run.dir={tmp_path / 'run'}", *TINY]
    proc = zygote.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                      text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    client = MlflowClient(store)
    [experiment] = [e for e in client.search_experiments() if e.name == "zoo"]
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and "val_loss" in run.data.metrics


# --- Servers that stop answering: every network wait ends within zoo.net's bound ------------------------------
# ZOO_NET_TIMEOUT_S=2 keeps these tests short; the bound they check is the one the README states for any value.

QUICK = {"ZOO_NET_TIMEOUT_S": "2"}
STARTUP_S = 120  # a generous margin for the interpreter, torch and Lightning to load on a busy machine


def _env(tmp_path: Path, **extra: str) -> dict:
    """The environment of a command under test: no user's settings, and a hub cache of this pytest process's (one
    for all: the hub reads HF_HOME when it is imported, so a value per test would need a warm interpreter per test,
    tests/zygote.py; the silent servers leave nothing in it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "HF_HUB_", "WANDB_"))}
    return {**env, "PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path.parent / "hf"), "OMP_NUM_THREADS": "1", **QUICK,
            **extra}


def _within_bound(requests: int) -> float:
    """A subprocess's timeout: start-up and `requests` calls, each within the bound zoo.net documents."""
    from zoo.net import request_bound_s

    return STARTUP_S + requests * request_bound_s(float(QUICK["ZOO_NET_TIMEOUT_S"]))


@pytest.fixture
def silent_server():
    """A server on loopback that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    held, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for s in [*held, listener]:
        s.close()


class _MlflowThatStops(http.server.BaseHTTPRequestHandler):
    """Just enough of MLflow's REST API for a run; after `answered_batches` metric batches it never answers again."""

    answered_batches = 1
    run = {"info": {"run_id": "r1", "run_uuid": "r1", "experiment_id": "1", "status": "RUNNING",
                    "lifecycle_stage": "active", "artifact_uri": "mlflow-artifacts:/1/r1/artifacts"}, "data": {}}

    def do_GET(self):
        self._answer()

    def do_POST(self):
        self._answer()

    def _answer(self):
        server = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with server.lock:
            server.requests.append(self.path)
            if server.stopped is None and self.path.endswith("runs/log-batch") and b'"metrics"' in body:
                server.batches += 1
                if server.batches > self.answered_batches:
                    server.stopped = len(server.requests) - 1  # the index of the first unanswered request
        if server.stopped is not None:
            server.release.wait()  # never answers (until the test ends)
            return
        if "experiments/get-by-name" in self.path:
            reply = {"experiment": {"experiment_id": "1", "name": "zoo", "lifecycle_stage": "active"}}
        elif "runs/create" in self.path or "runs/get" in self.path:
            reply = {"run": self.run}
        else:
            reply = {}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def mlflow_that_stops():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MlflowThatStops)
    server.daemon_threads = True
    server.lock, server.requests, server.batches, server.stopped = threading.Lock(), [], 0, None
    server.release = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def test_mlflow_server_that_never_answers_is_one_line_within_the_bound(tmp_path, silent_server):
    """It accepts the connection (the old TCP probe passed) and never answers: MLflow alone retried for minutes."""
    pytest.importorskip("mlflow")
    cmd = [sys.executable, "train.py", "logger=mlflow", f"logger.mlflow.tracking_uri={silent_server}", "debug=fast",
           f"hydra.run.dir={tmp_path / 'run'}", *TINY]
    proc = zygote.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                      timeout=_within_bound(1))
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: logger.mlflow.tracking_uri: {silent_server}: no answer within 2 s, 2 tries "
                           "(ZOO_NET_TIMEOUT_S); valid: "), line
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before training


def test_mlflow_server_that_stops_answering_mid_run_costs_one_wait_and_one_line(tmp_path, mlflow_that_stops):
    """The run goes on and completes: metrics.csv and the checkpoints hold every step; the dashboard is not called
    again after its first unanswered request, and the run ends with one line saying what it did not get."""
    pytest.importorskip("mlflow")
    uri = f"http://127.0.0.1:{mlflow_that_stops.server_address[1]}"
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "train.py", "logger=mlflow", f"logger.mlflow.tracking_uri={uri}",
           "sample.max_new_tokens=0", f"hydra.run.dir={run_dir}", *TINY]
    proc = zygote.run(cmd, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                      timeout=_within_bound(1))
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith("warning: mlflow: ") and " not logged (" in line, line
    missed = line.removeprefix("warning: mlflow: ").partition(" not logged (")[0].split(", ")
    assert re.fullmatch(r"\d+ metric rows", missed[0]) and int(missed[0].split()[0]) >= 2, line  # this one and later
    assert set(missed[1:]) == {"the final metrics", "summary.json", "config.yaml", "the end status"}, line
    assert f"({uri} stopped answering at step " in line and "no answer within 2 s, 2 tries (ZOO_NET_TIMEOUT_S)" in line
    assert line.endswith(f"the run's record is in {run_dir} (metrics.csv, summary.json, checkpoints/)"), line
    stopped = mlflow_that_stops.stopped
    assert stopped is not None and len(mlflow_that_stops.requests) - stopped <= 2, mlflow_that_stops.requests[stopped:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4
    with open(run_dir / "metrics.csv") as f:
        steps = {int(row["step"]) for row in csv.DictReader(f) if row.get("train_loss")}
    assert steps == {0, 1, 2, 3}, steps
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / "checkpoints" / "best.ckpt").is_file()


def test_hub_that_never_answers_ends_init_from_hf_in_one_line_within_the_bound(tmp_path, silent_server):
    """huggingface_hub's client has no timeout of its own: without zoo's bound this waited forever."""
    pytest.importorskip("transformers")
    cmd = [sys.executable, "train.py", "init_from=hf:gpt2", "debug=fast", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = zygote.run(cmd, cwd=ROOT, env=_env(tmp_path, HF_ENDPOINT=silent_server), capture_output=True,
                      text=True, timeout=_within_bound(2))
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: init_from: cannot load 'hf:gpt2' ("), line


def test_hub_that_never_answers_ends_a_hub_tokenizer_in_zoo_prepare_in_one_line(tmp_path, silent_server):
    pytest.importorskip("transformers")
    (tmp_path / "a.txt").write_text("some text\n\nmore text\n")
    cmd = [sys.executable, "-m", "zoo.prepare", str(tmp_path / "a.txt"), "--tokenizer", "hf:gpt2",
           "--out", str(tmp_path / "corpus")]
    proc = zygote.run(cmd, cwd=ROOT, env=_env(tmp_path, HF_ENDPOINT=silent_server), capture_output=True,
                      text=True, timeout=_within_bound(2))
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: tokenizer: cannot load Hugging Face tokenizer 'hf:gpt2' ("), line


def test_network_bound_reaches_each_library_and_leaves_the_users_own_settings(monkeypatch):
    from zoo import net

    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                        if not k.startswith(("MLFLOW_", "WANDB_", "ZOO_NET"))})
    monkeypatch.setenv("ZOO_NET_TIMEOUT_S", "7")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "99")  # the user's: kept
    telemetry = pytest.importorskip("wandb.analytics.opentelemetry.opentelemetry_proxy")
    monkeypatch.setattr(telemetry, "_HTTP_CLIENT_TIMEOUT_SECONDS", 10)  # W&B's own; its exit waits on it
    assert net.bound_network() == 7
    assert telemetry._HTTP_CLIENT_TIMEOUT_SECONDS == 7
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "99"
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == str(net.RETRIES)
    assert os.environ["WANDB_INIT_TIMEOUT"] == "28" and os.environ["WANDB__FILE_STREAM_RETRY_MAX"] == "1"
    from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT

    assert MLFLOW_HTTP_REQUEST_TIMEOUT.get() == 99 and MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == 1


@pytest.mark.parametrize("value", ["abc", "0", "-1", "inf", "nan"])
def test_bad_network_timeout_is_one_line_naming_the_variable(monkeypatch, value):
    from zoo.build import ConfigError
    from zoo.data.corpus import DataError
    from zoo.net import timeout_s

    monkeypatch.setenv("ZOO_NET_TIMEOUT_S", value)
    with pytest.raises(ConfigError) as e:
        timeout_s()
    assert isinstance(e.value, DataError)  # zoo-prepare reports DataError, train.py both
    assert str(e.value) == f"ZOO_NET_TIMEOUT_S: got '{value}'; valid: a number of seconds > 0 (default 10)"


def test_wandb_online_with_a_server_that_never_answers_is_one_error_line_within_the_bound(tmp_path, silent_server):
    """W&B online (an account's key, its own server address): the run's start is bounded, then one line."""
    pytest.importorskip("wandb")
    cmd = [sys.executable, "train.py", "logger=wandb", "debug=fast", f"hydra.run.dir={tmp_path / 'run'}"]
    env = _env(tmp_path, WANDB_MODE="online", WANDB_BASE_URL=silent_server, WANDB_API_KEY="0" * 40,
               WANDB_DIR=str(tmp_path))
    proc = zygote.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=_within_bound(6))
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: logger.wandb: cannot start the run on W&B ("), \
        proc.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before training


def test_a_hub_dataset_that_never_answers_ends_zoo_prepare_in_one_line(tmp_path, silent_server):
    pytest.importorskip("datasets")
    cmd = [sys.executable, "-m", "zoo.prepare", "--dataset", "someone/some-corpus", "--out", str(tmp_path / "c")]
    proc = zygote.run(cmd, cwd=ROOT, env=_env(tmp_path, HF_ENDPOINT=silent_server), capture_output=True,
                      text=True, timeout=_within_bound(4))
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]  # beside the progress bar
    assert line.startswith("error: --dataset: cannot load 'someone/some-corpus' ("), line
