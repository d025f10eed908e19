"""A stack of blocks with its embeddings: the encoder or decoder every lineage is made of."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial

import torch
from torch import nn

from zoo.block import TransformerBlock, block_sublayers
from zoo.component import Context, build, declared, need
from zoo.layers.attention import KVCache, attention_bias, cross_attention_mask
from zoo.layers.ngpt import EigenScale
from zoo.models import depth, funnel
from zoo.mup import output_scale, scaled
from zoo.registry import NORM, POSITION, RESIDUAL
from zoo.spec import ModelSpec

Cache = list[tuple[KVCache, ...]]  # per layer: (self-attention, cross-attention), or one per attention step


def context(cfg: ModelSpec, n_layers: int, causal: bool = False) -> Context:
    """The build context of a model with n_layers blocks in all, its norm factory included."""
    ctx = Context(d_model=cfg.d_model, n_heads=cfg.n_heads, max_seq_len=cfg.max_seq_len,
                  n_layers=n_layers, causal=causal, bias=cfg.bias, dropout=cfg.dropout, memory_tokens=cfg.memory_tokens,
                  residual_streams=cfg.residual_streams)
    return replace(ctx, norm=partial(NORM.get(cfg.norm.name), ctx, cfg.norm.options))


def on_sphere(cfg: ModelSpec) -> bool:
    """Whether the placement keeps every hidden vector on the unit sphere (Placement.sphere: nGPT), with what it
    needs of the rest of the model checked, each refused in one line."""
    if not declared(RESIDUAL.get(cfg.norm.placement), "sphere"):
        return False
    why = f"placement '{cfg.norm.placement}' keeps every hidden vector on the unit sphere (nGPT)"
    for key, off in (("embed_norm", False), ("memory_tokens", 0), ("value_embeddings", 0),
                     ("embed_dim", None), ("softmaxes", 1), ("adaptive_input", False), ("adaptive_softmax", False)):
        need(getattr(cfg, key) in (off, False) if off is None else getattr(cfg, key) == off, key,
             f"{why}: it normalises the embeddings, the head and its matrices itself; valid: {off}".replace(
                 "None", "null").replace("False", "false"))
    return True


class Stack(nn.Module):
    """Token embedding -> positions -> n_layers blocks -> final norm (where the placement needs one).

    causal=True makes it a decoder (each token sees only earlier ones); cross=True adds
    cross-attention to an encoder's output. ctx.layer is the index of its first block in the model.
    full_length: with model.funnel, up-sample the pooled output to the input's length (encoder_only's MLM head)."""

    def __init__(self, cfg: ModelSpec, ctx: Context, embed: nn.Module, n_layers: int, cross: bool = False,
                 full_length: bool = False):
        super().__init__()
        depth.check(cfg)
        self.embed, self.causal = embed, ctx.causal
        self.embed_scale = math.sqrt(ctx.d_model) if cfg.scale_embeddings else 1.0
        self.position = build(POSITION, cfg.position, ctx)
        ctx = replace(ctx, rotary=self.position.rotary)  # what an attention with a rotary part of its own asks
        ctx = replace(ctx, sphere=on_sphere(cfg))  # nGPT: the parts scale for unit vectors (Placement.sphere)
        self.embed_norm = ctx.norm() if cfg.embed_norm else nn.Identity()  # a sphere placement's first step normalises
        self.dropout = nn.Dropout(ctx.dropout)
        residual = RESIDUAL.get(cfg.norm.placement)
        self.value_tables = value_tables(cfg.value_embeddings, n_layers)
        orders = block_sublayers(cfg, n_layers)  # model.sublayers: each block's sequence (None: standard)
        # model.share_blocks: the block each layer applies (zoo/models/depth.py); a block built once runs for each
        # of its layers, with a KV-cache slot per layer
        self.layer_blocks = depth.layer_blocks(cfg, n_layers, ctx.causal)
        # model.value_residual (ResFormer): layer 0 keeps its values, each later layer mixes them into its own
        self.value_residual = cfg.value_residual
        need(not (cfg.value_residual and cfg.value_embeddings), "value_residual", "and value_embeddings both mix "
             "into a layer's values through its one mix; valid: value_residual=false or value_embeddings=0")
        need(not (cfg.value_residual and len(self.layer_blocks) > max(self.layer_blocks) + 1), "value_residual",
             "keeps the first layer's values for the others to mix in, which a block shared by several layers cannot "
             "do both of; valid: value_residual=false or share_blocks=none")
        self.blocks = nn.ModuleList(
            TransformerBlock(replace(ctx, layer=ctx.layer + i, keep_values=cfg.value_residual and i == 0,
                                     value_embed=self.value_tables[i] is not None or (cfg.value_residual and i > 0)),
                             cfg, residual, cross, orders[i]) for i in range(max(self.layer_blocks) + 1)
        )
        self.depth = depth.Depth(cfg, ctx, n_layers)  # the loop over the layers (step signal, ACT)
        # model.transparent_attention: a decoder's layers read their own mix of the encoder's states
        self.memory_mix = depth.TransparentMix(cfg, n_layers) if cross and cfg.transparent_attention else None
        # one mask for every layer: their attention's (AttentionPart), from the first block that attends
        self.window = next((b.window for b in self.blocks if b.kinds is None or "a" in b.kinds), None)
        # model.value_embeddings: tables of the tokens' vectors, each as wide as the attention's values
        value_dim = self.blocks[0].value_dim
        for key, on in (("value_embeddings", cfg.value_embeddings), ("value_residual", cfg.value_residual)):
            off = "0" if key == "value_embeddings" else "false"
            need(not on or value_dim is not None, key, f"attention '{cfg.attention.name}' takes no value "
                 "embeddings (its value_dim is null: the values are not what it caches or projects directly); valid: "
                 f"{off} with this attention, or an attention with a value_dim")
        self.value_embeds = nn.ModuleList(nn.Embedding(cfg.vocab_size, value_dim or 0)
                                          for _ in range(cfg.value_embeddings))
        # model.memory_tokens: learned tokens before the sequence (with the first tokens; then in the cache)
        self.memory = nn.Embedding(cfg.memory_tokens, ctx.d_model) if cfg.memory_tokens else None
        # what the placement carries beside the stream (ResiDual's second stream): opened and closed here
        self.carry = residual.carry(ctx) if declared(residual, "carry") else None  # a placement's second stream
        # model.funnel (zoo/models/funnel.py): the stream pooled before each later group's first layer; a decoder that
        # cross-attends reads a pooled memory but pools nothing itself
        self.funnel = cfg.funnel if cfg.funnel is not None and not cross else None
        self.pool_at: list[int] = []
        self.upsample = nn.ModuleList()  # encoder_only's full-length blocks after the up-sampling
        if self.funnel is not None:
            first = self.blocks[0]
            funnel.check(cfg, n_layers, ctx.causal, self.position,
                         first.attn.f if first.attn is not None else first.parallel.f["attn"])
            need(self.carry is None, "funnel", f"placement '{cfg.norm.placement}' carries a second full-length stream "
                 "beside the blocks' (ResiDual's), which the pooling would not pool; valid: another placement")
            self.pool_at = funnel.group_starts(self.funnel)
            self.upsample.extend(TransformerBlock(replace(ctx, layer=ctx.layer + n_layers + i), cfg, residual)
                                 for i in range(cfg.funnel_upsample_blocks if full_length else 0))
        self.full_length = full_length
        final = cfg.final_norm  # None: the placement decides (Post-LN has none; nn.Transformer adds one)
        self.final_norm = ctx.norm() if (residual.final_norm if final is None else final) else nn.Identity()

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor | None = None,
                memory: torch.Tensor | None = None, memory_padding: torch.Tensor | None = None,
                cache: Cache | None = None, states: bool = False) -> torch.Tensor:
        """tokens (B, T) -> hidden states (B, T, d). padding: (B, T) True for real tokens. states: every layer's
        input and the last output instead, each through the final norm (L + 1, B, T, d), what a decoder with a
        memory_mix reads as `memory`."""
        # positions the layers have seen (the memory's included): a self-attention's cache, the first block's that
        # attends (model.sublayers may start a block with no attention)
        offset = next((layer[0].len for layer in cache if layer), 0) if cache else 0
        n_mem = self.memory.num_embeddings if self.memory is not None else 0
        x = self.embed(tokens) * self.embed_scale
        x = x0 = self.dropout(self.embed_norm(self.position.embed(x, offset - n_mem if offset else 0)))
        values = [table(tokens) for table in self.value_embeds]  # (B, T, value_dim) each: the new tokens' only
        prepend = n_mem if offset == 0 else 0  # the memory sits before the first token: the layers' positions 0..
        if prepend and self.memory is not None:
            x = x0 = torch.cat([self.memory.weight.to(x.dtype).expand(x.shape[0], -1, -1), x], dim=1)
            padding = None if padding is None else torch.nn.functional.pad(padding, (prepend, 0), value=True)
            values = [torch.nn.functional.pad(v, (0, 0, prepend, 0)) for v in values]
        t = x.shape[1]
        mask, is_causal = attention_bias(t, offset + t, self.causal, self.window, self.position,
                                         padding, x.device, x.dtype)
        memory_mask = cross_attention_mask(memory_padding)

        inputs = []  # each layer's input (states=True)
        # each layer's attention scores, handed to the next (AttentionPart.chains_scores)
        scores: list[torch.Tensor] | None = [] if self.blocks[0].chains_scores else None
        memories = self.memory_mix(memory) if self.memory_mix is not None else None  # one per layer
        state = None if self.carry is None else self.carry.open(x)
        first = None  # model.value_residual: the first layer's values of these tokens, (B, T, value_dim)

        def layer(i: int, x: torch.Tensor) -> torch.Tensor:  # the i-th layer: its block, its cache slot
            nonlocal first
            table, block = self.value_tables[i], self.blocks[self.layer_blocks[i]]
            if states:
                inputs.append(x)
            x = block(x, self.position, mask, is_causal, memory if memories is None else memories[i], memory_mask,
                      cache[i] if cache else None, offset, x0=x0, value_embed=first if table is None else values[table],
                      scores=scores, state=state, padding=padding)
            if self.value_residual and i == 0:
                first = kept_values(block)
            return x

        if self.funnel is not None:  # model.funnel: the encoder pools between groups (no cache, memory or carry)
            return self._funnel(x, padding, mask)
        x = self.depth(x, layer, self.position, offset, padding)
        if self.carry is not None:
            x = self.carry.close(x, state)
        if states:
            return self.final_norm(torch.stack([*inputs, x])[:, :, prepend:])
        x = x[:, prepend:]  # the memory tokens' outputs are dropped
        return self.final_norm(x)

    def new_cache(self) -> Cache:
        return [self.blocks[b].new_cache() for b in self.layer_blocks]

    def _funnel(self, x: torch.Tensor, padding: torch.Tensor | None, mask: torch.Tensor | None) -> torch.Tensor:
        """model.funnel's loop (zoo/models/funnel.py): each later group's first layer asks with the pooled stream and
        attends to the unpooled one, the others attend within the pooled stream; then the pooled output, or
        (full_length) it up-sampled plus the first group's output through the full-length blocks."""
        t, first, full_mask = x.shape[1], x, mask
        for i, b in enumerate(self.layer_blocks):
            queries = None
            if i in self.pool_at:
                first = x if i == self.pool_at[0] else first  # the first group's output
                mask = cross_attention_mask(padding)  # the unpooled keys, (B, 1, 1, T)
                pooled, padding = funnel.pool(x, padding)
                x, queries = torch.cat([pooled, x], dim=1), pooled.shape[1]
            x = self.blocks[b](x, self.position, mask, False, queries=queries)
            if queries is not None:  # the pooled keys from here on
                mask = cross_attention_mask(padding)
        if self.full_length:
            x = funnel.upsample(x, len(self.pool_at), t) + (first if self.pool_at else x)
            for block in self.upsample:
                x = block(x, self.position, full_mask, False)
        return self.final_norm(x)

    def flops_shares(self) -> dict[int, tuple[float, float]]:
        """model.funnel: id of every module in a pooled layer's block -> (its share of the tokens, its context as a
        share of the stack's length), for zoo.build.flops_per_token; other modules run at (1, 1)."""
        out: dict[int, tuple[float, float]] = {}
        share = 1.0
        for i, b in enumerate(self.layer_blocks):
            share = share / 2 if i in self.pool_at else share
            context = 2 * share if i in self.pool_at else share  # pool-q-only: the unpooled keys
            out |= dict.fromkeys(map(id, self.blocks[b].modules()), (share, context))
        return out


def flops_shares(model: nn.Module) -> dict[int, tuple[float, float]]:
    """Every stack's Stack.flops_shares, in one dict."""
    out: dict[int, tuple[float, float]] = {}
    for stack in (m for m in model.modules() if isinstance(m, Stack)):
        out |= stack.flops_shares()
    return out


def applications(model: nn.Module) -> dict[int, int]:
    """id of every module inside a stack's blocks -> how many layers apply its block (more than 1: shared), for
    the counts that go by applications (FLOPs, the residual init's depth)."""
    out: dict[int, int] = {}
    for stack in (m for m in model.modules() if isinstance(m, Stack)):
        for b, block in enumerate(stack.blocks):
            out |= dict.fromkeys(map(id, block.modules()), stack.layer_blocks.count(b))
    return out


def kept_values(block: nn.Module) -> torch.Tensor:
    """The values the block's self-attention kept in this forward (built with ctx.keep_values), taken from it."""
    attn = next(m for m in block.modules() if getattr(m, "keep_values", False))
    values, attn.kept_values = attn.kept_values, None  # held no longer than the forward
    return values


def value_tables(n_tables: int, n_layers: int) -> list[int | None]:
    """Which value-embedding table each of a stack's layers reads (None: none), as the speedrun chooses them:
    table i for layer i and for layer n_layers - n_tables + i, the first n_tables layers and the last (with as
    many tables as layers, each layer its own)."""
    tables: list[int | None] = [None] * n_layers
    for i in range(n_tables):
        first, last = i, n_layers - n_tables + i
        need(0 <= last < n_layers and tables[first] in (None, i) and tables[last] in (None, i), "value_embeddings",
             f"{n_tables} tables, read by the first {n_tables} and the last {n_tables} of {n_layers} layers, would "
             f"give a layer two; valid: 0 to {n_layers // 2}, or {n_layers} (a table per layer)")
        tables[first] = tables[last] = i
    return tables


class ScaledLinear(nn.Linear):
    """A head's linear layer out of the model's width into a size that does not grow with it (the vocabulary, a
    fixed embed_dim, a mixture's K weights): muP's readout (zoo.mup), whose input is multiplied by `scale`, muP's
    output multiplier 1 / width_mult, before the weight and any bias; 1 (skipped) in the standard
    parametrization. The multiplier follows from the config, so a checkpoint's weights are the same either way."""

    readout = True  # zoo.mup.roles: the output multiplier, not the fan-in rule, keeps this layer's updates steady

    def __init__(self, cfg: ModelSpec, d_in: int, d_out: int, bias: bool):
        super().__init__(d_in, d_out, bias=bias)
        self.scale = output_scale(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(scaled(x, self.scale))


class Readout(ScaledLinear):
    """The output layer (hidden states -> logits), a ScaledLinear. Every lineage's logits come from here (or from
    zoo/models/vocab.py's heads), in training, evaluation and generation, so model.logit_softcap (Gemma 2, the
    speedrun) caps them all."""

    def __init__(self, cfg: ModelSpec, d_in: int, d_out: int, bias: bool):
        super().__init__(cfg, d_in, d_out, bias)
        self.softcap = cfg.logit_softcap  # model.logit_softcap: logits = c * tanh(logits / c), within (-c, c)
        # nGPT (a sphere placement): logits times a learned s_z per token, from 1 (stored at 1 / sqrt(d_in))
        self.s_z = EigenScale(d_out, 1.0, 1 / math.sqrt(d_in)) if on_sphere(cfg) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        logits = logits if self.s_z is None else logits * self.s_z()
        return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)
