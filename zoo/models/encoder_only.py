"""Encoder-only masked language model (BERT): a bidirectional stack and an MLM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.stack import Stack, context
from zoo.models.vocab import output_head, token_embedding
from zoo.registry import MODEL
from zoo.schema import ModelSpec


@MODEL.register("encoder_only")
class EncoderOnly(nn.Module):
    generates = False  # fills masked positions in one pass; no token-by-token generation
    needs_source = False
    next_token_lm = False
    stacks = ("encoder",)

    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.cfg = cfg
        d, bias = cfg.d_model, cfg.bias
        self.embed = token_embedding(cfg)
        ctx = context(cfg, cfg.n_layers)
        # model.funnel: the pooled output up-sampled to every position, for the head (zoo/models/funnel.py)
        self.encoder = Stack(cfg, ctx, self.embed, cfg.n_layers, full_length=True)
        # BERT's MLM head: a dense + GELU + norm transform, then the output projection with a bias.
        self.head_dense, self.head_norm = nn.Linear(d, d, bias=bias), ctx.norm()
        self.head = output_head(cfg, d, bias, self.embed)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, T), padding (B, T) True for real tokens -> logits for every position (B, T, vocab)."""
        h = self.encoder(tokens, padding=padding)
        return self.head(self.head_norm(F.gelu(self.head_dense(h))))
