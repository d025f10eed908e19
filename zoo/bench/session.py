"""A training step of any contender (`make_train_run`), and the session that times groups of them and keeps what
it measured, so later sections reuse earlier ones' steps."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from zoo.bench.contenders import BUILDERS, NotInstalled
from zoo.bench.settings import Settings, Shape
from zoo.bench.timing import Stats, interleave, matmul_peak, time_call
from zoo.hardware import adamw_implementation


@dataclass(frozen=True)
class Variant:
    peer: str
    family: str
    bf16: bool = False
    compile: bool = False

    @property
    def key(self) -> str:
        return "-".join([self.peer, self.family, *(["compile"] if self.compile else []),
                         *(["bf16"] if self.bf16 else [])])

    @property
    def mode(self) -> str:
        return {(False, False): "fp32 eager", (False, True): "bf16 eager", (True, False): "fp32 compile",
                (True, True): "bf16 compile"}[(self.compile, self.bf16)]

    @classmethod
    def parse(cls, key: str) -> Variant:
        parts = key.split("-")
        return cls(parts[0], parts[1], bf16="bf16" in parts[2:], compile="compile" in parts[2:])


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def batch(shape: Shape, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, shape.vocab, (shape.batch, shape.context + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


@dataclass
class TrainRun:
    variant: Variant
    params: int
    step: Callable[[], float]


def make_train_run(shape: Shape, v: Variant, s: Settings) -> TrainRun:
    """A model, AdamW and one fixed batch; `step()` runs forward + backward + optimizer step."""
    model, loss_of = BUILDERS[v.peer](shape, v.family, s)
    model.to(s.device).train()
    params = n_params(model)
    # AdamW as train.py takes it with optim.fused=null, for every contender: fused on a GPU, and on CPU in bf16
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **adamw_implementation(
        None, torch.device(s.device), "bf16-mixed" if v.bf16 else "32-true"))
    run_model = torch.compile(model) if v.compile else model
    x, y = (t.to(s.device) for t in batch(shape))
    amp = (lambda: torch.autocast(torch.device(s.device).type, dtype=torch.bfloat16)) if v.bf16 \
        else contextlib.nullcontext

    def step() -> float:
        with amp():
            loss = loss_of(run_model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return TrainRun(v, params, step)


@dataclass
class Session:
    """Settings plus the measurements taken so far, so later sections can reuse earlier ones."""

    settings: Settings
    train: dict[tuple[str, str], Stats] = field(default_factory=dict)  # (shape, variant key) -> Stats
    params: dict[tuple[str, str], int] = field(default_factory=dict)
    compile_s: dict[tuple[str, str], float] = field(default_factory=dict)
    missing: dict[tuple[str, str], str] = field(default_factory=dict)  # why a contender did not run
    peak: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})  # bf16 -> FLOP/s samples
    mfu: list[dict] = field(default_factory=list)  # the mfu section's rows as numbers (scripts/gpu_check.py)

    def sample_peak(self, repeats: int = 3) -> None:
        """Matmul FLOP/s now, float32 and bf16. Taken around every timed group, so the run-wide best is
        the machine's peak even if another process was using the cores during part of the run."""
        n, device = self.settings.matmul_n, self.settings.device
        self.peak[False].append(matmul_peak(torch.float32, n, repeats, device))
        self.peak[True].append(matmul_peak(torch.bfloat16, n, repeats, device))


def measure_group(sess: Session, shape: Shape, variants: Sequence[Variant]) -> None:
    """Build every variant that can be built, then time them interleaved; results go into sess."""
    runs: dict[str, TrainRun] = {}
    for v in variants:
        if v.peer not in sess.settings.peers:
            sess.missing[(shape.name, v.key)] = "not selected (--peers)"
            continue
        try:
            runs[v.key] = make_train_run(shape, v, sess.settings)
            sess.params[(shape.name, v.key)] = runs[v.key].params
        except NotInstalled as e:
            sess.missing[(shape.name, v.key)] = str(e)
    first: dict[str, float] = {}
    ok: dict[str, Callable[[], object]] = {}
    for key, run in runs.items():  # a compile that fails is reported, not fatal
        try:
            first[key] = time_call(run.step)
            ok[key] = run.step
        except Exception as e:
            sess.missing[(shape.name, key)] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    sess.sample_peak()
    stats = interleave(ok, sess.settings)
    sess.sample_peak()
    for key, st in stats.items():
        sess.train[(shape.name, key)] = st
        if Variant.parse(key).compile:
            sess.compile_s[(shape.name, key)] = max(0.0, first[key] - st.median)
