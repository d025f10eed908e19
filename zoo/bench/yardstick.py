"""The ttt section's yardstick: every contender's checkpoints scored by one evaluator on the same characters.

The text is the validation split of the file as zoo reads it (zoo.data.corpus: UTF-8, a byte-order mark dropped,
CR line ends made LF; the last `val_fraction` of the characters, the split nanoGPT's prepare.py makes too), less any
character the training split lacks (a character-level model fitted on training text has no id for it; the count is
said). It is cut into every non-overlapping window of `context` inputs and their `context` next characters (the
last window's target is the first input of the next): each character but the first is predicted once, seeing the
characters before it in its window. Each model is a zoo module (nanoGPT's checkpoints are read into zoo's
GPT-2-shaped model by zoo.bench.contenders.nanogpt), run in float32 in eval mode on its own character ids; the
cross-entropy of each target is taken in float64 over the model's whole vocabulary. The loss is the mean over all
targets (every window has as many, so the mean of the windows' means). Its standard error treats the windows as
the sample: sd(window means) / sqrt(windows); two models on the same windows are compared by the standard error
of their paired difference, which is much smaller (the windows' difficulty cancels)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from zoo.data.corpus import read_text_file, split_text


class YardstickError(ValueError):
    """A model the yardstick cannot score (its tokenizer is not one id per character), said in one line."""


@dataclass(frozen=True)
class Yardstick:
    text: str  # the characters scored
    context: int
    dropped: int = 0  # validation characters the training split lacks, left out

    @classmethod
    def of_file(cls, path: str | Path, context: int, val_fraction: float = 0.1) -> Yardstick:
        train, val = split_text(read_text_file(path), val_fraction)
        seen = set(train)
        kept = "".join(c for c in val if c in seen)
        if len(kept) < context + 1:
            raise YardstickError(f"yardstick: the validation split of '{path}' has {len(kept)} characters, too "
                                 f"short for one window of {context} + 1")
        return cls(kept, context, len(val) - len(kept))

    @property
    def windows(self) -> int:
        return (len(self.text) - 1) // self.context

    def describe(self) -> str:
        return (f"{self.windows} non-overlapping windows of {self.context} characters ({self.windows * self.context} "
                "predicted characters) of the validation split" + (
                    f", less {self.dropped} characters the training split lacks" if self.dropped else ""))


@dataclass(frozen=True)
class Score:
    """A model's loss on the yardstick, with its windows' losses for standard errors."""
    window_losses: torch.Tensor  # float64, one per window

    @property
    def loss(self) -> float:
        return self.window_losses.mean().item()

    @property
    def se(self) -> float:
        return self.window_losses.std().item() / math.sqrt(len(self.window_losses))

    def minus(self, other: Score) -> tuple[float, float]:
        """(this loss - the other's, the standard error of that difference, the windows paired)."""
        d = self.window_losses - other.window_losses
        return d.mean().item(), d.std().item() / math.sqrt(len(d))


def char_ids(encode, text: str) -> dict[str, int]:
    """character -> id under a tokenizer's `encode`; refused unless each character is one id."""
    stoi = {}
    for c in sorted(set(text)):
        ids = list(encode(c))
        if len(ids) != 1:
            raise YardstickError(f"yardstick: scores character-level models only; the tokenizer makes {len(ids)} "
                                 f"ids of {c!r} (train with data.tokenizer=char)")
        stoi[c] = ids[0]
    return stoi


@torch.no_grad()
def score(model: nn.Module, stoi: Mapping[str, int], ys: Yardstick, batch: int = 64) -> Score:
    """`model` (a zoo module: ids (B, T) -> logits (B, T, V)) on the yardstick, `stoi` its character ids."""
    missing = sorted(set(ys.text) - set(stoi))
    if missing:
        raise YardstickError(f"yardstick: the model has no id for {len(missing)} characters of the text, e.g. "
                             f"{', '.join(map(repr, missing[:5]))}")
    n, t = ys.windows, ys.context
    ids = torch.tensor([stoi[c] for c in ys.text[:n * t + 1]], dtype=torch.long)
    x, y = ids[:-1].view(n, t), ids[1:].view(n, t)
    was_training = model.training
    model.eval()
    losses = []
    for i in range(0, n, batch):
        logits = model(x[i:i + batch]).float()
        ce = F.cross_entropy(logits.double().flatten(0, 1), y[i:i + batch].flatten(), reduction="none")
        losses.append(ce.view(-1, t).mean(1))
    model.train(was_training)
    return Score(torch.cat(losses))


def zoo_checkpoint(path: str | Path, ys: Yardstick) -> tuple[nn.Module, dict[str, int], int]:
    """(model, character ids, step) of a zoo training checkpoint."""
    # lazy: Lightning (7 s after torch), paid only when a section scores checkpoints
    from zoo.training.checkpoint import load_checkpoint, read_checkpoint

    model, tokenizer, _ = load_checkpoint(path)
    step = read_checkpoint(path).get("global_step")  # a small file read twice: load_checkpoint takes a path
    return model.float(), char_ids(tokenizer.encode, ys.text), int(step)
