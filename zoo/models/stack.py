"""A stack of blocks with its embeddings: the encoder or decoder every lineage is made of."""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from zoo.block import TransformerBlock
from zoo.layers.attention import KVCache, attention_bias, cross_attention_mask
from zoo.registry import ATTENTION, FFN, NORM, POSITION, RESIDUAL

Cache = list[tuple[KVCache, KVCache]]  # per layer: (self-attention, cross-attention)


def make_norm_factory(cfg: dict):
    norm = cfg["norm"]
    return partial(NORM.get(norm["type"]), cfg["d_model"], norm["eps"], cfg["bias"])


class Stack(nn.Module):
    """Token embedding -> positions -> n_layers blocks -> final norm (where the placement needs one).

    causal=True makes it a decoder (each token sees only earlier ones); cross=True adds
    cross-attention to an encoder's output."""

    def __init__(self, cfg: dict, embed: nn.Embedding, n_layers: int, causal: bool, cross: bool = False):
        super().__init__()
        d, heads, att, pos = cfg["d_model"], cfg["n_heads"], cfg["attention"], cfg["position"]
        self.embed, self.causal, self.window = embed, causal, att.get("window")
        self.embed_scale = math.sqrt(d) if cfg["scale_embeddings"] else 1.0
        pos_opts = {k: v for k, v in pos.items() if k != "name"}
        self.position = POSITION.get(pos["name"])(d, heads, cfg["max_seq_len"], **pos_opts)
        make_norm = make_norm_factory(cfg)
        self.embed_norm = make_norm() if cfg["embed_norm"] else nn.Identity()
        self.dropout = nn.Dropout(cfg["dropout"])
        attn_opts = {k: v for k, v in att.items() if k not in ("name", "window")}
        make_attention = partial(ATTENTION.get(att["name"]), d, heads, bias=cfg["bias"],
                                 dropout=cfg["dropout"], **attn_opts)
        ffn = cfg["ffn"]
        make_ffn = partial(FFN.get(ffn["name"]), d, ffn.get("d_ff"), cfg["bias"], cfg["dropout"])
        residual = RESIDUAL.get(cfg["norm"]["placement"])
        self.blocks = nn.ModuleList(
            TransformerBlock(make_attention, make_ffn, make_norm, residual, cross) for _ in range(n_layers)
        )
        final = cfg.get("final_norm")  # None: the placement decides (Post-LN has none; nn.Transformer adds one)
        self.final_norm = make_norm() if (residual.final_norm if final is None else final) else nn.Identity()

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor | None = None,
                memory: torch.Tensor | None = None, memory_padding: torch.Tensor | None = None,
                cache: Cache | None = None) -> torch.Tensor:
        """tokens (B, T) -> hidden states (B, T, d). padding: (B, T) True for real tokens."""
        offset = cache[0][0].len if cache else 0
        x = self.embed(tokens) * self.embed_scale
        x = self.dropout(self.embed_norm(self.position.embed(x, offset)))
        t = tokens.shape[1]
        mask, is_causal = attention_bias(t, offset + t, self.causal, self.window, self.position,
                                         padding, x.device, x.dtype)
        memory_mask = cross_attention_mask(memory_padding)
        for i, block in enumerate(self.blocks):
            x = block(x, self.position, mask, is_causal, memory, memory_mask,
                      cache[i] if cache else None, offset)
        return self.final_norm(x)

    def new_cache(self) -> Cache:
        return [(KVCache(), KVCache()) for _ in self.blocks]
