"""ffn=moe: a sparse mixture of experts in place of the dense FFN (Shazeer et al. 2017; Switch; Mixtral).

A router (a linear layer, no bias) gives each token a softmax over `n_experts`; the token goes to its
`top_k` most probable experts and the output is their outputs weighted by gates:
- top_k >= 2: the chosen probabilities renormalised to sum to 1, as Mixtral;
- top_k = 1: the chosen probability itself, as Switch (renormalised it would always be 1, and the
  router would learn from the auxiliary losses alone).
No token is dropped (no capacity factor); every position is routed and counted in the losses, padding
included (an FFN does not see the padding mask). Each expert is any registered FFN (`expert`), built through
the FFN registry, so it keeps its own init roles (its `down` is depth-scaled like a dense FFN's).

Auxiliary losses, left in `self.aux_losses` for the objective (zoo.component.aux_losses), already weighted:
- moe_balance = balance_weight * N * sum_i f_i * P_i (Switch, eq. 4): f_i the fraction of the T * top_k
  assignments that went to expert i, P_i the mean router probability of expert i. 1 under uniform routing,
  N when every token goes to one expert with probability 1; its gradient reaches the router through P.
  (Hugging Face's Mixtral counts f per slot: its value is top_k times this one.)
- moe_z = z_weight * mean over tokens of logsumexp(router logits)^2 (ST-MoE): keeps the logits small.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import Context, Options, declared, linear_flops, need, option_fields
from zoo.registry import FFN


@dataclass(kw_only=True)
class MoEOptions(Options):
    n_experts: int = 8
    top_k: int = 2  # experts per token
    expert: str = "swiglu"  # any registered FFN but moe
    d_ff: int | None = None  # each expert's hidden size; null: the expert's default
    widths: ClassVar[tuple[str, ...]] = ("d_ff",)  # options that grow with d_model (zoo.mup scales them along)
    balance_weight: float = 0.01  # load-balancing loss weight (Switch uses 0.01)
    z_weight: float = 0.001  # router z-loss weight (ST-MoE uses 0.001)


def expert_names() -> list[str]:
    return [n for n in FFN.names() if FFN.get(n) is not MoE]


class MoE(nn.Module):
    count_as = "ffn"

    def __init__(self, ctx: Context, opts: MoEOptions):
        super().__init__()
        need(opts.n_experts >= 1, "ffn.n_experts", f"must be a positive integer, got {opts.n_experts}")
        need(1 <= opts.top_k <= opts.n_experts, "ffn.top_k",
             f"must be between 1 and n_experts={opts.n_experts}, got {opts.top_k}")
        need(opts.expert in expert_names(), "ffn.expert",
             f"unknown expert {opts.expert!r}; valid: {', '.join(expert_names())}")
        need(opts.balance_weight >= 0, "ffn.balance_weight", f"must be >= 0, got {opts.balance_weight}")
        need(opts.z_weight >= 0, "ffn.z_weight", f"must be >= 0, got {opts.z_weight}")
        expert_opts = FFN.options(opts.expert)
        need(opts.d_ff is None or "d_ff" in option_fields(expert_opts), "ffn.d_ff",
             f"expert {opts.expert!r} has no d_ff; use null")
        sizes = {} if opts.d_ff is None else {"d_ff": opts.d_ff}
        self.n_experts, self.top_k = opts.n_experts, opts.top_k
        self.balance_weight, self.z_weight = opts.balance_weight, opts.z_weight
        self.router = nn.Linear(ctx.d_model, opts.n_experts, bias=False)
        self.experts = nn.ModuleList(FFN.get(opts.expert)(ctx, expert_opts(**sizes)) for _ in range(opts.n_experts))
        self.aux_losses: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # (T, d): routing is per token
        logits = self.router(tokens).float()
        probs = logits.softmax(-1)
        top_p, top_i = probs.topk(self.top_k, dim=-1)  # (T, k)
        gates = top_p if self.top_k == 1 else top_p / top_p.sum(-1, keepdim=True)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            # Every expert runs, on no tokens if none chose it: its parameters then get zero gradients
            # rather than none, so DDP finds every parameter used in every step.
            token, slot = (top_i == e).nonzero(as_tuple=True)
            y = expert(tokens.index_select(0, token)) * gates[token, slot, None].to(x.dtype)
            out = out.index_add(0, token, y)
        self.aux_losses = self.losses(logits, probs, top_i)
        return out.reshape(x.shape)

    def losses(self, logits: torch.Tensor, probs: torch.Tensor, top_i: torch.Tensor) -> dict[str, torch.Tensor]:
        """The weighted auxiliary losses of one routing (see the module docstring)."""
        share = F.one_hot(top_i, self.n_experts).float().sum((0, 1)) / top_i.numel()  # f: no gradient
        balance = self.n_experts * (share * probs.mean(0)).sum()
        z = logits.logsumexp(-1).square().mean()
        return {"moe_balance": self.balance_weight * balance, "moe_z": self.z_weight * z}

    @classmethod
    def resize(cls, opts: MoEOptions, size: int) -> MoEOptions:
        """Each expert's hidden size set to size (budget=params)."""
        return dataclasses.replace(opts, d_ff=size)

    def _expert_params(self) -> int:
        return sum(p.numel() for p in self.experts[0].parameters())

    def inactive_params(self) -> int:
        """Parameters a token does not use: those of the n_experts - top_k experts it was not sent to."""
        return (self.n_experts - self.top_k) * self._expert_params()

    def flops(self, t: int) -> int:
        """The router and top_k experts: the FLOPs one token costs."""
        return linear_flops(self.router) + self.top_k * declared(self.experts[0], "flops")(t)


FFN.register("moe", MoE, options=MoEOptions,
             examples=[{}, {"n_experts": 4, "top_k": 1, "expert": "gelu"}, {"n_experts": 1, "top_k": 1}])
