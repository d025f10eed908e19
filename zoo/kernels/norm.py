"""RMSNorm's kernels on CPU, float32, eager (compiled, inductor fuses the formula itself): torch has no fused
RMSNorm there, and autograd of the formula costs several times LayerNorm's (docs/benchmarks.md, "LayerNorm
against RMSNorm").

- rmsnorm_cpp: zoo/kernels/rmsnorm.cpp, one fused kernel each way, as LayerNorm has.
- rmsnorm_cpu: torch ops only, where rmsnorm_cpp cannot be built: one reduction and one scaling pass forward;
  backward, LayerNorm's own kernel, given a mean of zero, computes RMSNorm's gradients but for the centring term,
  -rstd * mean(g * w), which one matrix-vector product adds back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from zoo.kernels.apply import Kernel, register
from zoo.layers.norm import RMSNorm

# A kernel's methods go in front of the class it serves (apply.py); to the type checker they are that class's.
if TYPE_CHECKING:
    _Served = RMSNorm
else:
    _Served = object


def _applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and not torch.compiler.is_compiling()


class CppRMSNorm(_Served):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _applies(x, self.weight):
            return torch.ops.zoo.rms_norm(x, self.weight, self.eps)
        return super().forward(x)


class TorchRMSNorm(_Served):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _applies(x, self.weight):
            return _CpuRMSNorm.apply(x, self.weight, self.eps)
        return super().forward(x)


class _CpuRMSNorm(torch.autograd.Function):
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


WHEN = "float32 input and gain on CPU, eager (compiled: inductor fuses the formula)"
FLOAT32 = frozenset({torch.float32})
register(Kernel("rmsnorm_cpp", RMSNorm, CppRMSNorm, WHEN, FLOAT32, {torch.float32: 1e-5}, source="rmsnorm"))
register(Kernel("rmsnorm_cpu", RMSNorm, TorchRMSNorm, WHEN, FLOAT32, {torch.float32: 1e-5},
                fallback_for="rmsnorm_cpp"))
