"""Encoder-decoder (original Transformer, T5, BART): a bidirectional encoder, a causal decoder that
cross-attends to it, one shared token embedding and a tied output head (zoo/models/vocab.py: other ties)."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from zoo.models import funnel
from zoo.models.stack import Cache, Stack, context
from zoo.models.vocab import output_head, token_embedding
from zoo.registry import MODEL
from zoo.schema import ModelSpec


@MODEL.register("encoder_decoder")
class EncoderDecoder(nn.Module):
    generates = True
    needs_source = True  # the forward pass and generation take a source sequence to encode
    next_token_lm = False
    stacks = ("encoder", "decoder")

    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.cfg = cfg
        self.embed = token_embedding(cfg)
        n_enc, n_dec = cfg.n_layers, cfg.n_decoder_layers or cfg.n_layers
        ctx = context(cfg, n_enc + n_dec)
        # model.tie_encoder_decoder=false: the encoder reads a token embedding of its own
        self.encoder = Stack(cfg, ctx, self.embed if cfg.tie_encoder_decoder else token_embedding(cfg), n_enc)
        self.decoder = Stack(cfg, replace(ctx, causal=True, layer=n_enc), self.embed, n_dec, cross=True)
        self.head = output_head(cfg, cfg.d_model, False, self.embed)

    def encode(self, src: torch.Tensor, src_padding: torch.Tensor | None = None) -> torch.Tensor:
        # model.transparent_attention: every encoder state, (n_layers + 1, B, S, d), mixed per decoder layer
        return self.encoder(src, padding=src_padding, states=self.cfg.transparent_attention)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_padding: torch.Tensor | None = None,
               cache: Cache | None = None) -> torch.Tensor:
        # model.funnel: the encoder's output is pooled, and so is the source padding the decoder reads with it
        src_padding = funnel.pooled_padding(src_padding, len(self.encoder.pool_at))
        return self.head(self.decoder(tgt, memory=memory, memory_padding=src_padding, cache=cache))

    def forward(self, src: torch.Tensor, tgt: torch.Tensor,
                src_padding: torch.Tensor | None = None) -> torch.Tensor:
        """src (B, S), tgt (B, T) decoder input -> next-token logits (B, T, vocab)."""
        return self.decode(tgt, self.encode(src, src_padding), src_padding)

    def new_cache(self) -> Cache:
        return self.decoder.new_cache()
