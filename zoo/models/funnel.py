"""The funnel encoder (Dai et al. 2020, "Funnel-Transformer"): a model option, model.funnel, of how a stack applies
its blocks (like zoo/models/depth.py), not a registered part: it changes the sequence between blocks.

- model.funnel = [n_1, ..., n_G]: the encoder's n_layers blocks in G groups of these counts. Before each later group
  the stream is pooled: stride-2 mean pooling over positions, (B, T, d) -> (B, ceil(T / 2), d). An odd length is
  padded (the paper's code may truncate; zoo keeps every token): the last position is pooled alone, its own mean.
- With a padding mask (True: a real token), a padded position is left out of the means: a pooled position is the
  mean of the real positions of its pair, and real if either of them is (a pair of padding: the plain mean,
  padding itself). The pooled mask is what the next group's keys and, in encoder_decoder, the decoder's
  cross-attention read.
- "pool-q-only": the first block of each later group takes its queries from the pooled stream and its keys and
  values from the unpooled one, h' = pool(h) + Attn(Q = pool(h), KV = h) (the paper's Post-LN adds the norm after:
  LayerNorm(pool(h) + Attn(...)), zoo's placements wrap it as they wrap any step). The block gets the two streams as
  one, [pool(h); h], and `queries` = len(pool(h)): each placement and norm works per position, so each part is
  normalised as it would be alone, and the self-attention asks with the first rows only and answers with the rest
  (zoo.layers.attention.Attention, `queries`). Later blocks of the group attend within the pooled sequence.
- encoder_only (an MLM head needs every position): the paper's decoder. The last group's output is up-sampled by
  repeating each position 2^(G-1) times (cut to T), the first group's output is added (a residual), and
  model.funnel_upsample_blocks full-length blocks (the paper's 2) run on the sum before the stack's final norm.
- encoder_decoder: the decoder cross-attends to the pooled output, with the pooled padding mask.

Refused in one line: causal stacks (pooling would mix a token with the next one), and position schemes placed inside
the attention, which would need the pooled positions: rotary (rotates q and k by positions) and score biases (ALiBi,
T5's buckets, dynamic position bias: relative distances; the paper's own relative scheme is not in zoo). Absolute
schemes (learned, sinusoidal) are added at the embedding and are pooled with the stream.

FLOPs (zoo.build.flops_per_token): a block of group g runs on 1 / 2^g of the tokens at a context of T / 2^g; the
pool-q-only block counts its queries' share with the unpooled keys as its context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import declared, need
from zoo.layers.position import Position
from zoo.schema import ModelSpec


def check(cfg: ModelSpec, n_layers: int, causal: bool, position: Position, attention: nn.Module) -> None:
    """model.funnel's constraints, one line each, before any compute."""
    groups = cfg.funnel or []
    well_formed = isinstance(cfg.funnel, (list, tuple)) and all(isinstance(n, int) and n > 0 for n in groups)
    need(well_formed and len(groups) > 1, "funnel", f"got {cfg.funnel!r}; valid: null, or a list of two or more "
         "positive block counts, one per group, e.g. [2, 2, 2]")
    need(sum(groups) == n_layers, "funnel", f"the groups {list(groups)} hold {sum(groups)} blocks, the stack has "
         f"n_layers={n_layers}; valid: counts that sum to n_layers")
    need(not causal, "funnel", "pools a decoder's tokens, mixing each with the next one it must not see; valid: null, "
         "or model encoder_only / encoder_decoder (the encoder pools)")
    need(not position.rotary and type(position).score_bias is Position.score_bias, "funnel", f"position "
         f"'{cfg.position.name}' places positions inside the attention (rotary, or a score bias by distance), which "
         "would need the pooled positions; valid: an absolute position (learned, sinusoidal) or none")
    need(declared(attention, "pools_queries"), "funnel", f"attention '{cfg.attention.name}' "
         "cannot take its queries from the pooled stream and its keys from the unpooled one; valid: mha, gqa, mqa "
         "and the variants built on them")
    need(getattr(attention, "window", None) is None, "funnel", "not with attention.window (a window in pooled "
         "positions is another window); valid: window null")
    need(cfg.funnel_upsample_blocks >= 0, "funnel_upsample_blocks", f"got {cfg.funnel_upsample_blocks!r}; valid: "
         "an integer >= 0")
    for key, on in (("sublayers", cfg.sublayers is not None), ("share_blocks", cfg.share_blocks != "none"),
                    ("step_signal", cfg.step_signal), ("act", cfg.act), ("memory_tokens", cfg.memory_tokens > 0),
                    ("value_embeddings", cfg.value_embeddings > 0), ("value_residual", cfg.value_residual),
                    ("embed_skip", cfg.embed_skip), ("transparent_attention", cfg.transparent_attention),
                    ("shift_tokens", cfg.shift_tokens > 0)):
        need(not on, "funnel", f"not with {key} (it reads or carries full-length states across the pooling); valid: "
             f"funnel null, or {key} off")


def group_starts(groups: list[int]) -> list[int]:
    """The layer index of each later group's first block (where the stream is pooled)."""
    starts, at = [], 0
    for n in groups[:-1]:
        at += n
        starts.append(at)
    return starts


def pool(x: torch.Tensor, padding: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stride-2 mean pooling: x (B, T, d) -> (B, ceil(T / 2), d), and the pooled padding mask (True: real).
    Each pooled position is the mean of its pair's real positions (an odd T's last one alone)."""
    b, t, d = x.shape
    exists = torch.ones(b, t, dtype=torch.bool, device=x.device)
    real = exists if padding is None else padding
    if t % 2:  # odd: a lone last position, its pair a padding that counts for nothing
        x, real, exists = F.pad(x, (0, 0, 0, 1)), F.pad(real, (0, 1), value=False), F.pad(exists, (0, 1), value=False)
    w, every = real.view(b, -1, 2).to(x.dtype), exists.view(b, -1, 2).to(x.dtype)
    n = w.sum(-1, keepdim=True)
    # a pair of padding: the plain mean of its positions (never read as a real key)
    w = torch.where(n > 0, w / n.clamp(min=1), every / every.sum(-1, keepdim=True))
    pooled = (x.view(b, -1, 2, d) * w[..., None]).sum(2)
    return pooled, None if padding is None else n.squeeze(-1) > 0


def pooled_padding(padding: torch.Tensor | None, times: int) -> torch.Tensor | None:
    """The padding mask after `times` poolings (what a decoder cross-attending to a funnel's output reads)."""
    for _ in range(times):
        if padding is not None:
            padding = pool(padding[..., None].float(), padding)[1]
    return padding


def upsample(x: torch.Tensor, times: int, length: int) -> torch.Tensor:
    """The paper's up-sampling: each of x's positions (B, T', d) repeated 2^times times, cut to `length`."""
    return x.repeat_interleave(2 ** times, dim=1)[:, :length]
