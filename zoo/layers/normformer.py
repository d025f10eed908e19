"""NormFormer (Shleifer et al. 2021): three additions to a Pre-LN Transformer, each on its own switch so each can
be compared alone, all three at once with `experiment=normformer` (conf/experiment/normformer.yaml):

- a norm after self- and cross-attention, before the residual add: the placement `normformer` here
  (`norm=normformer_ln`, `normformer_rms`): x + norm_out(attn(norm(x))) for an attention, x + ffn(norm(x)) for
  the FFN, which the paper leaves to its third addition. A placement tells the two apart by asking the sublayer:
  an attention declares n_kv_heads (zoo.component.AttentionPart);
- head scaling: each head's output times a learned scalar from 1, `model.attention.head_scale=true`
  (zoo/layers/attention.py; x-transformers' attn_head_scale);
- a norm after the FFN's activation, over d_ff: `model.ffn.post_act_norm=true` (zoo/layers/ffn.py; x-transformers'
  ff_post_act_ln).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.registry import RESIDUAL


@RESIDUAL.register("normformer")
class NormFormer(nn.Module):
    """x + norm_out(f(norm(x))) when f attends, else x + f(norm(x))."""

    final_norm, parallel = True, False

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f = make_norm(), f
        self.norm_out = make_norm() if hasattr(f, "n_kv_heads") else nn.Identity()

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return x + self.norm_out(self.f(self.norm(x), **kw))
