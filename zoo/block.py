"""One Transformer block, used by every lineage: self-attention, optional cross-attention, FFN.

Which attention, norm, placement and FFN it holds was decided by the registries at build time;
the block only wires them together. A sequential placement (pre, post, sandwich) wraps each sublayer
in its own residual step, run in turn; a parallel one (`placement.parallel`) wraps them all in one step.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import torch
from torch import nn

from zoo.component import Context, Options, build, declared, need
from zoo.layers.attention import KVCache
from zoo.layers.mix import ScalarMix
from zoo.layers.position import Position
from zoo.layers.token_shift import ShiftInput, shifting
from zoo.registry import ATTENTION, FFN
from zoo.spec import ModelSpec

SUBLAYER_LETTERS = "afh"  # model.sublayers: a self-attention, f FFN, h half-step FFN (macaron)


def block_sublayers(cfg: ModelSpec, n_layers: int) -> list[str | None]:
    """model.sublayers as one pattern per block of a stack of n_layers (None: the standard block)."""
    value = cfg.sublayers
    return list(value) if isinstance(value, (list, tuple)) else [value] * n_layers


def built(registry: Any, part: Any, ctx: Context) -> Any:
    """The sublayer `part` names. Where the placement keeps the stream on the unit sphere (ctx.sphere, nGPT), a part
    that cannot scale for it (its AttentionPart.sphere / FFNPart.sphere false) was refused before the build by the
    placement's `refuses`; one that gets here was left out of that list: a one-line error asking for its line."""
    f = build(registry, part, ctx)
    need(not ctx.sphere or declared(f, "sphere"), registry.kind, f"{registry.kind} '{part.name}' cannot work on the "
         "unit sphere (its `sphere` is false) and the placement does not declare refusing it; add its line to the "
         "placement's `refuses` (zoo/layers/ngpt.py) or make it scale for the sphere")
    return f


class Half(nn.Module):
    """f(x) / 2: macaron's half-step FFN (Lu et al. 2019), inside any placement."""

    def __init__(self, f: nn.Module):
        super().__init__()
        self.f = f

    def forward(self, x: torch.Tensor, **kw: Any) -> torch.Tensor:
        return 0.5 * self.f(x, **kw)


def placement(residual: Any, ctx: Context) -> Any:
    """The placement's factory, given the build context where it takes one (Placement.contextual)."""
    return partial(residual, ctx=ctx) if declared(residual, "contextual") else residual


class TransformerBlock(nn.Module):
    def __init__(self, ctx: Context, cfg: ModelSpec, residual: Any, cross: bool = False,
                 order: str | None = None):
        """residual: the placement's wrapper class (zoo.layers.residual), from the RESIDUAL registry.
        order: this block's sequence of sublayers (model.sublayers: macaron's "hah", the sandwich's orders); None: the
        standard attention, cross-attention where the decoder cross-attends, FFN."""
        super().__init__()
        self.kinds: str | None = None
        if order is not None:
            self._sequence(ctx, cfg, residual, cross, order)
            return
        sublayers = {"attn": built(ATTENTION, cfg.attention, ctx)}
        if cross:
            sublayers["cross"] = built(ATTENTION, cfg.attention, replace(ctx, cross=True))
        sublayers["ffn"] = built(FFN, cfg.ffn, ctx)
        self.parallel: nn.Module | None
        self.window = sublayers["attn"].window  # the stack's mask follows its self-attention's window
        self.value_dim = declared(sublayers["attn"], "value_dim")  # the width of a value embedding, if it takes one
        self.chains_scores = declared(sublayers["attn"], "chains_scores")  # takes the previous layer's scores
        # model.embed_skip: the block's input is a * x + b * x0, x0 the stack's embedding output (a=1, b=0 at init)
        self.embed_skip = ScalarMix("embedding", 1.0, 0.0) if cfg.embed_skip else None
        place = placement(residual, ctx)
        # model.shift_tokens: each sublayer reads channel groups of neighbouring tokens (zoo/layers/token_shift.py)
        self.shift = cfg.shift_tokens > 0
        sublayers = {k: shifting(f, cfg.shift_tokens, ctx.causal, k) for k, f in sublayers.items()}
        if residual.parallel:  # one residual step around all of them, on one norm
            self.parallel, self.attn, self.cross, self.ffn = place(sublayers, ctx.norm), None, None, None
        else:  # one residual step around each, in turn
            self.parallel = None
            self.attn, self.cross, self.ffn = (place(sublayers[k], ctx.norm) if k in sublayers else None
                                               for k in ("attn", "cross", "ffn"))

    def _sequence(self, ctx: Context, cfg: ModelSpec, residual: Any, cross: bool, order: str) -> None:
        """The block as a sequence of residual steps, one per letter; a cross-attention after each self-attention
        in a decoder that cross-attends."""
        need(not residual.parallel, "sublayers", f"placement '{cfg.norm.placement}' steps over all of a block's "
             "sublayers at once: it has no order; valid: null, or a sequential placement (pre, post, ...)")
        self.kinds = "".join(k + "c" if cross and k == "a" else k for k in order)
        self.shift = cfg.shift_tokens > 0
        need(not (self.shift and ctx.causal and "a" not in order), "shift_tokens", f"a decoder's "
             f"block '{order}' has no attention, whose cache would keep the shifted tokens; valid: 0, or sublayers "
             "with an 'a' in every block")
        make = {"a": lambda: built(ATTENTION, cfg.attention, ctx), "f": lambda: built(FFN, cfg.ffn, ctx),
                "c": lambda: built(ATTENTION, cfg.attention, replace(ctx, cross=True)),
                "h": lambda: Half(built(FFN, cfg.ffn, ctx))}
        parts, place = [make[k]() for k in self.kinds], placement(residual, ctx)
        self.steps = nn.ModuleList(place(shifting(f, cfg.shift_tokens, ctx.causal, str(i)), ctx.norm)
                                   for i, f in enumerate(parts))
        attns = [f for f, k in zip(parts, self.kinds, strict=True) if k == "a"]
        self.window = attns[0].window if attns else None
        need(not any(declared(a, "chains_scores") for a in attns), "sublayers", f"attention '{cfg.attention.name}' "
             "hands its scores to the next layer's, which a block of sublayers does not carry; valid: null, or "
             "another attention")
        self.value_dim, self.chains_scores = None, False
        self.embed_skip = ScalarMix("embedding", 1.0, 0.0) if cfg.embed_skip else None
        self.parallel = self.attn = self.cross = self.ffn = None

    def new_cache(self) -> tuple[KVCache, ...]:
        """A KV cache per attention: (self, cross) for the standard block, else one per 'a' and 'c' step."""
        if self.kinds is None:
            return KVCache(), KVCache()
        return tuple(KVCache() for k in self.kinds if k in "ac")

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None, is_causal: bool,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None,
                cache: tuple[KVCache, ...] | None = None, offset: int = 0, x0: torch.Tensor | None = None,
                value_embed: torch.Tensor | None = None, scores: list[torch.Tensor] | None = None,
                state: Any = None, queries: int | None = None, padding: torch.Tensor | None = None) -> torch.Tensor:
        """x0: the stack's embedding output (model.embed_skip); value_embed: this layer's value embedding of the
        tokens (model.value_embeddings), given only to a layer that has a table; scores: the previous layer's
        attention scores, for a self-attention that chains them (AttentionPart.chains_scores); state: what the
        placement carries beside x (its `carry`), handed to each residual step; queries: only x's first `queries`
        rows are the stream, the rest only keys and values for the self-attention (model.funnel's pool-q-only), and
        the output is those rows; padding (B, T_k): True for real tokens, the cached ones included
        (model.shift_tokens zeroes the padded ones)."""
        carried = {} if state is None else {"state": state}
        shift = ShiftInput(None if padding is None else padding[:, -x.shape[1]:],
                           cache[0].past if cache else None) if self.shift else None
        if self.kinds is not None:
            carried |= {"shift": shift} if shift is not None else {}
            return self._run_sequence(x, pos, mask, is_causal, memory, memory_mask, cache, offset, x0, carried)
        self_cache, cross_cache = cache if cache is not None else (None, None)
        kw: dict[str, dict[str, Any]] = {
            "attn": dict(pos=pos, mask=mask, is_causal=is_causal, cache=self_cache, offset=offset),
            "cross": dict(pos=NO_POSITION, mask=memory_mask, context=memory, cache=cross_cache), "ffn": {}}
        if value_embed is not None:  # an attention without value embeddings keeps the plain signature
            kw["attn"]["value_embed"] = value_embed
        if scores is not None:
            kw["attn"]["scores"] = scores
        if queries is not None:
            kw["attn"]["queries"] = queries
        for step_kw in kw.values() if shift is not None else ():
            step_kw["shift"] = shift
        if self.embed_skip is not None:
            x = self.embed_skip(x, x0)
        if self.parallel is not None:
            return self.parallel(x, **carried, **kw)[:, :queries]
        for name, step in (("attn", self.attn), ("cross", self.cross), ("ffn", self.ffn)):
            if step is not None:  # cross: only in a decoder that cross-attends
                x = step(x, **carried, **kw[name])[:, :queries if name == "attn" else None]
        return x

    def _run_sequence(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None, is_causal: bool,
                      memory: torch.Tensor | None, memory_mask: torch.Tensor | None,
                      cache: tuple[KVCache, ...] | None, offset: int, x0: torch.Tensor | None,
                      carried: dict[str, Any]) -> torch.Tensor:
        """model.sublayers: the steps in order, each attention with the next of the block's caches."""
        caches = iter(cache if cache is not None else ())
        if self.embed_skip is not None:
            x = self.embed_skip(x, x0)
        for kind, step in zip(self.kinds or "", self.steps, strict=True):
            if kind == "a":
                x = step(x, pos=pos, mask=mask, is_causal=is_causal, cache=next(caches, None), offset=offset,
                         **carried)
            elif kind == "c":
                x = step(x, pos=NO_POSITION, mask=memory_mask, context=memory, cache=next(caches, None), **carried)
            else:
                x = step(x, **carried)
        return x


NO_POSITION = Position(Context(d_model=1, n_heads=1, max_seq_len=0), Options())  # cross-attention: no positions
