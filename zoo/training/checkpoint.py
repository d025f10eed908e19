"""Safe checkpoint loading: tensors and plain data only (torch.load(weights_only=True)).

The architecture is rebuilt from the registry names stored in the checkpoint's config, never from
pickled classes or `_target_` paths, so a checkpoint can only choose among the zoo's own parts.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import nn

from zoo.build import build_model
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


def load_checkpoint(path: str | Path) -> tuple[nn.Module, Tokenizer, dict]:
    """(model in eval mode, tokenizer, run config) from a zoo training checkpoint."""
    ckpt = read_checkpoint(path)
    try:
        cfg = ckpt["hyper_parameters"]["cfg"]
        state = ckpt["state_dict"]
        tokenizer = tokenizer_from_state(ckpt["tokenizer"])
    except (KeyError, TypeError):
        raise CheckpointError(f"checkpoint: '{path}' is not a zoo training checkpoint (no config, "
                              "weights or tokenizer)") from None
    model = build_model(cfg["model"])  # registry names only; unknown names fail with the valid list
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    return model.eval(), tokenizer, cfg
