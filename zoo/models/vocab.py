"""The token embedding and the output head of every lineage, and their variants, chosen by model options.

They are options of the model (`model.softmaxes`, ...), not registered parts: every lineage has one embedding and one
head, built here by `token_embedding(cfg)` and `output_head(cfg, ...)`, so one option works in all three lineages.
With every option at its default they are the plain `nn.Embedding` and `Readout` (zoo/models/stack.py), so a
model's parameters and their names are unchanged.

- model.softmaxes = K > 1: a mixture of softmaxes (Yang et al. 2018, "Breaking the Softmax Bottleneck"):
  P(x | h) = sum_k pi_k softmax(W tanh(P_k h))_x, pi = softmax(w_pi h). The head returns log P: normalised
  log-probabilities, not logits. Every consumer of logits stays right without a branch: cross-entropy applies
  log_softmax, and log_softmax(log P) = log P since sum P = 1, so the loss is -log P(target); sampling applies
  softmax(log P / temperature), which at temperature 1 is P itself, the mixture.
- model.embed_dim = E: factorized embeddings (ALBERT, Lan et al. 2020): a (vocab, E) table, then a linear map
  E -> d_model. The head goes through the same factorization: tied, logits = (h P) T^T with the embedding's own
  projection P (d_model, E) and table T; untied, a (d_model -> E) map and a (vocab, E) table of its own.
- model.tie_embeddings: the head reads the (decoder's) token table; model.tie_encoder_decoder (encoder_decoder):
  the encoder reads the decoder's token embedding, else one of its own.

Each head declares count_as = "head" and its FLOPs per token (zoo.build.flops_per_token asks it). A head tied to
the embedding holds the table by reference, outside its own parameters, so the table counts once, as an embedding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import is_int, linear_flops, need
from zoo.models.stack import Readout
from zoo.schema import ModelSpec


def check(cfg: ModelSpec) -> None:
    """The embedding and head options, each refused in one line where it cannot work."""
    k, e = cfg.softmaxes, cfg.embed_dim
    need(is_int(k) and k >= 1, "softmaxes", f"must be a positive integer, got {k!r} (1: one softmax)")
    need(k == 1 or cfg.parametrization == "standard", "softmaxes",
         "a mixture of softmaxes is not defined under parametrization=mup (muP's output multiplier is for one "
         "linear readout); valid: 1 with mup")
    need(e is None or (is_int(e) and e >= 1), "embed_dim", f"must be a positive integer or null, got {e!r}")
    need(e is None or cfg.parametrization == "standard", "embed_dim",
         "factorized embeddings are not defined under parametrization=mup (its projection has no muP role); "
         "valid: null with mup")
    need(cfg.tie_encoder_decoder or cfg.name == "encoder_decoder", "tie_encoder_decoder",
         f"only an encoder_decoder has two embeddings to untie, not {cfg.name}; valid: true")


def token_embedding(cfg: ModelSpec) -> nn.Module:
    """tokens (B, T) -> (B, T, d_model): the lineage's token embedding."""
    check(cfg)
    if cfg.embed_dim is not None:
        return FactorizedEmbedding(cfg)
    return nn.Embedding(cfg.vocab_size, cfg.d_model)


def output_head(cfg: ModelSpec, d_in: int, bias: bool, embed: nn.Module) -> nn.Module:
    """hidden (..., d_in) -> logits (..., vocab), or normalised log-probabilities (a mixture): the lineage's head,
    tied to `embed` (the token embedding it built) where model.tie_embeddings."""
    tied = embed if cfg.tie_embeddings else None
    if cfg.softmaxes > 1:
        return MixtureOfSoftmaxes(cfg, d_in, bias, tied)
    if cfg.embed_dim is not None:
        return FactorizedHead(cfg, d_in, bias, tied)
    head = Readout(cfg, d_in, cfg.vocab_size, bias=bias)
    if tied is not None:
        head.weight = tied.weight
    return head


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32 at least (bfloat16 and float16 widened; float64 kept): for sums of probabilities."""
    return x.float() if x.element_size() < 4 else x


class VocabProjection(nn.Module):
    """x (..., width) -> logits (..., vocab) = x W^T + b, W its own (vocab, width) or a tied table's, read by
    reference (not a parameter of this module); capped by model.logit_softcap as Readout's are."""

    readout = True  # the output layer (zoo.optim.muon leaves it to AdamW)

    def __init__(self, cfg: ModelSpec, width: int, bias: bool, tied: nn.Module | None):
        super().__init__()
        self.tied: tuple[nn.Module, ...] = () if tied is None else (tied,)  # a tuple: not registered as a child
        self.weight = None if tied is not None else nn.Parameter(torch.empty(cfg.vocab_size, width))
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if bias else None
        self.softcap = cfg.logit_softcap

    def table(self) -> torch.Tensor:
        """W (vocab, width): its own, or the tied table's."""
        weight = self.tied[0].weight if self.tied else self.weight
        assert weight is not None
        return weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.table(), self.bias)
        return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)

    def flops(self) -> int:
        return 2 * self.table().numel()


class FactorizedEmbedding(nn.Module):
    """tokens -> P T[tokens]: a (vocab, embed_dim) table and a linear map embed_dim -> d_model, no bias (ALBERT)."""

    count_as = "embedding"  # both matrices; its FLOPs (the projection) are asked of it

    def __init__(self, cfg: ModelSpec):
        super().__init__()
        assert cfg.embed_dim is not None
        self.table = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        self.proj = nn.Linear(cfg.embed_dim, cfg.d_model, bias=False)

    @property
    def weight(self) -> torch.Tensor:
        """The token table (vocab, embed_dim): what a tied head reads."""
        return self.table.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.proj(self.table(tokens))


class FactorizedHead(nn.Module):
    """h (..., d_model) -> logits: h mapped to embed_dim, then its products with a (vocab, embed_dim) table. Tied:
    the embedding's own projection, transposed, and its table (both read by reference), so input and output
    share one factorization; untied: a map and a table of its own."""

    count_as = "head"

    def __init__(self, cfg: ModelSpec, d_in: int, bias: bool, tied: nn.Module | None):
        super().__init__()
        assert cfg.embed_dim is not None
        self.tied: tuple[nn.Module, ...] = () if tied is None else (tied,)  # by reference, as VocabProjection
        self.down = None if tied is not None else nn.Linear(d_in, cfg.embed_dim, bias=False)
        self.out = VocabProjection(cfg, cfg.embed_dim, bias, tied)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        z = self.down(h) if self.down is not None else h @ self.tied[0].proj.weight  # (..., embed_dim)
        return self.out(z)

    def flops(self, t: int) -> int:
        return 2 * self.out.table().numel() + 2 * (self.down or self.tied[0].proj).weight.numel()


class MixtureOfSoftmaxes(nn.Module):
    """log P(x | h) = log sum_k pi_k softmax(W h_k)_x, h_k = tanh(P_k h), pi = softmax(w_pi h) (Yang et al. 2018).

    W is the output table (the token embedding when tied, as the paper's); the K latents are as wide as it. The
    mixture is taken in float32 at least (a logsumexp over K), whatever the autocast."""

    count_as = "head"

    def __init__(self, cfg: ModelSpec, d_in: int, bias: bool, tied: nn.Module | None):
        super().__init__()
        self.k, width = cfg.softmaxes, cfg.embed_dim or cfg.d_model
        self.prior = nn.Linear(d_in, self.k, bias=False)  # w_pi
        self.latent = nn.Linear(d_in, self.k * width, bias=bias)  # P_1 .. P_K, one matrix
        self.out = VocabProjection(cfg, width, bias, tied)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        log_prior = wide(self.prior(h)).log_softmax(-1)  # (..., K)
        latents = torch.tanh(self.latent(h)).unflatten(-1, (self.k, -1))  # (..., K, width)
        log_p = wide(self.out(latents)).log_softmax(-1)  # (..., K, vocab): each component's softmax
        return (log_prior.unsqueeze(-1) + log_p).logsumexp(-2)  # (..., vocab)

    def flops(self, t: int) -> int:
        """The prior, the K latents, and K products with the output table (the softmaxes' exps not counted)."""
        return linear_flops(self) + self.k * self.out.flops()
