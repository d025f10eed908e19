"""Position schemes behind one protocol, so every call site is the same for every scheme.

- `embed(x, offset)`: an absolute scheme adds a vector per position to the token embeddings.
- `rotate(q, k, offset)`: a rotary scheme rotates queries and keys (B, H, T, dim), for any even dim: the
  head size, or a part of each head of another size (MLA's decoupled rotary part). `rotary` says it does.
- `score_bias(t_q, t_k, offset)`: a bias scheme returns (H, t_q, t_k) added to attention scores.
Each method is a no-op (or returns None) where the scheme does not apply. `offset` is the
position of the first token, non-zero when decoding with a KV cache.
A stack builds one position module, shared by its layers, as `factory(ctx, opts)` (zoo.component).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from zoo.component import Context, Options, need
from zoo.registry import POSITION


class Position(nn.Module):
    """No positional information: attention is permutation-equivariant (`none`)."""

    count_as = "position"
    rotary = False  # True: rotate() is where this scheme puts positions (attention must give it something to rotate)
    hard_limit = False  # True: positions past model.max_seq_len do not exist (learned positions)
    max_len: int | None = None  # that limit, or None when any length works

    def __init__(self, ctx: Context, opts: Options):
        super().__init__()

    def embed(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0):
        return q, k

    def score_bias(self, t_q: int, t_k: int, offset: int = 0) -> torch.Tensor | None:
        return None


POSITION.register("none", Position, options=Options)


def unlimited_positions() -> list[str]:
    """The registered schemes that place any position (no hard limit at max_seq_len)."""
    return [name for name in POSITION.names() if not POSITION.get(name).hard_limit]


@POSITION.register("learned", options=Options)
class LearnedPosition(Position):
    """A trained vector per position (GPT-2, BERT); cannot go past max_seq_len."""

    hard_limit = True

    def __init__(self, ctx: Context, opts: Options):
        super().__init__(ctx, opts)
        self.max_len = ctx.max_seq_len
        self.weight = nn.Parameter(torch.zeros(ctx.max_seq_len, ctx.d_model))

    def embed(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        t = x.shape[-2]
        if offset + t > self.max_len:
            raise ValueError(f"position {offset + t - 1} is past max_seq_len={self.max_len} of learned positions; "
                             f"use position={', '.join(unlimited_positions())} to go longer")
        return x + self.weight[offset:offset + t]


class _GrowingTable(Position):
    """A scheme whose per-position table is computed once and regrown (doubled) only on demand."""

    table: torch.Tensor  # a buffer: (positions, ...)

    def __init__(self, ctx: Context, opts: Options):
        super().__init__(ctx, opts)
        self.register_buffer("table", self._table(ctx.max_seq_len), persistent=False)

    def _rows(self, offset: int, t: int) -> torch.Tensor:
        if offset + t > self.table.shape[0]:
            n = max(offset + t, 2 * self.table.shape[0])
            self.table = self._table(n).to(self.table.device)
        return self.table[offset:offset + t]

    def _table(self, n: int) -> torch.Tensor:
        raise NotImplementedError


@dataclass(kw_only=True)
class SinusoidalOptions(Options):
    base: float = 10000.0  # the longest wavelength is 2 pi base


@POSITION.register("sinusoidal", options=SinusoidalOptions)
class SinusoidalPosition(_GrowingTable):
    """Fixed sin/cos waves of geometric wavelengths (Vaswani et al. 2017), added to embeddings."""

    def __init__(self, ctx: Context, opts: SinusoidalOptions):
        need(opts.base > 0, "position.base", f"must be positive, got {opts.base!r}; valid: a finite number > 0")
        self.d_model, self.base = ctx.d_model, opts.base
        super().__init__(ctx, opts)

    def _table(self, n: int) -> torch.Tensor:
        pos = torch.arange(n, dtype=torch.float32)[:, None]
        inv_freq = self.base ** (-torch.arange(0, self.d_model, 2, dtype=torch.float32) / self.d_model)
        table = torch.zeros(n, self.d_model)
        table[:, 0::2] = torch.sin(pos * inv_freq)
        table[:, 1::2] = torch.cos(pos * inv_freq)[:, : self.d_model // 2]
        return table

    def embed(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return x + self._rows(offset, x.shape[-2]).to(x.dtype)


@dataclass(kw_only=True)
class RotaryOptions(Options):
    theta: float = 10000.0  # base of the rotation frequencies
    # partial rotary: the share of each rotated vector (a head) that is rotated, its first dims, floored to an even
    # count; the rest passes unrotated (GPT-NeoX rotary_pct, Phi partial_rotary_factor). 1: all of it.
    fraction: float = 1.0
    # xPos (Sun et al. 2022): queries scaled by zeta^(n/B) and keys by zeta^(-m/B), so each score decays as
    # zeta^((n - m)/B) with distance; B is this scale base (x-transformers rotary_xpos_scale_base). null: plain RoPE.
    xpos_scale_base: float | None = None


@POSITION.register("rope", options=RotaryOptions, examples=[{}, {"fraction": 0.5}])
class RotaryPosition(_GrowingTable):
    """RoPE (Su et al. 2021): rotate each (i, i + dim/2) pair of q and k by angle pos * theta^(-2i/dim),
    so q.k depends only on the offset between positions. Half-split layout, as in Llama.
    Partial rotary (`fraction` < 1, GPT-NeoX, Phi) is an option of this scheme, not a scheme of its own: it is the
    same rotation, of the first dim = fraction * head size dims of each head only (its frequencies over those
    dims, as GPT-NeoX's), the others passed through, so q.k still depends only on the offset, and the unrotated
    dims carry content alone.
    xPos (`xpos_scale_base`, Sun et al. 2022) is an option of this scheme too, as x-transformers' rotary_xpos: the
    rotation with a per-pair decay zeta_i^((n - m)/B) on each score, for causal stacks only.
    The table is of the rotated size; any other size (a rotary part of each head, as MLA's) is computed per call."""

    rotary = True

    def __init__(self, ctx: Context, opts: RotaryOptions):
        need(opts.theta > 0, "position.theta", f"must be positive, got {opts.theta!r}; valid: a finite number > 0")
        need(0 < opts.fraction <= 1, "position.fraction", f"must be in (0, 1], got {opts.fraction!r}")
        need(ctx.head_dim % 2 == 0, "position.name",
             f"rope needs an even head size, got d_model/n_heads={ctx.head_dim}")
        self.fraction, self.theta = opts.fraction, opts.theta
        self.rotary_dim = self.rotated(ctx.head_dim)  # of each head
        need(self.rotary_dim >= 2, "position.fraction", f"{opts.fraction!r} of the head size {ctx.head_dim} rotates "
             f"no pair of dims; valid: at least {2 / ctx.head_dim:g}")
        base = self.xpos_scale_base = opts.xpos_scale_base
        need(base is None or base > 0, "position.xpos_scale_base", f"must be positive or null, got {base!r}")
        # The decay zeta^((n - m)/B) holds for keys before the query; a key after it would be amplified instead.
        need(base is None or ctx.causal, "position.xpos_scale_base", "xPos is for causal stacks only (Sun et al. "
             "2022; x-transformers refuses it too): keys after the query would grow by zeta^-(m - n)/B; valid: null "
             "in an encoder")
        # Positions enter the scale relative to a fixed centre (scores see only n - m), so cached and recomputed keys
        # agree; the middle of the trained context keeps zeta^(+-pos/B) near 1 over it.
        self.xpos_centre = ctx.max_seq_len // 2
        super().__init__(ctx, opts)

    def rotated(self, dim: int) -> int:
        """How many of a vector's dim leading dims are rotated: fraction * dim, floored to an even count."""
        return dim if self.fraction == 1 else 2 * int(dim * self.fraction / 2)

    def _table(self, n: int) -> torch.Tensor:
        return _cos_sin(torch.arange(n, dtype=torch.float32), self.rotary_dim, self.theta)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0):
        dim = q.shape[-1]
        r = self.rotated(dim)
        if r == dim:
            return self.xpos(*self.rotate_all(q, k, offset), offset)
        (q_r, q_pass), (k_r, k_pass) = q.split([r, dim - r], -1), k.split([r, dim - r], -1)
        q_r, k_r = self.xpos(*self.rotate_all(q_r, k_r, offset), offset)
        return torch.cat((q_r, q_pass), -1), torch.cat((k_r, k_pass), -1)

    def xpos(self, q: torch.Tensor, k: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated q and k (B, H, T, dim) scaled by xPos, pair i by zeta_i^(+-(pos - centre)/B) with
        zeta_i = (2i/dim + 0.4) / 1.4 (the paper's gamma 0.4); unchanged without xpos_scale_base."""
        if self.xpos_scale_base is None:
            return q, k
        (t, dim), dtype = q.shape[-2:], torch.promote_types(q.dtype, torch.float32)
        zeta = (torch.arange(0, dim, 2, dtype=dtype, device=q.device) / dim + 0.4) / 1.4  # (dim/2,)
        power = torch.arange(offset, offset + t, dtype=dtype, device=q.device) - self.xpos_centre
        scale = (zeta ** (power[:, None] / self.xpos_scale_base)).repeat(1, 2)  # (T, dim), both halves of a pair
        return q * scale.to(q.dtype), k * scale.reciprocal().to(k.dtype)

    def rotate_all(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k (B, H, T, dim) rotated in all their dims (rotate: in their first `rotated(dim)`)."""
        cos, sin = self.angles(offset, *q.shape[-2:]).to(q.dtype).unbind(1)  # (T, dim) each
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def angles(self, offset: int, t: int, dim: int) -> torch.Tensor:
        """(t, 2, dim): cos and sin of positions offset .. offset + t - 1, for a rotated part of size dim."""
        if dim == self.rotary_dim:
            return self._rows(offset, t)
        # a rotary part of another size: a few sin/cos per position, cheap next to the attention itself
        return _cos_sin(torch.arange(offset, offset + t, dtype=torch.float32, device=self.table.device),
                        dim, self.theta)


def _cos_sin(positions: torch.Tensor, dim: int, theta: float) -> torch.Tensor:
    """(n, 2, dim): cos and sin of each position's angles pos * theta^(-2i/dim), each repeated for both halves."""
    inv_freq = theta ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim)
    angles = torch.outer(positions, inv_freq).repeat(1, 2)  # (n, dim)
    return torch.stack([angles.cos(), angles.sin()], dim=1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@POSITION.register("alibi", options=Options)
class ALiBiPosition(Position):
    """ALiBi (Press et al. 2022): no embeddings; each head penalises scores linearly with distance,
    -slope_h * |i - j|, with geometric slopes. Extrapolates to longer inputs than trained on."""

    def __init__(self, ctx: Context, opts: Options):
        super().__init__(ctx, opts)
        self.register_buffer("slopes", alibi_slopes(ctx.n_heads), persistent=False)
        self._cache: tuple[tuple, torch.Tensor] | None = None

    def score_bias(self, t_q: int, t_k: int, offset: int = 0) -> torch.Tensor:
        key = (t_q, t_k, offset, self.slopes.device)
        if self._cache is None or self._cache[0] != key:
            # Query i sits at offset + i; keys are the t_k positions ending with the last query.
            q_pos = torch.arange(offset, offset + t_q, device=self.slopes.device)
            k_pos = torch.arange(offset + t_q - t_k, offset + t_q, device=self.slopes.device)
            dist = (q_pos[:, None] - k_pos[None, :]).abs()
            self._cache = (key, -self.slopes[:, None, None] * dist)  # (H, t_q, t_k)
        return self._cache[1]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Slopes 2^(-8/n), 2^(-16/n), ...; for a non-power-of-two n, the paper's interleaving."""
    def powers(n: int) -> list[float]:
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    p = 2 ** math.floor(math.log2(n_heads))
    slopes = powers(p) + powers(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


@dataclass(kw_only=True)
class T5Options(Options):
    num_buckets: int = 32  # distance buckets (an encoder splits them between keys before and after the query)
    max_distance: int = 128  # distances from here on share the last bucket


@POSITION.register("t5", options=T5Options, examples=[{}, {"num_buckets": 8, "max_distance": 12}])
class T5Position(Position):
    """T5's relative position bias (Raffel et al. 2020): a learned scalar per head and distance bucket,
    added to attention scores. Small distances get a bucket each, larger ones log-spaced buckets up to
    max_distance. One (num_buckets, n_heads) table per stack, shared by all its layers."""

    def __init__(self, ctx: Context, opts: T5Options):
        super().__init__(ctx, opts)
        self.bidirectional = not ctx.causal  # an encoder tells keys before the query from keys after it
        n = opts.num_buckets // 2 if self.bidirectional else opts.num_buckets
        need(n >= 2, "position.num_buckets", f"must be at least {4 if self.bidirectional else 2} "
             f"(half of them exact), got {opts.num_buckets!r}")
        need(opts.max_distance > n // 2, "position.max_distance", f"must be above the {n // 2} exact distances "
             f"(num_buckets={opts.num_buckets}{', halved in an encoder' if self.bidirectional else ''}), "
             f"got {opts.max_distance!r}")
        self.num_buckets, self.max_distance = opts.num_buckets, opts.max_distance
        self.weight = nn.Parameter(torch.zeros(opts.num_buckets, ctx.n_heads))
        self._cache: tuple[tuple, torch.Tensor] | None = None

    def buckets(self, rel: torch.Tensor) -> torch.Tensor:
        """Relative positions (key - query, integers) -> bucket indices in [0, num_buckets)."""
        n, base = self.num_buckets, torch.zeros_like(rel)
        if self.bidirectional:  # the upper half of the buckets is for keys after the query
            n //= 2
            base, dist = (rel > 0) * n, rel.abs()
        else:  # a decoder only sees keys up to the query; later ones (masked anyway) share bucket 0
            dist = (-rel).clamp(min=0)
        exact = n // 2
        # Distances exact .. max_distance spread over the remaining n - exact buckets, log-spaced.
        far = exact + (torch.log(dist.clamp(min=exact).float() / exact) / math.log(self.max_distance / exact)
                       * (n - exact)).long()
        return base + torch.where(dist < exact, dist, far.clamp(max=n - 1))

    def score_bias(self, t_q: int, t_k: int, offset: int = 0) -> torch.Tensor:
        key = (t_q, t_k, offset, self.weight.device)
        if self._cache is None or self._cache[0] != key:  # the buckets are fixed; the table is learned
            # Query i sits at offset + i; keys are the t_k positions ending with the last query.
            q_pos = torch.arange(offset, offset + t_q, device=self.weight.device)
            k_pos = torch.arange(offset + t_q - t_k, offset + t_q, device=self.weight.device)
            self._cache = (key, self.buckets(k_pos[None, :] - q_pos[:, None]))
        return self.weight[self._cache[1]].permute(2, 0, 1)  # (t_q, t_k, H) -> (H, t_q, t_k)
