"""Dashboards: TensorBoard's HParams view and MLflow (a local store, a real server, its web UI)."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

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
    assert start.hparams["ffn"].string_value == "relu" and start.hparams["seed"].number_value == 1
    assert "model.d_model" in start.hparams and "hp_metric" not in {m.name.tag for m in experiment.metric_infos}
    metrics = {m.name.tag for m in experiment.metric_infos}
    assert {"val_loss", "val_ppl", "val_bpc"} <= metrics
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    scalars = {tag: acc.Scalars(tag)[-1] for tag in metrics}  # the values the HParams view shows
    for tag in metrics:
        assert scalars[tag].value == pytest.approx(summary["final"][tag], rel=1e-5)


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
        cmd = [sys.executable, "train.py", "-m", "logger=mlflow", f"logger.mlflow.tracking_uri={base}",
               "ffn=relu,gelu", "seed=0,1", "threads=1", "sample.max_new_tokens=0", f"hydra.sweep.dir={sweep}",
               "+hydra.callbacks.report._target_=zoo.report.ReportAfterSweep", *TINY]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
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
        assert f"ffn={ffn}" in tags["mlflow.runName"].split(",") and "seed" not in tags["mlflow.runName"]
        assert tags["mlflow.parentRunId"] == parent["info"]["run_id"] and params["seed"] == tags["seed"]
        assert r["info"]["status"] == "FINISHED" and not any(k.startswith("cfg/") for k in params)
        assert params["model.d_model"] == "32" and {"val_loss", "val_ppl", "val_bpc"} <= {
            m["key"] for m in r["data"]["metrics"]}
        history = _api(base, "metrics/get-history", query={"run_id": r["info"]["run_id"], "metric_key": "val_loss"})
        assert [m["step"] for m in history["metrics"]] == [1, 3]  # every evaluation (val_check_interval=2)
        artifacts = _api(base, "artifacts/list", query={"run_id": r["info"]["run_id"]})
        assert {"summary.json", "config.yaml"} <= {f["path"] for f in artifacts["files"]}
    assert seen == {(f, s) for f in ("relu", "gelu") for s in ("0", "1")}
    artifacts = _api(base, "artifacts/list", query={"run_id": parent["info"]["run_id"]})
    assert {"report.md", "report.html", "multirun.yaml"} <= {f["path"] for f in artifacts["files"]}


@pytest.mark.slow
def test_mlflow_compare_view_renders_the_runs_in_headless_chromium(mlflow_sweep):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    base, experiment, tmp = mlflow_sweep
    jobs = _runs(base, experiment, "job")
    ids = [r["info"]["run_id"] for r in jobs]
    url = f"{base}/#/compare-runs?" + urllib.parse.urlencode(
        {"runs": json.dumps(ids), "experiments": json.dumps([experiment])})
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--user-data-dir=" + str(tmp / "chromium"), "--virtual-time-budget=30000", "--window-size=1400,1000"]
    dom = subprocess.run(flags + ["--dump-dom", url], capture_output=True, text=True, timeout=300).stdout
    names = [next(t["value"] for t in r["data"]["tags"] if t["key"] == "mlflow.runName") for r in jobs]
    for name in names:
        assert name in dom, name
    assert "val_loss" in dom and "ffn" in dom
    shot = tmp / "mlflow.png"
    subprocess.run(flags + [f"--screenshot={shot}", url], capture_output=True, timeout=300)
    assert shot.is_file() and shot.stat().st_size > 10_000
    if os.environ.get("ZOO_KEEP_SCREENSHOT"):  # a path: keep the screenshot to look at
        shutil.copy(shot, os.environ["ZOO_KEEP_SCREENSHOT"])


def test_unreachable_mlflow_server_stops_a_sweep_before_its_jobs_with_one_line(tmp_path):
    """The sweep's callback checks the store first, so no job trains for a server that is not there."""
    pytest.importorskip("mlflow")
    uri = f"http://127.0.0.1:{_free_port()}"
    cmd = [sys.executable, "train.py", "-m", "logger=mlflow", f"logger.mlflow.tracking_uri={uri}",
           f"hydra.sweep.dir={tmp_path / 'sweep'}", *TINY]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
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
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    client = MlflowClient(store)
    [experiment] = [e for e in client.search_experiments() if e.name == "zoo"]
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and "val_loss" in run.data.metrics
