"""How Lightning writes, reads and removes a run's checkpoints. Apart from zoo.training.checkpoint, so that
loading a checkpoint (python -m zoo.sample) does not import Lightning."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from zoo.io import atomic_write, owned_path
from zoo.training.checkpoint import read_checkpoint

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """Lightning checkpoint IO that writes a temp file and renames it: never half a checkpoint.

    With `root` (the run's checkpoints/ directory) it also guards the run: a checkpoint is loaded
    weights-only and passed through `sanitize` before Lightning restores anything from it, and only
    checkpoint files directly inside `root` can be removed (Lightning deletes recursively whatever path
    its callback state names)."""

    def __init__(self, root: str | Path | None = None,
                 sanitize: Callable[[dict[str, Any], str | Path], dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.root = Path(root).resolve() if root is not None else None
        self.sanitize = sanitize

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None) -> None:
        path = owned_path(Path(path).parent, Path(path).name)  # a directory there is refused in one line
        atomic_write(path, lambda f: torch.save(checkpoint, f), mode="wb")  # the rename replaces a link itself

    def load_checkpoint(self, path: str | Path, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        ckpt = read_checkpoint(path)  # always weights-only, whatever the caller asks
        return self.sanitize(ckpt, path) if self.sanitize is not None else ckpt

    def remove_checkpoint(self, path: str | Path) -> None:
        target = Path(str(path).removeprefix("local://")).absolute()
        inside = self.root is None or (target.parent.resolve() == self.root and target.suffix == ".ckpt")
        if not inside or target.is_dir():
            log.warning("zoo: not removing '%s': only checkpoint files in the run's checkpoints/ are removed", path)
            return
        target.unlink(missing_ok=True)
