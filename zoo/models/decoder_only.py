"""Decoder-only language model (GPT, Llama): a causal stack and a next-token head."""

from __future__ import annotations

import torch
from torch import nn

from zoo.models.stack import Cache, Stack, context
from zoo.models.vocab import output_head, token_embedding
from zoo.registry import MODEL
from zoo.schema import ModelSpec


@MODEL.register("decoder_only")
class DecoderOnly(nn.Module):
    generates = True  # sample.py and zoo.generate continue a prompt token by token
    needs_source = False
    next_token_lm = True  # a per-token next-token loss (perplexity, bits per character) on running text
    stacks = ("decoder",)

    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.cfg = cfg
        self.embed = token_embedding(cfg)
        self.decoder = Stack(cfg, context(cfg, cfg.n_layers, causal=True), self.embed, cfg.n_layers)
        self.head = output_head(cfg, cfg.d_model, False, self.embed)

    def forward(self, tokens: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        """tokens (B, T) -> next-token logits (B, T, vocab)."""
        return self.head(self.decoder(tokens, cache=cache))

    def new_cache(self) -> Cache:
        return self.decoder.new_cache()
