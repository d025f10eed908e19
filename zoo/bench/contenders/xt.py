"""x-transformers: its `Decoder` in a `TransformerWrapper`, set up as each family."""

from __future__ import annotations

import torch

from zoo.bench.contenders.base import lm_loss, require
from zoo.bench.settings import Settings, Shape
from zoo.layers.ffn import default_d_ff


def build_xt(shape: Shape, family: str, s: Settings):
    xt = require("x_transformers")
    torch.manual_seed(0)
    head_dim = shape.d_model // shape.n_heads
    if family == "gpt2":  # x-transformers has no biases in attention and LayerNorm: a few params fewer
        layers = xt.Decoder(dim=shape.d_model, depth=shape.n_layers, heads=shape.n_heads, attn_dim_head=head_dim,
                            attn_flash=True, ff_mult=4)
        model = xt.TransformerWrapper(num_tokens=shape.vocab, max_seq_len=shape.context, attn_layers=layers,
                                      tie_embedding=True)
    else:
        d_ff = default_d_ff(shape.d_model, gated=True)
        layers = xt.Decoder(dim=shape.d_model, depth=shape.n_layers, heads=shape.n_heads, attn_dim_head=head_dim,
                            attn_flash=True, rotary_pos_emb=True, use_rmsnorm=True, ff_glu=True, ff_swish=True,
                            ff_no_bias=True, attn_kv_heads=shape.n_kv_heads, ff_mult=(d_ff + 0.5) / shape.d_model)
        model = xt.TransformerWrapper(num_tokens=shape.vocab, max_seq_len=shape.context, attn_layers=layers,
                                      use_abs_pos_emb=False, tie_embedding=False)
    return model, lambda m, x, y: lm_loss(m(x), y)
