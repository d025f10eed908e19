"""Normalisation layers, built as `norm(ctx, opts, dim=None)`: dim defaults to d_model (a norm
over each head's queries and keys passes the head size)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo import native
from zoo.component import Context, Options, need
from zoo.registry import NORM


@dataclass(kw_only=True)
class NormOptions(Options):
    eps: float = 1e-5  # added to the variance (or mean square) before the square root


def _check(opts: NormOptions) -> None:
    need(opts.eps > 0, "norm.eps", f"must be positive, got {opts.eps!r}; valid: a finite number > 0")


@NORM.register("layernorm", options=NormOptions)
class LayerNorm(nn.LayerNorm):
    """LayerNorm (Ba et al. 2016): centre, scale to unit variance, then gain and optional bias."""

    count_as, gains = "norm", ("weight",)

    def __init__(self, ctx: Context, opts: NormOptions, dim: int | None = None):
        _check(opts)
        super().__init__(dim or ctx.d_model, eps=opts.eps, bias=ctx.bias)


@NORM.register("rmsnorm", options=NormOptions)
class RMSNorm(nn.Module):
    """RMSNorm (Zhang and Sennrich 2019): x / rms(x) * gain. No centring and no bias."""

    count_as, gains = "norm", ("weight",)

    def __init__(self, ctx: Context, opts: NormOptions, dim: int | None = None):
        super().__init__()
        _check(opts)
        self.eps = opts.eps
        self.weight = nn.Parameter(torch.ones(dim or ctx.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and x.dtype == self.weight.dtype == torch.float32 \
                and not torch.compiler.is_compiling():  # compiled, inductor fuses the formula below itself
            if native.load("rmsnorm"):  # zoo/layers/rmsnorm.cpp: one fused kernel each way, as LayerNorm has
                return torch.ops.zoo.rms_norm(x, self.weight, self.eps)
            return _CpuRMSNorm.apply(x, self.weight, self.eps)
        # Normalise in float32 so bf16 activations keep their precision, as Llama does.
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight


class _CpuRMSNorm(torch.autograd.Function):
    """RMSNorm for float32 on CPU where zoo/layers/rmsnorm.cpp cannot be built (zoo.native): torch has no fused
    kernel, and F.rms_norm's autograd of the composite formula costs several times LayerNorm's time, this path far less
    (docs/benchmarks.md: "LayerNorm against RMSNorm", and "zoo's CPU kernels (AMX)"). Forward: one reduction
    (vector_norm) and one scaling pass. Backward: LayerNorm's own kernel, given a mean of zero, computes
    RMSNorm's gradients but for the centring term, -rstd * mean(g * w), which one matrix-vector product adds
    back."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        d = x.shape[-1]
        rstd = torch.rsqrt(torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(d).add_(eps))
        ctx.save_for_backward(x, weight, rstd)
        return (x * rstd).mul_(weight)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        d, grad = x.shape[-1], grad.contiguous()
        dx, dw, _ = torch.ops.aten.native_layer_norm_backward(
            grad, x.contiguous(), [d], torch.zeros_like(rstd), rstd, weight, None,
            [ctx.needs_input_grad[0], ctx.needs_input_grad[1], False])
        if dx is not None:
            dx.add_(torch.matmul(grad, weight).unsqueeze(-1).mul_(rstd), alpha=1.0 / d)
        return dx, dw, None
