"""The norm section: LayerNorm against RMSNorm, one layer forward + backward."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from zoo.bench.markdown import ms, ratio, table
from zoo.bench.registry import section
from zoo.bench.session import Session
from zoo.bench.settings import SHAPES
from zoo.bench.timing import interleave
from zoo.component import Context
from zoo.kernels import apply_kernels
from zoo.registry import NORM

NORM_REPS = 50  # forward + backward passes per timed call: one pass is well under a millisecond


def _norm_step(norm: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor) -> None:
    for _ in range(NORM_REPS):
        norm(x).backward(grad)


RMS_IMPLEMENTATION = {  # zoo's float32 CPU RMSNorm, by the kernel zoo.kernels applied to it here
    "rmsnorm_cpp": "its own torch op (kernel `rmsnorm_cpp`, `zoo/kernels/rmsnorm.cpp`: one fused kernel forward, "
                   "one backward)",
    "rmsnorm_cpu": "the kernel `rmsnorm_cpu`, where zoo/kernels/rmsnorm.cpp cannot be built (torch ops forward, "
                   "LayerNorm's backward kernel plus a correction)"}


@section("norm")
def section_norm(sess: Session) -> str:
    """zoo's LayerNorm and RMSNorm alone, forward + backward on (batch x context, d_model) activations of each
    shape, interleaved: the speed half of Zhang and Sennrich's finding, without the rest of the model around it."""
    s, rows = sess.settings, []
    for shape_name in s.shapes:
        shape = SHAPES[shape_name]
        x = torch.randn(shape.batch * shape.context, shape.d_model, requires_grad=True)
        grad = torch.randn_like(x)
        ctx = Context(d_model=shape.d_model, n_heads=shape.n_heads, max_seq_len=shape.context)
        norms = {name: NORM.get(name)(ctx, NORM.options(name)()) for name in ("layernorm", "rmsnorm")}
        rms_kernel = apply_kernels(norms["rmsnorm"], "auto")
        fns = {name: partial(_norm_step, norm, x, grad) for name, norm in norms.items()}
        fns["composite"] = partial(_norm_step, partial(F.rms_norm, normalized_shape=(shape.d_model,),
                                                       weight=nn.Parameter(torch.ones(shape.d_model)), eps=1e-5),
                                   x, grad)
        stats = interleave(fns, replace(s, target_s=s.target_s / 4))
        ln, rms, comp = (stats[k].median / NORM_REPS for k in ("layernorm", "rmsnorm", "composite"))
        rows.append([shape_name, f"{shape.batch * shape.context} x {shape.d_model}", ms(ln), ms(rms), ratio(ln / rms),
                     ms(comp), ratio(ln / comp)])
    return "\n".join(["## LayerNorm against RMSNorm", "",
                      f"One norm layer, forward + backward, float32, interleaved, {NORM_REPS} passes per timed "
                      "call, ms per pass; `LN / RMS` above 1 means RMSNorm is faster. zoo's RMSNorm on CPU is "
                      f"{RMS_IMPLEMENTATION.get(next(iter(rms_kernel), ''), 'its formula (no kernel applied)')}; "
                      "`composite` is `F.rms_norm`, which torch differentiates op by op on CPU.",
                      "", table(["shape", "activations", "LayerNorm ms", "RMSNorm ms", "LN / RMS", "composite ms",
                                 "LN / composite"], rows), ""])
