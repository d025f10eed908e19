"""Multi-head latent attention, MLA (DeepSeek-V2, DeepSeek-AI 2024): every head's keys and values are made
from one small latent per token, so the KV cache holds that latent (and one rotary key shared by the heads)
instead of the keys and values of every head.

Per token x, with r = kv_rank, p = rope_dim, d = head_dim:
    c   = norm(W_dkv x)                  the latent (r): what the cache holds,
    k_r = rotate(W_kr x)                 with the shared rotary key (p): (r + p) numbers per token and layer
    k_h = [W_uk,h c ; k_r]               head h's key: d from the latent, then the rotary part
    v_h = W_uv,h c                       head h's value (d)
    q_h = [W_q,h x ; rotate(W_qr,h x)]   (through a normed latent of q_rank first, when q_rank is set)
    out = W_o [softmax(q_h . k_h / sqrt(d + p)) v_h for each head h]
RoPE cannot act on keys made from a cached latent (the rotation would sit between W_uk and the cache), hence
the decoupled rotary part. Other positions need none: ALiBi comes as a score bias, learned and sinusoidal
positions with the embeddings, and rope_dim may then be 0.

Without a cache (training) keys and values are expanded from the latent as written above. With a cache
(decoding) W_uk and W_uv are absorbed instead: q_h . W_uk,h c = (W_uk,h^T q_h) . c, so each step attends over
the cached latents directly, as multi-query attention with one key [c ; k_r] and one value c, and W_uv,h is
applied to each head's weighted sum of latents. Both give the same outputs (tests/test_mla.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zoo.component import Context, linear_flops, need
from zoo.layers.attention import AttentionBase, AttentionOptions, KVCache, attention_mask, qk_norms
from zoo.layers.position import Position
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class MLAOptions(AttentionOptions):
    # Size of the latent keys and values are made from; null: 4 x head size (DeepSeek-V2: 512 for heads of 128).
    kv_rank: int | None = None
    # Size of each query and key head's rotary part; null: half the head size (even) with a rotary position
    # (DeepSeek-V2: 64 for heads of 128), else 0.
    rope_dim: int | None = None
    # Queries through a normed latent of this size too (DeepSeek-V2: 1536); null: one plain projection.
    q_rank: int | None = None


class MLA(AttentionBase):
    """n_kv_heads = n_heads: every head has a key and a value of its own (head_dim, made from the latent), as
    in MHA; the cache holds none of them, only the latent and the rotary key (cache_bytes_per_token)."""

    def __init__(self, ctx: Context, opts: MLAOptions):
        super().__init__(ctx, opts)
        hd, rotary = ctx.head_dim, ctx.rotary and not ctx.cross  # cross-attention gets no positions
        r = 4 * hd if opts.kv_rank is None else opts.kv_rank
        p = opts.rope_dim
        if p is None:  # half the head size, even, where something rotates it
            p = max(2, hd // 4 * 2) if rotary else 0
        need(r > 0, "attention.kv_rank", f"must be a positive integer or null, got {r}")
        need(p >= 0 and p % 2 == 0, "attention.rope_dim",
             f"must be an even integer >= 0 (rotated in pairs) or null, got {p}")
        need(p > 0 or not rotary, "attention.rope_dim", "must be > 0 with a rotary position (position=rope), "
             "where the rotary part is MLA's only source of positions; valid: an even integer > 0, or null")
        need(opts.qk_norm != "projection", "attention.qk_norm", "mla normalises each query head and the rotary key, "
             "not whole projections (its keys come from a normed latent); valid: true, head, false")
        need(opts.q_rank is None or opts.q_rank > 0, "attention.q_rank",
             f"must be a positive integer or null, got {opts.q_rank}")
        d, H, bias = ctx.d_model, ctx.n_heads, ctx.bias
        self.n_heads, self.n_kv_heads, self.head_dim, self.kv_rank, self.rope_dim = H, H, hd, r, p
        q_out = H * (hd + p)  # each query head: d to meet the latent's keys, p to meet the rotary key
        if opts.q_rank is None:
            self.q = nn.Linear(d, q_out, bias=bias)
        else:  # down to q_rank, the model's norm, up to the heads
            self.q = nn.Sequential(nn.Linear(d, opts.q_rank, bias=bias), ctx.norm(opts.q_rank),
                                   nn.Linear(opts.q_rank, q_out, bias=bias))
        self.kv_down = nn.Linear(d, r + p, bias=bias)  # the latent and the rotary key: one matrix product
        self.kv_norm = ctx.norm(r)  # on the latent only, as DeepSeek-V2
        self.k_up, self.v_up = nn.Linear(r, H * hd, bias=bias), nn.Linear(r, H * hd, bias=bias)
        self.out = nn.Linear(H * hd, d, bias=bias)
        self.out_dropout = nn.Dropout(ctx.dropout)
        # qk_norm, per head: each query head, and the rotary key; the keys' latent part is normed already (kv_norm), and
        # a norm after W_uk would stop it being absorbed into the queries.
        self.q_norm, self.k_norm = qk_norms(ctx, opts, hd + p, p)

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None = None,
                is_causal: bool = False, context: torch.Tensor | None = None,
                cache: KVCache | None = None, offset: int = 0) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_norm(self.q(x).unflatten(-1, (self.n_heads, -1)).transpose(1, 2))  # (B, H, T, hd + p)
        q, q_r = q.split((self.head_dim, self.rope_dim), dim=-1)
        if context is None:
            c, k_r = self._latent(x)
            q_r, k_r = pos.rotate(q_r, k_r, offset)
            ck = torch.cat([c, k_r], dim=-1)  # (B, 1, S, r + p): what the cache holds, and decoding's one key
            if cache is not None:
                (ck,) = cache.append(ck)
        elif cache is not None and cache.len:  # the encoder output is fixed: compress it once
            (ck,) = cache.tensors
        else:
            ck = torch.cat(self._latent(context), dim=-1)
            if cache is not None:
                cache.append(ck)
        # With a cache, attend over the latents unless expanding them is cheaper (a long prefill): per query,
        # absorbing costs H * r more than expanding per key's score and sum, expanding 2 * H * hd * r per key.
        absorb = cache is not None and T * (self.kv_rank - self.head_dim) < self.kv_rank * self.head_dim
        attend = self._absorbed if absorb else self._expanded
        y = self._scale_heads(attend(q, q_r, ck, mask, is_causal))  # (B, H, T, hd)
        return self.out_dropout(self.out(y.transpose(1, 2).reshape(B, T, -1)))

    def _latent(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, S, d_model) -> the normed latent (B, 1, S, r) and the rotary key (B, 1, S, p), before rotation."""
        c, k_r = self.kv_down(x)[:, None].split((self.kv_rank, self.rope_dim), dim=-1)
        return self.kv_norm(c), self.k_norm(k_r)

    def _expanded(self, q, q_r, ck, mask, is_causal) -> torch.Tensor:
        """Every head's keys and values made from the latent, as the paper writes them (training, prefill)."""
        c, k_r = ck.split((self.kv_rank, self.rope_dim), dim=-1)
        heads = lambda t: t.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # (B, S, H * hd) -> (B, H, S, hd)
        k = torch.cat([heads(self.k_up(c[:, 0])), k_r.expand(-1, self.n_heads, -1, -1)], dim=-1)
        return self._attend(torch.cat([q, q_r], dim=-1), k, heads(self.v_up(c[:, 0])), mask, is_causal)

    def _absorbed(self, q, q_r, ck, mask, is_causal) -> torch.Tensor:
        """Attention over the cached latents themselves (decoding): W_uk folded into the queries, W_uv applied
        after the weighted sum. The key bias adds the same to every score of a query, so softmax drops it; the
        value bias comes through whole, since each query's weights sum to 1."""
        H, T, S = q.shape[1], q.shape[2], ck.shape[2]
        w_uk, w_uv = (m.weight.to(q.dtype).view(H, self.head_dim, self.kv_rank) for m in (self.k_up, self.v_up))
        q_c = torch.einsum("bhtd,hdr->bhtr", q, w_uk)  # (B, H, T, r): each head's query in latent space
        # One key/value head for all: the heads become rows of one query (B, 1, H * T, .), so the cache is
        # multiplied as it is, never copied per head; the mask follows them.
        if is_causal:
            mask, is_causal = attention_mask(T, S, True, None, q.device), False
        if mask is not None:
            mask = mask.broadcast_to(mask.shape[0] if mask.dim() == 4 else 1, H, T, S).flatten(1, 2)[:, None]
        y = self._attend(torch.cat([q_c, q_r], dim=-1).flatten(1, 2)[:, None], ck, ck[..., : self.kv_rank],
                         mask, is_causal, qk_dim=self.head_dim + self.rope_dim)  # (B, 1, H * T, r)
        if self.record:
            self.weights = self.weights.unflatten(2, (H, T))[:, 0]  # (B, H, T, S), as every attention keeps them
        y = torch.einsum("bhtr,hdr->bhtd", y.unflatten(2, (H, T))[:, 0], w_uv)
        return y if self.v_up.bias is None else y + self.v_up.bias.to(y.dtype).view(H, 1, -1)

    def cache_bytes_per_token(self, element_size: int) -> int:
        """KV-cache bytes one token adds to this layer: its latent and its rotary key."""
        return (self.kv_rank + self.rope_dim) * element_size

    def flops(self, t: int) -> int:
        """Forward FLOPs per token at context t, as trained (keys and values expanded): the projections, then
        scores over head_dim + rope_dim and the weighted sum over head_dim, per head."""
        return linear_flops(self) + 2 * t * self.n_heads * (2 * self.head_dim + self.rope_dim)


@ATTENTION.register("mla", options=MLAOptions, examples=[{"kv_rank": 16, "rope_dim": 4},
                                                         {"q_rank": 12, "qk_norm": True}])
def mla(ctx: Context, opts: MLAOptions) -> MLA:
    """Multi-head latent attention: keys and values from a cached low-rank latent (DeepSeek-V2)."""
    return MLA(ctx, opts)
