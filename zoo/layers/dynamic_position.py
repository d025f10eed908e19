"""Dynamic position bias (`dynamic`): a small MLP maps each relative distance to one bias per head, added to the
attention scores (Wang et al. 2021, CrossFormer; x-transformers' DynamicPositionBias).

A bias scheme of the position protocol (zoo.component.PositionPart): like T5's table it is learned and shared by
the stack's layers, but it is a function of the distance, not a lookup, so it is defined at any distance (no
buckets, no max_distance) and two nearby distances get nearby biases. The input is the signed distance
query - key (an encoder tells keys before the query from keys after it), or sign * log(1 + |distance|) with
`log_distance`, which keeps far distances in the range the MLP saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from zoo.component import Context, Options, linear_flops, need
from zoo.layers.position import Position
from zoo.registry import POSITION


@dataclass(kw_only=True)
class DynamicBiasOptions(Options):
    widths: ClassVar[tuple[str, ...]] = ("width",)  # grows with d_model (zoo.mup scales it along)
    width: int | None = None  # the MLP's hidden size; null: d_model // 4, as x-transformers
    depth: int = 2  # hidden layers, each linear then SiLU (x-transformers' dynamic_pos_bias_mlp_depth)
    log_distance: bool = False  # the MLP reads sign(d) * log(1 + |d|) instead of the distance d


@POSITION.register("dynamic", options=DynamicBiasOptions, examples=[{}, {"depth": 1, "log_distance": True}])
class DynamicPositionBias(Position):
    """bias[h, i, j] = MLP(query_i - key_j)[h]: Linear(1, width), SiLU, (Linear(width, width), SiLU) x (depth - 1),
    Linear(width, n_heads)."""

    def __init__(self, ctx: Context, opts: DynamicBiasOptions):
        super().__init__(ctx, opts)
        width = ctx.d_model // 4 if opts.width is None else opts.width
        need(width > 0, "position.width", f"must be a positive integer or null (d_model // 4), got {width!r}")
        need(opts.depth >= 1, "position.depth", f"must be at least 1, got {opts.depth!r}")
        layers: list[nn.Module] = [nn.Linear(1, width), nn.SiLU()]
        for _ in range(opts.depth - 1):
            layers += [nn.Linear(width, width), nn.SiLU()]
        self.mlp = nn.Sequential(*layers, nn.Linear(width, ctx.n_heads))
        self.log_distance = opts.log_distance

    def score_bias(self, t_q: int, t_k: int, offset: int = 0) -> torch.Tensor:
        # Queries are the last t_q of the t_k keys, so query - key runs from -(t_q - 1) to t_k - 1 whatever the
        # offset: the MLP runs once per distance, then each (query, key) pair reads its row.
        device = self.mlp[0].weight.device
        dist = torch.arange(-(t_q - 1), t_k, device=device, dtype=self.mlp[0].weight.dtype)[:, None]
        if self.log_distance:
            dist = dist.sign() * torch.log1p(dist.abs())
        per_distance = self.mlp(dist)  # (t_q + t_k - 1, H)
        rel = torch.arange(t_k - t_q, t_k, device=device)[:, None] - torch.arange(t_k, device=device)[None, :]
        return per_distance[rel + t_q - 1].permute(2, 0, 1)  # (t_q, t_k, H) -> (H, t_q, t_k)

    def flops(self, t: int) -> int:
        """Forward FLOPs per token at context t: the MLP once per distance, about 2 distances per token in a full
        pass (2t - 1 for t tokens); a decoded token needs t of them, fewer."""
        return 2 * linear_flops(self)
