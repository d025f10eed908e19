"""The profile section: where zoo's training step spends its time (torch.profiler, operators in groups), float32 and
bf16, and bf16 compiled."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from torch.profiler import ProfilerActivity, profile

from zoo.bench.contenders import FAMILY_LABELS
from zoo.bench.markdown import ms, table
from zoo.bench.registry import section
from zoo.bench.session import Session, Variant, make_train_run
from zoo.bench.settings import SHAPES

# Where a training step's time goes: torch.profiler's self CPU time per operator, in groups. Checked in order: the
# first pattern that an operator's name contains decides its group.
# compiled: a graph's own time is the C++ kernels inductor wrote for it (elementwise work, casts, norms and softmaxes
# it fused); profile_groups sums a model's graphs, each named by a hash, under this one name
COMPILED_GRAPHS = "inductor's kernels (compiled graphs)"
PROFILE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("inductor's kernels", (COMPILED_GRAPHS,)),
    ("attention", ("attention", "softmax", "masked_fill", "tril", "triu", "baddbmm")),
    ("norm", ("norm", "rsqrt", "var_mean")),
    ("optimizer", ("adam", "_foreach", "lerp", "sqrt", "addcdiv", "addcmul", "zero_")),
    ("matmul", ("mm", "linear", "matmul", "addmm", "bmm")),
    ("casts and copies", ("_to_copy", "copy_", "to", "clone", "contiguous", "empty_like", "cat")),
    ("loss", ("cross_entropy", "nll_loss", "log_softmax")),
    ("activation and elementwise", ("gelu", "silu", "relu", "mul", "add", "div", "sub", "neg", "tanh", "where",
                                   "sum", "mean", "pow", "embedding", "dropout", "sigmoid", "exp")),
)


def profile_groups(step: Callable[[], object], steps: int) -> tuple[dict[str, float], list[tuple[str, float]], float]:
    """Shares of self CPU time by group, the top operators, and the profiled step time (profiling adds overhead)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - t0) / steps
    ops: dict[str, float] = {}
    for e in prof.key_averages():
        key = COMPILED_GRAPHS if "CompiledFxGraph" in e.key else e.key
        ops[key] = ops.get(key, 0.0) + e.self_cpu_time_total
    ops = [(k, t) for k, t in ops.items() if t > 0]
    total = sum(t for _, t in ops) or 1.0
    shares: dict[str, float] = {name: 0.0 for name, _ in PROFILE_GROUPS} | {"other": 0.0}
    for key, t in ops:
        name = key.removeprefix("aten::").lower()
        group = next((g for g, pats in PROFILE_GROUPS if any(p in name for p in pats)), "other")
        shares[group] += t / total
    top = sorted(((k, t / total) for k, t in ops), key=lambda kt: -kt[1])[:6]
    return shares, top, wall


@section("profile")
def section_profile(sess: Session) -> str:
    """Each family's training step in float32 and bf16 (eager) and bf16 compiled, profiled: the share of each
    group of operators."""
    s = sess.settings
    groups = [name for name, _ in PROFILE_GROUPS] + ["other"]
    rows, tops = [], []
    for shape_name in s.shapes:
        shape = SHAPES[shape_name]
        for family in ("gpt2", "llama"):
            for bf16, compiled in ((False, False), (True, False), (True, True)):
                v = Variant("zoo", family, bf16=bf16, compile=compiled)
                run = make_train_run(shape, v, s)
                for _ in range(s.warmup):
                    run.step()
                shares, top, wall = profile_groups(run.step, 1 if s.quick else 5)
                rows.append([shape.name, FAMILY_LABELS[family], v.mode, ms(wall),
                             *(f"{100 * shares[g]:.0f}%" for g in groups)])
                tops.append(f"- {shape.name}, {FAMILY_LABELS[family]}, {v.mode}: " + ", ".join(
                    f"`{k.removeprefix('aten::')}` {100 * t:.0f}%" for k, t in top))
                del run
                gc.collect()
    return "\n".join([
        "## Where the step time goes", "",
        "zoo's training step (forward, backward, AdamW; the train section's models and batches) under "
        "`torch.profiler`, 5 steps after warm-up: each operator's self CPU time, summed by group, as a share of "
        "all operators' time. Groups by the operator's name (`zoo.bench.sections.profile.PROFILE_GROUPS`): "
        "`inductor's kernels` "
        "is a compiled graph's own C++ kernels (the elementwise work, casts, norms and softmaxes it fused), "
        "`attention` the fused sdpa kernels or the explicit path's softmax and masking, `matmul` every other "
        "matrix product (projections, FFN, head), `casts and copies` autocast's conversions and layout copies. "
        "The profiler adds overhead per operator, so `profiled ms` is above the train section's step time.", "",
        table(["shape", "family", "mode", "profiled ms", *groups], rows), "",
        "Top operators by self CPU time:", "", *tops, ""])
