"""Callbacks: throughput on the progress bar, a divergence guard, and best-metric tracking."""

from __future__ import annotations

import math
import time

import lightning as L
import torch


class Throughput(L.Callback):
    """Tokens per second on the progress bar; tokens seen and time to the first step for the summary."""

    def __init__(self, start_time: float):
        self.start_time = start_time
        self.tokens = 0
        self.first_step_at: float | None = None
        self.train_time = 0.0
        self._t0 = 0.0
        self._window: list[tuple[float, int]] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        now = time.perf_counter()
        if self.first_step_at is None:
            self.first_step_at = now - self.start_time
        n = int(batch["input"].numel() + (batch["src"].numel() if "src" in batch else 0))
        self.tokens += n * trainer.world_size
        self.train_time += now - self._t0
        self._window = (self._window + [(now - self._t0, n)])[-20:]
        seconds = sum(t for t, _ in self._window)
        module.log("tok/s", sum(k for _, k in self._window) * trainer.world_size / max(seconds, 1e-9),
                   prog_bar=True, on_step=True, on_epoch=False)


class DivergenceGuard(L.Callback):
    """Stops the run at the first non-finite training loss and remembers the step."""

    def __init__(self):
        self.step: int | None = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None and not torch.isfinite(loss).all():
            self.step = trainer.global_step
            trainer.should_stop = True


class BestMetrics(L.Callback):
    """The final and best value of every validation metric, with the step it was reached at."""

    def __init__(self):
        self.final: dict[str, float] = {}
        self.best: dict[str, dict] = {}
        self.history: list[dict] = []

    def on_validation_epoch_end(self, trainer, module):
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k.startswith(("val_", "exact_match")) and math.isfinite(float(v))}
        self.final = {**metrics, "step": trainer.global_step}
        self.history.append(self.final)
        for k, v in metrics.items():
            better = (lambda a, b: a > b) if higher_is_better(k) else (lambda a, b: a < b)
            if k not in self.best or better(v, self.best[k]["value"]):
                self.best[k] = {"value": v, "step": trainer.global_step}


def higher_is_better(metric: str) -> bool:
    return "acc" in metric or "exact_match" in metric
