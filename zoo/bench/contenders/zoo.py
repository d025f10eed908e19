"""zoo itself: the GPT-2-style and Llama-style configs every section builds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import zoo
from zoo.bench.contenders.base import lm_loss
from zoo.bench.settings import Settings, Shape
from zoo.kernels import apply_kernels

if TYPE_CHECKING:
    from torch import nn


def zoo_config(shape: Shape, family: str, max_seq_len: int | None = None) -> dict:
    base = dict(name="decoder_only", vocab_size=shape.vocab, d_model=shape.d_model, n_layers=shape.n_layers,
                n_heads=shape.n_heads, max_seq_len=max_seq_len or shape.context, dropout=0.0)
    if family == "gpt2":  # learned positions, pre-LN LayerNorm, GELU, MHA, biases, tied head
        return base
    return {**base, "bias": False, "tie_embeddings": False,  # Llama: RoPE, pre-RMSNorm, SwiGLU, GQA
            "attention": {"name": "gqa", "n_kv_heads": shape.n_kv_heads}, "position": {"name": "rope"},
            "norm": {"type": "rmsnorm"}, "ffn": {"name": "swiglu"}}


def zoo_model(cfg: dict) -> nn.Module:
    """zoo's model as train.py runs it: built, then zoo.kernels' pass with its default policy (auto)."""
    model = zoo.build_model(cfg)
    apply_kernels(model, "auto")
    return model


def build_zoo(shape: Shape, family: str, s: Settings):
    model = zoo_model(zoo_config(shape, family))
    return model, lambda m, x, y: lm_loss(m(x), y)
