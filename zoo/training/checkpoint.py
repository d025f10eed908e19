"""Safe checkpoint loading: tensors and plain data only (torch.load(weights_only=True)).

The architecture is rebuilt from the registry names stored in the checkpoint's config, never from
pickled classes or `_target_` paths, so a checkpoint can only choose among the zoo's own parts.
"""

from __future__ import annotations

import math
import pickle
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from zoo.build import ConfigError, build_model, on_meta, resolve_config
from zoo.config.checks import check_memory
from zoo.data.tokenizers import Tokenizer, tokenizer_from_state
from zoo.io import checkpoint_file_error, first_line


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupted, or not a zoo checkpoint."""


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if (missing := checkpoint_file_error(path)) is not None:
        raise CheckpointError(missing)
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut one loses its directory
        raise CheckpointError(f"checkpoint: '{path}' is truncated or corrupted (not a complete torch archive)")
    if (bad := _failed_crc(path)) is not None:  # torch.load does not check the archive's CRC-32s: a flipped byte
        raise CheckpointError(f"checkpoint: '{path}' is corrupted ({bad} does not match its CRC-32)")  # loads
    try:
        ckpt: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)  # what torch.save wrote: a
        return ckpt  # zoo or Lightning checkpoint is a dict (its readers check the keys they take)
    except pickle.UnpicklingError as e:  # weights_only refused a pickled object
        first = first_line(e)
        raise CheckpointError(f"checkpoint: '{path}' holds objects other than tensors and plain data; "
                              f"refusing to unpickle them ({first[:160]})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint: '{path}' is truncated or corrupted ({type(e).__name__})") from None


def _failed_crc(path: Path) -> str | None:
    """The first member of the archive whose bytes do not match the CRC-32 torch.save recorded, else None.
    One more read of the file (docs/benchmarks.md: "Checkpoint CRC check")."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        return f"the archive ({type(e).__name__})"


class CheckpointConfigError(CheckpointError, ConfigError):
    """A checkpoint whose stored model config is invalid (an unknown component name, a bad number)."""


def check_weights(state: Any, model_cfg: Any, path: str | Path) -> None:
    """Refuse a checkpoint whose weights do not fit the architecture its config names: a missing or extra
    weight, or one of the wrong shape, named in one line. Also refuses a config too large for memory. The
    expected shapes come from the model built on the meta device: nothing is allocated."""
    try:
        cfg = resolve_config(model_cfg)  # registry names only; unknown names fail with the valid list
        check_memory(cfg, training=False, key=f"checkpoint: '{path}': model")
    except ConfigError as e:
        raise CheckpointConfigError(f"checkpoint: '{path}': {e}" if not str(e).startswith("checkpoint") else str(e)) \
            from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint: '{path}' has no weights (state_dict is {type(state).__name__})")
    expected = on_meta(cfg).state_dict()
    got = {k.removeprefix("model."): v for k, v in state.items() if isinstance(k, str) and k.startswith("model.")}
    for key, want in expected.items():
        have = got.get(key)
        if have is None:
            raise CheckpointError(f"checkpoint: '{path}' lacks weight 'model.{key}' (shape {list(want.shape)}) "
                                  f"that its config's {cfg.name} needs")
        if not isinstance(have, torch.Tensor) or have.shape != want.shape:
            shape = list(have.shape) if isinstance(have, torch.Tensor) else type(have).__name__
            raise CheckpointError(f"checkpoint: '{path}': weight 'model.{key}' has shape {shape}, its config's "
                                  f"architecture needs {list(want.shape)}")
    extra = [k for k in got if k not in expected]
    if extra:
        raise CheckpointError(f"checkpoint: '{path}': weight 'model.{extra[0]}' (shape "
                              f"{list(getattr(got[extra[0]], 'shape', []))}) is not part of its config's architecture")


def load_checkpoint(path: str | Path) -> tuple[nn.Module, Tokenizer, dict[str, Any]]:
    """(model in eval mode, tokenizer, run config) from a zoo training checkpoint."""
    ckpt = read_checkpoint(path)
    try:
        cfg = ckpt["hyper_parameters"]["cfg"]
        state = ckpt["state_dict"]
        tokenizer = tokenizer_from_state(ckpt["tokenizer"])
        model_cfg = cfg["model"]
    except (KeyError, TypeError):
        raise CheckpointError(f"checkpoint: '{path}' is not a zoo training checkpoint (no config, "
                              "weights or tokenizer)") from None
    check_weights(state, model_cfg, path)  # before any weight is allocated
    model = build_model(model_cfg)
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    return model.eval(), tokenizer, cfg


# What a resume takes from a checkpoint besides zoo's own callback state. Everything else (other
# callbacks' state, unknown keys) is dropped: a checkpoint is data from outside, not instructions.
RESUME_KEYS = ("epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops", "optimizer_states",
               "lr_schedulers", "hparams_name", "hyper_parameters", "tokenizer", "rng_state",
               "MixedPrecision", "native_amp_scaling_state")


def _number(x: Any, key: str, integer: bool = False) -> float | int:
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_complex():
        x = x.item()
    ok = isinstance(x, int) if integer else isinstance(x, (int, float))
    if isinstance(x, bool) or not ok or not math.isfinite(x):
        raise CheckpointError(f"checkpoint: callback state {key} must be a finite {'integer' if integer else 'number'}"
                              f", got {type(x).__name__}")
    return cast(float | int, x)  # checked above: a finite int or float, not a bool


def _metrics(d: Any, key: str) -> dict[str, float | int]:
    """{name: number}; a `step` entry must be an integer."""
    if not isinstance(d, dict) or not all(isinstance(k, str) for k in d):
        raise CheckpointError(f"checkpoint: callback state {key} must map names to numbers")
    return {k: _number(v, f"{key}.{k}", integer=k == "step") for k, v in d.items()}


def check_throughput_state(state: Any) -> dict[str, float | int]:
    if not isinstance(state, dict) or not {"tokens", "train_time"} <= set(state) or \
            set(state) - {"tokens", "train_time", "wall_time", "eval_time", "resumes"}:
        raise CheckpointError("checkpoint: callback state Throughput must hold tokens, train_time "
                              "(and wall_time, eval_time, resumes)")
    return {k: _number(v, f"Throughput.{k}", integer=k in ("tokens", "resumes")) for k, v in state.items()}


def check_best_metrics_state(state: Any) -> dict[str, Any]:
    if not isinstance(state, dict) or set(state) != {"final", "best", "history"}:
        raise CheckpointError("checkpoint: callback state BestMetrics must hold final, best and history")
    best, history = state["best"], state["history"]
    if not isinstance(best, dict) or not all(isinstance(k, str) and isinstance(v, dict) and set(v) == {"value", "step"}
                                             for k, v in best.items()):
        raise CheckpointError("checkpoint: callback state BestMetrics.best must map names to {value, step}")
    if not isinstance(history, list):
        raise CheckpointError("checkpoint: callback state BestMetrics.history must be a list")
    return {"final": _metrics(state["final"], "BestMetrics.final"),
            "best": {k: _metrics(v, f"BestMetrics.best.{k}") for k, v in best.items()},
            "history": [_metrics(h, f"BestMetrics.history[{i}]") for i, h in enumerate(history)]}


def model_checkpoint_state(saved: Any, callback: Any) -> dict[str, Any]:
    """ModelCheckpoint state rebuilt from one number: the best score, kept only if this run's best.ckpt
    exists. Every path is this run's own (checkpoints/best.ckpt, last.ckpt); no path is read from the
    checkpoint, so Lightning can never be told to replace or delete a file elsewhere."""
    dirpath = Path(callback.dirpath)
    best, last = dirpath / f"{callback.filename}.ckpt", dirpath / "last.ckpt"
    score = saved.get("best_model_score") if isinstance(saved, dict) else None
    if score is not None:
        score = torch.tensor(float(_number(score, "ModelCheckpoint.best_model_score")))
    if score is None or not best.is_file():
        score = None
    return {"monitor": callback.monitor, "dirpath": callback.dirpath, "best_model_score": score,
            "best_model_path": str(best) if score is not None else "", "current_score": None,
            "best_k_models": {str(best): score} if score is not None else {},
            "kth_best_model_path": str(best) if score is not None else "",
            "kth_value": score if score is not None else callback.kth_value,
            "last_model_path": str(last) if last.is_file() else ""}


def sanitize_for_resume(ckpt: dict[str, Any], path: str | Path, callbacks: Mapping[str, Callable[[Any], Any]],
                        extra_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The part of a checkpoint a resume may use. `callbacks` maps a callback's state key to a function
    that checks (or rebuilds) its state; any other callback state, and any key outside RESUME_KEYS and
    `extra_keys`, is dropped."""
    clean = {k: v for k, v in ckpt.items() if k in RESUME_KEYS or k in extra_keys}
    saved: dict[str, Any] = ckpt["callbacks"] if isinstance(ckpt.get("callbacks"), dict) else {}
    kept: dict[str, Any] = {}
    for key, check in callbacks.items():
        if key not in saved:
            continue
        try:
            state = check(saved.get(key))
        except CheckpointError as e:
            raise CheckpointError(f"{e} in '{path}'") from None
        if state is not None:
            kept[key] = state
    clean["callbacks"] = kept
    return clean
