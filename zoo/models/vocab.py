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
- model.adaptive_input / model.adaptive_softmax with model.adaptive_cutoffs [c_0, c_1, ...]: the vocabulary cut
  into clusters [0, c_0), [c_0, c_1), ..., [c_last, vocab), ids taken to be in order of frequency; cluster i is
  d_model / adaptive_div^i wide. Adaptive input (Baevski and Auli 2019): a token's vector is its cluster's table
  row, projected to d_model (cluster 0, d_model wide, as is). Adaptive softmax (Grave et al. 2017): a head softmax
  over cluster 0's tokens and one entry per tail cluster, and per tail a softmax over its tokens from h projected
  to the cluster's width; log P(x) = log P_head(cluster of x) + log P_tail(x). The head returns log P for the
  whole vocabulary (torch.nn.AdaptiveLogSoftmaxWithLoss.log_prob's layout), which the loss and sampling read
  as they read the mixture's; so every tail is computed for every token: the parameters and FLOPs shrink with
  the tails' widths, but the paper's training shortcut (a tail only for the tokens whose target is in it) is
  not taken. Tied (both on, model.tie_embeddings), the two share cluster 0's table, the tails' tables and their
  projections, as Baevski and Auli's.
- model.tie_embeddings: the head reads the (decoder's) token table; model.tie_encoder_decoder (encoder_decoder):
  the encoder reads the decoder's token embedding, else one of its own.

Each head declares count_as = "head" and its FLOPs per token (zoo.build.flops_per_token asks it). A head tied to
the embedding holds the table by reference, outside its own parameters, so the table counts once, as an embedding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import is_int, is_number, linear_flops, need
from zoo.models.stack import Readout, ScaledLinear
from zoo.mup import output_scale, scaled
from zoo.registry import MODEL
from zoo.spec import ModelSpec


def check(cfg: ModelSpec) -> None:
    """The embedding and head options, each refused in one line where it cannot work."""
    k, e = cfg.softmaxes, cfg.embed_dim
    need(is_int(k) and k >= 1, "softmaxes", f"must be a positive integer, got {k!r} (1: one softmax)")
    need(e is None or (is_int(e) and e >= 1), "embed_dim", f"must be a positive integer or null, got {e!r}")
    check_adaptive(cfg)
    need(cfg.tie_encoder_decoder or MODEL.get(cfg.name).needs_source, "tie_encoder_decoder",
         f"only an encoder_decoder has two embeddings to untie, not {cfg.name}; valid: true")


def check_adaptive(cfg: ModelSpec) -> None:
    cut, on = cfg.adaptive_cutoffs, cfg.adaptive_input or cfg.adaptive_softmax
    need(not on or cut is not None, "adaptive_cutoffs", "required by adaptive_input and adaptive_softmax; valid: "
         f"increasing ids between 1 and vocab_size - 1 = {cfg.vocab_size - 1}, e.g. [{cfg.vocab_size // 4}]")
    if not on:
        return
    assert cut is not None
    need(len(cut) >= 1 and all(is_int(c) for c in cut) and list(cut) == sorted(set(cut))
         and 0 < cut[0] and cut[-1] < cfg.vocab_size, "adaptive_cutoffs",
         f"got {cut!r}; valid: increasing ids between 1 and vocab_size - 1 = {cfg.vocab_size - 1}")
    div = cfg.adaptive_div
    need(is_number(div) and div >= 1 and cfg.d_model // div ** len(cut) >= 1, "adaptive_div",
         f"got {div!r}; valid: a number >= 1 that leaves the last of {len(cut) + 1} clusters at least 1 wide "
         f"(d_model {cfg.d_model} / div^{len(cut)})")
    for key in ("embed_dim", "softmaxes"):
        need(getattr(cfg, key) in (None, 1), key, "not with adaptive_input or adaptive_softmax (the clusters "
             "already set the widths and the softmax); valid: " + ("null" if key == "embed_dim" else "1"))
    need(cfg.parametrization == "standard", "parametrization",
         "adaptive embeddings and softmax have no muP roles; valid: standard")
    need(cfg.logit_softcap is None or not cfg.adaptive_softmax, "logit_softcap",
         "not with adaptive_softmax (it has no single set of logits to cap); valid: null")
    need(not cfg.tie_embeddings or cfg.adaptive_input == cfg.adaptive_softmax, "tie_embeddings",
         "an adaptive softmax ties only to adaptive input embeddings (and they only to it); valid: false, or both "
         "adaptive_input and adaptive_softmax true")


def cluster_widths(cfg: ModelSpec) -> list[tuple[int, int, int]]:
    """(first id, end id, width) of each cluster: cluster i is d_model // adaptive_div^i wide."""
    assert cfg.adaptive_cutoffs is not None
    bounds = [0, *cfg.adaptive_cutoffs, cfg.vocab_size]
    return [(lo, hi, int(cfg.d_model // cfg.adaptive_div ** i)) for i, (lo, hi) in
            enumerate(zip(bounds[:-1], bounds[1:], strict=True))]


def token_embedding(cfg: ModelSpec) -> nn.Module:
    """tokens (B, T) -> (B, T, d_model): the lineage's token embedding."""
    check(cfg)
    if cfg.adaptive_input:
        return AdaptiveEmbedding(cfg)
    if cfg.embed_dim is not None:
        return FactorizedEmbedding(cfg)
    return nn.Embedding(cfg.vocab_size, cfg.d_model)


def output_head(cfg: ModelSpec, d_in: int, bias: bool, embed: nn.Module) -> nn.Module:
    """hidden (..., d_in) -> logits (..., vocab), or normalised log-probabilities (a mixture): the lineage's head,
    tied to `embed` (the token embedding it built) where model.tie_embeddings."""
    tied = embed if cfg.tie_embeddings else None
    if cfg.adaptive_softmax:
        return AdaptiveSoftmax(cfg, d_in, tied)
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
    """x (..., width) -> logits (..., vocab) = (scale x) W^T + b, W its own (vocab, width) or a tied table's, read
    by reference (not a parameter of this module); capped by model.logit_softcap as Readout's are. scale: muP's
    output multiplier where `width` grows with d_model (zoo.mup), else 1."""

    readout = True  # the output layer (zoo.optim.muon leaves it to AdamW)

    def __init__(self, cfg: ModelSpec, width: int, bias: bool, tied: nn.Module | None, scale: float = 1.0):
        super().__init__()
        self.scale = scale
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
        logits = F.linear(scaled(x, self.scale), self.table(), self.bias)
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
    share one factorization; untied: a map and a table of its own.

    Under muP the map from d_model is the readout (embed_dim does not grow with width): a ScaledLinear, or tied,
    the embedding's projection behind the same multiplier; the table after it is as wide at every width."""

    count_as = "head"

    def __init__(self, cfg: ModelSpec, d_in: int, bias: bool, tied: nn.Module | None):
        super().__init__()
        assert cfg.embed_dim is not None
        self.tied: tuple[nn.Module, ...] = () if tied is None else (tied,)  # by reference, as VocabProjection
        self.down = None if tied is not None else ScaledLinear(cfg, d_in, cfg.embed_dim, bias=False)
        self.out = VocabProjection(cfg, cfg.embed_dim, bias, tied)
        self.scale = output_scale(cfg)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.down is not None:
            return self.out(self.down(h))
        return self.out(scaled(h, self.scale) @ self.tied[0].proj.weight)  # tied

    def flops(self, t: int) -> int:
        return 2 * self.out.table().numel() + 2 * (self.down or self.tied[0].proj).weight.numel()


class MixtureOfSoftmaxes(nn.Module):
    """log P(x | h) = log sum_k pi_k softmax(W h_k)_x, h_k = tanh(P_k h), pi = softmax(w_pi h) (Yang et al. 2018).

    W is the output table (the token embedding when tied, as the paper's); the K latents are as wide as it. The
    mixture is taken in float32 at least (a logsumexp over K), whatever the autocast. Under muP (zoo.mup), w_pi
    is a readout (K does not grow with width), and so are P_k where model.embed_dim fixes the latents' width;
    else P_k are hidden weights and W is the readout, the latents multiplied by muP's output multiplier."""

    count_as = "head"

    def __init__(self, cfg: ModelSpec, d_in: int, bias: bool, tied: nn.Module | None):
        super().__init__()
        self.k, width = cfg.softmaxes, cfg.embed_dim or cfg.d_model
        fixed = cfg.embed_dim is not None  # the latents' width does not grow with d_model
        self.prior = ScaledLinear(cfg, d_in, self.k, bias=False)  # w_pi
        self.latent = (ScaledLinear(cfg, d_in, self.k * width, bias) if fixed  # P_1 .. P_K, one matrix
                       else nn.Linear(d_in, self.k * width, bias=bias))
        self.out = VocabProjection(cfg, width, bias, tied, scale=1.0 if fixed else output_scale(cfg))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        log_prior = wide(self.prior(h)).log_softmax(-1)  # (..., K)
        latents = torch.tanh(self.latent(h)).unflatten(-1, (self.k, -1))  # (..., K, width)
        log_p = wide(self.out(latents)).log_softmax(-1)  # (..., K, vocab): each component's softmax
        return (log_prior.unsqueeze(-1) + log_p).logsumexp(-2)  # (..., vocab)

    def flops(self, t: int) -> int:
        """The prior, the K latents, and K products with the output table (the softmaxes' exps not counted)."""
        return linear_flops(self) + self.k * self.out.flops()


class AdaptiveEmbedding(nn.Module):
    """Adaptive input (Baevski and Auli 2019): cluster i's tokens read a table of width d_model / div^i, projected
    to d_model by proj[i] (width, d_model); cluster 0 is d_model wide and not projected."""

    count_as = "embedding"

    def __init__(self, cfg: ModelSpec):
        super().__init__()
        self.clusters = cluster_widths(cfg)
        self.tables = nn.ModuleList(nn.Embedding(hi - lo, w) for lo, hi, w in self.clusters)
        # proj[i - 1] maps tail cluster i to d_model; stored (width, d_model), as the tied softmax's tail projection
        self.proj = nn.ParameterList(nn.Parameter(torch.empty(w, cfg.d_model)) for _, _, w in self.clusters[1:])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.tables[0](tokens.clamp(max=self.clusters[0][1] - 1))  # (B, T, d_model); tails overwritten
        for (lo, hi, _), table, proj in zip(self.clusters[1:], self.tables[1:], self.proj, strict=True):
            inside = (tokens >= lo) & (tokens < hi)
            out = out.masked_scatter(inside[..., None], (table(tokens[inside] - lo) @ proj).to(out.dtype))
        return out

    def flops(self, t: int) -> int:
        """A token's vector passes through one cluster's projection: the widest tail's, at most."""
        return max((2 * p.numel() for p in self.proj), default=0)


class AdaptiveSoftmax(nn.Module):
    """Adaptive softmax (Grave et al. 2017) as log-probabilities over the whole vocabulary (torch's
    AdaptiveLogSoftmaxWithLoss.log_prob): a head over cluster 0's tokens and one entry per tail, a tail softmax
    over each tail cluster's tokens from h projected to its width. No biases. Tied: cluster 0's rows, the tails'
    tables and projections are the adaptive input's, read by reference."""

    count_as = "head"

    def __init__(self, cfg: ModelSpec, d_in: int, tied: nn.Module | None):
        super().__init__()
        self.clusters = cluster_widths(cfg)
        self.tied: tuple[nn.Module, ...] = () if tied is None else (tied,)
        self.cluster_logits = nn.Parameter(torch.empty(len(self.clusters) - 1, d_in))  # the head's tail entries
        if tied is None:
            self.tables = nn.ParameterList(nn.Parameter(torch.empty(hi - lo, w)) for lo, hi, w in self.clusters)
            self.proj = nn.ParameterList(nn.Parameter(torch.empty(w, d_in)) for _, _, w in self.clusters[1:])

    def weights(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each cluster's table (size, width) and each tail's projection (width, d_model): its own or tied."""
        if self.tied:
            embed = self.tied[0]
            return [t.weight for t in embed.tables], list(embed.proj)
        return list(self.tables), list(self.proj)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        tables, proj = self.weights()
        head = wide(h @ torch.cat([tables[0], self.cluster_logits]).T).log_softmax(-1)  # (..., c_0 + tails)
        n0 = tables[0].shape[0]
        parts = [head[..., :n0]]
        for i, (table, p) in enumerate(zip(tables[1:], proj, strict=True)):
            tail = wide((h @ p.T) @ table.T).log_softmax(-1)  # (..., cluster size)
            parts.append(head[..., n0 + i, None] + tail)
        return torch.cat(parts, -1)  # (..., vocab): log P

    def flops(self, t: int) -> int:
        """The head and every tail (all are computed: the output is the whole distribution)."""
        tables, proj = self.weights()
        return 2 * (tables[0].numel() + self.cluster_logits.numel()) + sum(
            2 * p.numel() + 2 * table.numel() for table, p in zip(tables[1:], proj, strict=True))
