"""Encoder-only masked language model (BERT): a bidirectional stack and an MLM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.stack import Readout, Stack, context
from zoo.registry import MODEL
from zoo.schema import ModelSpec


@MODEL.register("encoder_only")
class EncoderOnly(nn.Module):
    generates = False  # fills masked positions in one pass; no token-by-token generation
    needs_source = False
    next_token_lm = False

    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.cfg = cfg
        d, vocab, bias = cfg.d_model, cfg.vocab_size, cfg.bias
        self.embed = nn.Embedding(vocab, d)
        ctx = context(cfg, cfg.n_layers)
        self.encoder = Stack(cfg, ctx, self.embed, cfg.n_layers)
        # BERT's MLM head: a dense + GELU + norm transform, then the output projection with a bias.
        self.head_dense, self.head_norm = nn.Linear(d, d, bias=bias), ctx.norm()
        self.head = Readout(cfg, d, vocab, bias=bias)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, T), padding (B, T) True for real tokens -> logits for every position (B, T, vocab)."""
        h = self.encoder(tokens, padding=padding)
        return self.head(self.head_norm(F.gelu(self.head_dense(h))))
