"""Safe checkpoint loading: tensors and plain data only (torch.load(weights_only=True)).

The architecture is rebuilt from the registry names stored in the checkpoint's config, never from
pickled classes or `_target_` paths, so a checkpoint can only choose among the zoo's own parts.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import nn

from zoo.build import ConfigError, build_model, resolve_config
from zoo.data.tokenizers import Tokenizer, tokenizer_from_state
from zoo.io import atomic_write


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint IO that writes a temp file and renames it: never half a checkpoint."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        atomic_write(path, lambda f: torch.save(checkpoint, f), mode="wb")


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupted, or not a zoo checkpoint."""


def read_checkpoint(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint: no such file '{path}'")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut one loses its directory
        raise CheckpointError(f"checkpoint: '{path}' is truncated or corrupted (not a complete torch archive)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refused a pickled object
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint: '{path}' holds objects other than tensors and plain data; "
                              f"refusing to unpickle them ({first[:160]})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint: '{path}' is truncated or corrupted ({type(e).__name__})") from None


class CheckpointConfigError(CheckpointError, ConfigError):
    """A checkpoint whose stored model config is invalid (an unknown component name, a bad number)."""


def check_weights(state: Any, model_cfg: Any, path: str | Path) -> None:
    """Refuse a checkpoint whose weights do not fit the architecture its config names: a missing or extra
    weight, or one of the wrong shape, named in one line. Also refuses a config too large for memory. The
    expected shapes come from the model built on the meta device: nothing is allocated."""
    from zoo.registry import MODEL
    from zoo.training.validate import check_memory

    try:
        cfg = resolve_config(model_cfg)  # registry names only; unknown names fail with the valid list
        check_memory(cfg, training=False, key=f"checkpoint: '{path}': model")
    except ConfigError as e:
        raise CheckpointConfigError(f"checkpoint: '{path}': {e}" if not str(e).startswith("checkpoint") else str(e)) \
            from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint: '{path}' has no weights (state_dict is {type(state).__name__})")
    with torch.device("meta"):
        expected = MODEL.get(cfg["name"])(cfg).state_dict()
    got = {k.removeprefix("model."): v for k, v in state.items() if isinstance(k, str) and k.startswith("model.")}
    for key, want in expected.items():
        have = got.get(key)
        if have is None:
            raise CheckpointError(f"checkpoint: '{path}' lacks weight 'model.{key}' (shape {list(want.shape)}) "
                                  f"that its config's {cfg['name']} needs")
        if not isinstance(have, torch.Tensor) or have.shape != want.shape:
            shape = list(have.shape) if isinstance(have, torch.Tensor) else type(have).__name__
            raise CheckpointError(f"checkpoint: '{path}': weight 'model.{key}' has shape {shape}, its config's "
                                  f"architecture needs {list(want.shape)}")
    extra = [k for k in got if k not in expected]
    if extra:
        raise CheckpointError(f"checkpoint: '{path}': weight 'model.{extra[0]}' (shape "
                              f"{list(getattr(got[extra[0]], 'shape', []))}) is not part of its config's architecture")


def load_checkpoint(path: str | Path) -> tuple[nn.Module, Tokenizer, dict]:
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
