"""What every contender shares: the loss they all compute, and how a peer that is not installed is said."""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, the same for every contender (nanoGPT computes this very call)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class NotInstalled(RuntimeError):
    pass


def require(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise NotInstalled(f"not installed ({module})") from e
