"""RoPE's rotation on CPU: zoo/kernels/rope.cpp, one pass each way, computed in float32 whatever the dtype of the
queries and keys (rounded once), eager. Written as torch ops, the rotation is eleven small kernels and a cast of
the table each way, per layer (docs/benchmarks.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from zoo.kernels.apply import Kernel, register
from zoo.layers.position import RotaryPosition

# A kernel's methods go in front of the class it serves (apply.py); to the type checker they are that class's.
if TYPE_CHECKING:
    _Served = RotaryPosition
else:
    _Served = object


class CppRotary(_Served):
    def rotate_all(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0):  # partial rotary: rotate splits
        if q.device.type == "cpu" and q.dtype != torch.float64 and not torch.compiler.is_compiling():
            cos, sin = self.angles(offset, *q.shape[-2:]).float().unbind(1)
            return torch.ops.zoo.rope(q, cos, sin), torch.ops.zoo.rope(k, cos, sin)
        return super().rotate_all(q, k, offset)


# float32: the formula's operations in its order, the same bits; bf16/fp16: computed in float32 and rounded once,
# closer to the exact rotation than the formula, which rounds the table and each product
register(Kernel("rope_cpp", RotaryPosition, CppRotary, "float32, bf16 or fp16 queries and keys on CPU, eager",
                frozenset({torch.float32, torch.bfloat16, torch.float16}),
                {torch.float32: 1e-6, torch.bfloat16: 2 ** -5, torch.float16: 2 ** -8}, source="rope"))
