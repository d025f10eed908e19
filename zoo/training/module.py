"""The LightningModule every lineage trains with: objective, the optimizer (optim=, zoo/optim/), warm-up + cosine
schedule."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_info

from zoo.build import build_model
from zoo.component import after_step, aux_losses, clear_aux_losses, declared
from zoo.config.data import TaskOptions
from zoo.config.plan import RunPlan
from zoo.meta import spec_of
from zoo.registry import OPTIM, RESIDUAL
from zoo.training.objectives import OBJECTIVE


class ZooModule(L.LightningModule):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    def __init__(self, plan: RunPlan):
        """plan: the run (zoo.config.plan); checkpoints keep its plain form as their hyper_parameters."""
        super().__init__()
        self.save_hyperparameters({"cfg": plan.as_dict()})  # plain data: checkpoints load with weights_only=True
        self.plan = plan
        self.model = build_model(plan.model, seed=plan.seed)
        spec = plan.model
        self.objective = OBJECTIVE.get(spec.name)(spec.vocab_size)
        self.step_fn = self.objective.loss
        self.tokenizer_state: dict[str, Any] = {}  # set by the run before fit
        self.data_fingerprint: dict[str, str] | None = None  # likewise: what it trains on (zoo.training.data)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The tokenizer travels with the weights, as plain data, so a checkpoint can sample on its own;
        # the random state too, so a resumed run draws the same dropout masks as an uninterrupted one.
        checkpoint["tokenizer"] = self.tokenizer_state
        checkpoint["data_fingerprint"] = self.data_fingerprint  # a resume on other data is refused
        checkpoint["rng_state"] = torch.get_rng_state()
        checkpoint["precision"] = self.trainer.precision  # as run (auto resolved): a resume keeps it

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed_rng_state = checkpoint.get("rng_state")

    def on_train_batch_start(self, batch: dict[str, Any], batch_idx: int) -> None:
        state = getattr(self, "_resumed_rng_state", None)
        if state is not None:  # the first step after a resume
            # Restored here, not on load: Lightning draws random numbers in between.
            torch.set_rng_state(state)
            self._resumed_rng_state = None
            # Lightning's logging step can be off by one after a resume; with one optimizer it equals
            # the optimizer step, so metrics.csv rows line up with an uninterrupted run's.
            self.trainer.fit_loop.epoch_loop._batches_that_stepped = self.trainer.global_step

    def setup(self, stage: str) -> None:
        if self.plan.compile and not hasattr(self, "_compiled"):
            self._compiled = torch.compile(self.model)
            self.step_fn = lambda model, batch: self.objective.loss(self._compiled, batch)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        clear_aux_losses(self.model)  # only this forward's auxiliary losses are added (zoo.component)
        loss, logs = self.step_fn(self.model, batch)
        aux = aux_losses(self.model)
        # train_loss is the objective's loss alone, comparable across variants and with val_loss;
        # the optimiser minimises it plus the auxiliary losses (e.g. ffn=moe's), each logged on its own.
        self.log("train_loss", loss, prog_bar=True)
        for k, v in {**logs, **aux}.items():
            self.log(f"train_{k}", v)
        return loss + sum(aux.values())

    def on_fit_start(self) -> None:
        if self.trainer.ckpt_path is None:  # a fresh run starts where every step leaves the model (a resumed one is)
            after_step(self.model)  # Placement.after_step: nGPT's unit matrices, not applied by init_weights

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        after_step(self.model)  # each placement's hook after every step (Placement.after_step: nGPT's unit matrices)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss, logs = self.objective.loss(self.model, batch)
        self.log("val_loss", loss, prog_bar=True)
        for k, v in logs.items():
            self.log(f"val_{k}", v)

    def on_validation_epoch_end(self) -> None:
        data: Any = getattr(self.trainer, "datamodule", None)  # set by fit and validate
        if data is not None and data.long_val_batches:  # data.long_context: does the model extrapolate?
            with torch.no_grad():
                losses = [self.objective.loss(self.model, self.transfer_batch_to_device(b, self.device, 0))[0]
                          for b in data.long_val_batches]
            self.log("val_loss_long", torch.stack(losses).mean())
        if data is not None and data.is_task and isinstance(self.plan.data, TaskOptions):
            n = self.plan.data.eval_examples
            for split, key in (("val", "exact_match"), ("test", "exact_match_long")):
                self.log(key, self.objective.exact_match(self.model, data.splits[split][:n]), prog_bar=True)

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """trainer.gradient_clip_val where Lightning's own clipping refuses:
        - a fused AdamW (trainer=gpu's default) under mixed precision: Lightning leaves its gradients scaled for
          its step() to unscale. bf16 has no scaler, so they are true gradients; float16's scaler unscales them
          here first (its step then knows). Then they are clipped as every other run clips them.
        - FSDP (trainer=fsdp): each rank holds a shard of the gradients, so the norm is the root module's
          clip_grad_norm_, over every shard (torch.nn.utils' would see one)."""
        root: Any = self.trainer.strategy.model
        fsdp = hasattr(root, "clip_grad_norm_") and gradient_clip_algorithm in (None, "norm")
        fused = getattr(optimizer, "_step_supports_amp_scaling", False)
        if not gradient_clip_val or not (fsdp or fused):
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        plugin: Any = self.trainer.precision_plugin
        if fused and getattr(plugin, "scaler", None) is not None:
            plugin.scaler.unscale_(optimizer)
        if fsdp:
            root.clip_grad_norm_(gradient_clip_val)
        else:
            # Lightning passes the Trainer's algorithm, None unless set: the base class would then clip nothing
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)

    def configure_optimizers(self) -> dict[str, Any]:
        optim = self.plan.optim  # a Part: the optimizer's name and options (zoo/optim/)
        opt = optim.options
        placement = spec_of(self.model).norm.placement
        if opt.weight_decay and not declared(RESIDUAL.get(placement), "weight_decay"):  # Placement.weight_decay
            rank_zero_info(f"optim.weight_decay: {opt.weight_decay} -> 0: placement '{placement}' renormalises the "
                           "matrices after every step itself")
            opt = replace(opt, weight_decay=0.0)
        optimizer = OPTIM.get(optim.name).build(self.model, opt, next(self.model.parameters()).device,
                                                self.trainer.precision)
        # One schedule for every parameter group (optim=muon: Muon's and AdamW's), each from its own peak.
        # With trainer.max_time, Lightning's Timer (which a resume restores): the decay follows the clock too
        timer = next((c for c in self.trainer.callbacks if isinstance(c, Timer)), None)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(
            opt.warmup_steps, self.plan.trainer.max_steps, opt.min_lr / opt.lr,
            (lambda: time_spent(timer)) if timer is not None else lambda: 0.0))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def time_spent(timer: Timer) -> float:
    """The share of its time budget (trainer.max_time) the run has trained for; 0 without one."""
    left = timer.time_remaining()
    if left is None:
        return 0.0
    spent = timer.time_elapsed()
    return min(1.0, spent / (spent + left)) if spent + left > 0 else 1.0


def lr_lambda(warmup: int, total: int, min_ratio: float,
              time_spent: Callable[[], float] = lambda: 0.0) -> Callable[[int], float]:
    """Linear warm-up to the peak, then cosine decay to min_ratio * peak at `total` steps, or sooner by the clock:
    the decay's progress is the larger of the steps' share and time_spent() (the share of a time budget used)."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, max((step - warmup) / max(1, total - warmup), time_spent()))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor
