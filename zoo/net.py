"""How long zoo waits for the network: one bound for every server zoo talks to or makes a library talk to.

    ZOO_NET_TIMEOUT_S=10   # the default: seconds a request may wait to connect, and then for each answer

`bound_network()` hands the bound to each library before its first request (MLflow, W&B, the Hugging Face hub
behind `init_from=hf:`, `hf:` tokenizers, `zoo.eval hf:` and datasets), with one retry where the library retries.
Left alone, they wait far longer: MLflow 120 s per request and 7 retries; the hub's client has no timeout at all
(a server that accepts and never answers holds `init_from=hf:` forever); W&B's init waits 90 s. A library's own
environment variable, where the user set one (MLFLOW_HTTP_REQUEST_TIMEOUT, HF_HUB_ETAG_TIMEOUT, WANDB_INIT_TIMEOUT,
...), wins over zoo's bound.

What a dashboard that stops answering mid-run does to the run is zoo/training/loggers.py's `Dashboard`.
"""

from __future__ import annotations

import logging
import os
import sys

from zoo.component import ConfigError
from zoo.io import DataError

TIMEOUT_ENV = "ZOO_NET_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10.0
RETRIES = 1  # one more try for a request that failed on the way (a dropped connection), then give up


class NetSettingError(ConfigError, DataError):
    """A bad ZOO_NET_TIMEOUT_S: a config error to train.py and a data error to zoo-prepare, one line to both."""


def timeout_s() -> float:
    """The bound, in seconds, from ZOO_NET_TIMEOUT_S (checked: a number > 0)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise NetSettingError(f"{TIMEOUT_ENV}: got {raw!r}; valid: a number of seconds > 0 "
                              f"(default {DEFAULT_TIMEOUT_S:g})")
    return value


def request_bound_s(timeout: float | None = None) -> float:
    """The longest one logical call can wait: each try's connect and answer, plus MLflow's backoff between tries
    (1 s and up to 1 s of jitter). What docs/reliability.md states and the tests check against."""
    t = timeout_s() if timeout is None else timeout
    return (1 + RETRIES) * 2 * t + 2 * RETRIES


def library_settings(timeout: float) -> dict[str, str]:
    """The libraries' own environment variables that carry the bound (read when they make a request or a run)."""
    t, whole = f"{timeout:g}", f"{max(1, round(timeout))}"  # some of them parse integers only
    return {
        # MLflow's REST client (requests + urllib3 retries), read at each request
        "MLFLOW_HTTP_REQUEST_TIMEOUT": whole, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(RETRIES),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_ARTIFACT_UPLOAD_DOWNLOAD_TIMEOUT": whole,
        # W&B: its run start, and its service's GraphQL, file-stream and upload requests
        "WANDB_INIT_TIMEOUT": f"{(1 + RETRIES) * 2 * timeout:g}", "WANDB_HTTP_TIMEOUT": whole,
        "WANDB__GRAPHQL_RETRY_MAX": str(RETRIES),
        "WANDB__FILE_STREAM_TIMEOUT_SECONDS": t, "WANDB__FILE_STREAM_RETRY_MAX": str(RETRIES),
        "WANDB__FILE_TRANSFER_TIMEOUT_SECONDS": t, "WANDB__FILE_TRANSFER_RETRY_MAX": str(RETRIES),
        # the Hugging Face hub (read when huggingface_hub is imported; patched below when it already was)
        "HF_HUB_ETAG_TIMEOUT": whole, "HF_HUB_DOWNLOAD_TIMEOUT": whole,
    }


def bound_network() -> float:
    """Give every library zoo may make talk to a server the bound (idempotent; cheap). Returns the bound."""
    timeout = timeout_s()
    settings = library_settings(timeout)
    user_set = {k for k in settings if k in os.environ}  # after a first call: ours, and applied already
    for key, value in settings.items():
        os.environ.setdefault(key, value)  # subprocesses (W&B's service, a sweep's jobs) inherit them
    _bound_hub(timeout, {k for k in user_set if k.startswith("HF_HUB_")})
    _bound_datasets()
    _bound_wandb_telemetry(timeout)
    return timeout


def _bound_hub(timeout: float, user_set: set[str]) -> None:
    """huggingface_hub reads its timeouts when imported (Lightning imports it, through torchmetrics and
    transformers, before any zoo code runs), waits without a limit for a request made with `timeout=None`
    (transformers' revision lookup), retries a file's metadata with a fixed 60 s timeout, and retries 5 times:
    its constants get the bound, every request is capped at it (or at the user's own HF_HUB_*_TIMEOUT, where
    longer), and a request is retried once."""
    global _hub_bound
    try:
        from huggingface_hub import constants
        from huggingface_hub.utils import _http
    except ImportError:
        return
    for name in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
        if name not in user_set:
            setattr(constants, name, max(1, round(timeout)))
    if _hub_bound == timeout or not hasattr(_http, "set_client_factory"):  # before 1.0 the hub used requests
        return
    logging.getLogger(_http.__name__).setLevel(logging.ERROR)  # its notes on each retry: zoo's error says it
    cap = max([timeout] + [getattr(constants, name) for name in user_set])
    _http.http_backoff.__kwdefaults__["max_retries"] = RETRIES  # its callers leave the default

    def bounded_client():
        client = _http.default_client_factory()
        client.event_hooks = {**client.event_hooks, "request": [*client.event_hooks["request"], _cap_timeouts(cap)]}
        client.send = _give_up_after_timeout(client.send, _http.httpx2.TimeoutException)
        return client

    _http.set_client_factory(bounded_client)  # closes a client made before; the next request makes one
    _hub_bound = timeout


_hub_bound: float | None = None  # the bound the hub's client has, once set


def _cap_timeouts(cap: float):
    def hook(request) -> None:  # httpx reads the request's timeouts when it sends it, after its request hooks
        limits = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {k: cap if limits.get(k) is None else min(limits[k], cap)
                                         for k in ("connect", "read", "write", "pool")}
    return hook


def _give_up_after_timeout(send, timeout_error: type[Exception]):
    """One unanswered request is enough: the host's later requests (transformers makes six for a config, each
    retried) fail at once with the first one's error, so a hub that stopped answering costs one bound, not six."""
    silent: dict[str, Exception] = {}

    def bounded_send(request, **kwargs):
        host = request.url.host
        if host in silent:
            raise type(silent[host])(f"{silent[host]} (an earlier request to {host})", request=request)
        try:
            return send(request, **kwargs)
        except timeout_error as e:
            silent[host] = e
            raise
    return bounded_send


def _bound_datasets() -> None:
    """datasets retries a streamed read 20 times, 5 s apart; its requests go through the hub's client (above).
    Only when datasets is loaded already: importing it costs seconds, and its callers import it first."""
    config = sys.modules.get("datasets.config")
    if config is None:
        return
    config.STREAMING_READ_MAX_RETRIES = config.STREAMING_OPEN_MAX_RETRIES = RETRIES
    config.STREAMING_READ_RETRY_INTERVAL = config.STREAMING_OPEN_RETRY_INTERVAL = 1


def _bound_wandb_telemetry(timeout: float) -> None:
    """W&B's own usage telemetry posts to the run's server with a fixed 10 s timeout, and its exit waits for that
    post: a server that never answers held the process 10-12 s after zoo's error line. Only when wandb is loaded
    already (build_loggers loads it first for a W&B logger)."""
    proxy = sys.modules.get("wandb.analytics.opentelemetry.opentelemetry_proxy")
    if proxy is not None and hasattr(proxy, "_HTTP_CLIENT_TIMEOUT_SECONDS"):
        proxy._HTTP_CLIENT_TIMEOUT_SECONDS = timeout
