"""Attention's kernels for low-precision training on CPU.

- attention_softmax_cpp: the written-out form's softmax for bf16 scores in one pass each way
  (zoo/kernels/softmax.cpp; six torch passes otherwise: scale, mask, softmax, the casts to and from float32),
  causal or unmasked, computed in float32 and rounded once.
- attention_written_out: bf16/fp16 training on CPU takes the written-out form (`attention.backend=math`'s)
  instead of PyTorch's fused kernel (F.scaled_dot_product_attention) at key lengths where the fused kernel's
  backward is the slower, by this CPU's kind.

The key lengths are the measured rules of docs/benchmarks.md's "Hardware choices (<CPU kind>)" sections
(`python -m zoo.bench --only choices` writes one per CPU kind); a rule changes with its rows.
"""

from __future__ import annotations

import math
from functools import cache
from typing import TYPE_CHECKING

import torch

from zoo.hardware import cpu_kind
from zoo.kernels.apply import Kernel, register
from zoo.layers.attention import AttentionBase

# A kernel's methods go in front of the class it serves (apply.py); to the type checker they are that class's.
if TYPE_CHECKING:
    _Served = AttentionBase
else:
    _Served = object

# cpu_kind -> the shortest key length from which the fused kernel's backward is faster than the written-out form
# (absent: never), with the written-out form's softmax in torch ops, or on attention_softmax_cpp
FUSED_FROM = {"amx": 256}
FUSED_FROM_SOFTMAX_KERNEL = {"amx": 768}
# cpu_kind -> the shortest key length from which compiled models take attention_softmax_cpp over inductor's own
# fusion of the torch ops (absent: never)
COMPILED_SOFTMAX_KERNEL_FROM = {"amx": 192}

# This CPU's, read once, here, so torch.compile sees constants (the benchmark sets them to time each path)
FUSED_BACKWARD_FROM = FUSED_FROM.get(cpu_kind())
FUSED_BACKWARD_FROM_SOFTMAX_KERNEL = FUSED_FROM_SOFTMAX_KERNEL.get(cpu_kind())
COMPILED_SOFTMAX_FROM = COMPILED_SOFTMAX_KERNEL_FROM.get(cpu_kind())


def softmax_kernel_applies(scores: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """bf16 scores on CPU, causal or unmasked; under torch.compile from COMPILED_SOFTMAX_FROM keys (below,
    inductor's fusion of the torch ops is as fast or faster)."""
    if mask is not None or scores.dtype != torch.bfloat16 or scores.device.type != "cpu":
        return False
    t_k = scores.shape[-1]
    return not torch.compiler.is_compiling() or (COMPILED_SOFTMAX_FROM is not None and t_k >= COMPILED_SOFTMAX_FROM)


class CppAttentionSoftmax(_Served):
    def _softmax(self, scores, mask, is_causal, qk_dim: int) -> torch.Tensor:
        if softmax_kernel_applies(scores, mask):
            return attention_softmax(scores, 1 / math.sqrt(qk_dim), is_causal)
        return super()._softmax(scores, mask, is_causal, qk_dim)


class WrittenOutAttention(_Served):
    def _attend(self, q, k, v, mask, is_causal, qk_dim: int | None = None) -> torch.Tensor:
        if not self.record and written_out_is_faster(q, k.shape[2], mask, isinstance(self, CppAttentionSoftmax)):
            return self._written_out(q, k, v, mask, is_causal, qk_dim)
        return super()._attend(q, k, v, mask, is_causal, qk_dim)


def written_out_is_faster(q: torch.Tensor, t_k: int, mask: torch.Tensor | None, softmax_kernel: bool) -> bool:
    """Low-precision training on CPU (bf16/fp16 queries that need gradients) at key lengths below this CPU's
    rule (every length where it has none). softmax_kernel: the module's softmax is attention_softmax_cpp, which
    applies to bf16 scores without a mask (then its own rule)."""
    if q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16) or not q.requires_grad:
        return False
    on_kernel = softmax_kernel and q.dtype == torch.bfloat16 and mask is None
    start = FUSED_BACKWARD_FROM_SOFTMAX_KERNEL if on_kernel else FUSED_BACKWARD_FROM
    return start is None or t_k < start


@cache
def _register_softmax_shapes() -> None:
    """The shapes of softmax.cpp's ops, which torch.compile traces them by (once the ops are loaded)."""
    torch.library.register_fake("zoo::attention_softmax", lambda scores, scale, causal: (
        torch.empty_like(scores), scores.new_empty((*scores.shape[:-1], 2), dtype=torch.float32)))
    torch.library.register_fake("zoo::attention_softmax_backward",
                                lambda grad, scores, stats, scale, causal: torch.empty_like(scores))


class _AttentionSoftmax(torch.autograd.Function):
    """softmax.cpp's two ops as one differentiable function, in eager mode and in compiled graphs (a plain
    autograd.Function: torch.library.register_autograd's wrapper made a small model's step slower)."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
        p, stats = torch.ops.zoo.attention_softmax(scores, scale, causal)
        ctx.save_for_backward(scores, stats)
        ctx.scale, ctx.causal = scale, causal
        return p

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if torch.is_grad_enabled():  # create_graph=True: the kernel would record nothing to differentiate
            raise RuntimeError("zoo::attention_softmax has no second derivative; kernels=none uses torch's formula, "
                               "which has")
        scores, stats = ctx.saved_tensors
        return torch.ops.zoo.attention_softmax_backward(grad, scores, stats, ctx.scale, ctx.causal), None, None


def attention_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """softmax(scores * scale) over keys for bf16 CPU scores (..., Tq, Tk), causal: queries are the last of the
    keys; by zoo/kernels/softmax.cpp (differentiable once). The kernel must be loaded
    (KERNELS.get('attention_softmax_cpp').load())."""
    return _AttentionSoftmax.apply(scores.contiguous(), scale, causal)


register(Kernel("attention_softmax_cpp", AttentionBase, CppAttentionSoftmax,
                "the written-out form's softmax (attention.backend=math, or attention_written_out's choice) for "
                "bf16 scores on CPU, causal or unmasked; compiled, from a key length by the CPU's kind "
                "(COMPILED_SOFTMAX_KERNEL_FROM)", frozenset({torch.bfloat16}), {torch.bfloat16: 2 ** -5},
                source="softmax", setup=_register_softmax_shapes))
register(Kernel("attention_written_out", AttentionBase, WrittenOutAttention,
                "bf16 or fp16 training on CPU with attention.backend=sdpa: the written-out form below a key length "
                "by the CPU's kind (FUSED_FROM; every length where it has none), the fused kernel from there",
                frozenset({torch.bfloat16, torch.float16}), {torch.bfloat16: 2 ** -5, torch.float16: 2 ** -8},
                accepts=lambda module: module.backend == "sdpa"))
