"""How a stack applies its blocks, chosen by model options: which block each layer runs, and what runs around them.

They are options of the model, not registered parts: they decide how many blocks a stack builds and how it loops
over them (the seam in zoo/models/stack.py: `Stack.layer_blocks`, `Stack.depth`), not what a block holds.

- model.share_blocks (none | all | encoder | decoder): the stacks named run ONE block for every layer (ALBERT, Lan
  et al. 2020; Narang et al. 2021's "Block sharing", "Encoder only block sharing", "Decoder only block sharing"):
  `all` every stack (the encoder and the decoder of encoder_decoder each their own block), `encoder` the
  bidirectional stacks only, `decoder` the causal ones only. The block is built once (its parameters counted
  once), applied n_layers times (its FLOPs counted n_layers times); each application keeps its own KV-cache slot,
  as it sees its own inputs. The shared block is built with ctx.layer = the stack's first layer index.
- model.step_signal: the Universal Transformer's per-step signal (Dehghani et al. 2019): before step t = 1..n
  (layer t - 1) the state gets P^t = the positions + a sinusoid of t (sin(t / 10000^(2j/d)) at 2j, cos at 2j + 1).
  The stack's position scheme supplies the positions (the paper's sinusoid with position=sinusoidal; nothing with
  a rotary or bias scheme, which place positions in every layer anyway); the embedding already carries them, so
  step 1 adds the step's sinusoid alone.
- model.transparent_attention (encoder_decoder): transparent attention (Bapna et al. 2018): decoder layer j
  cross-attends to m_j = sum_i softmax_i(W[:, j]) h_i, h_0 the encoder's embedding output (each layer's input, its
  positions included) and h_i encoder layer i's output, each through the encoder's final norm (where its placement
  has one: so h_N is the plain memory); W (n_encoder_layers + 1, n_decoder_layers), 0 at init (an even mix).
- model.act: adaptive computation time over the layers (Graves 2016), as the Universal Transformer's code (the
  listing in its appendix, tensor2tensor's ut_act) computes it: a halting unit p = sigmoid(w . s + b) (b = 1 at
  init) per position and step, halting once the sum of p passes act_threshold, the remainder given to the
  halting step; the output is y_t = w_t s'_t + (1 - w_t) y_{t-1} with w_t = p (running), the remainder (halting)
  or 0 (halted), s'_t the block's output. ponder_cost x mean(steps + remainder) over the real tokens is added to
  the loss (aux_losses "act_ponder"). Every step runs for every position (a halted position's state goes on
  through the blocks, with weight 0 in y): the output equals the paper's loop, which stops once all have halted,
  and every step's KV-cache slot holds every position's keys and values, so cached decoding equals
  recomputation whatever halts where.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.component import Context, is_number, need
from zoo.registry import MODEL
from zoo.schema import ModelSpec

SHARE_BLOCKS = ("none", "all", "encoder", "decoder")


def check(cfg: ModelSpec) -> None:
    """The depth options' own constraints, one line each."""
    need(cfg.share_blocks in SHARE_BLOCKS, "share_blocks",
         f"unknown {cfg.share_blocks!r}; valid: {', '.join(SHARE_BLOCKS)}")
    stacks = MODEL.get(cfg.name).stacks
    need(cfg.share_blocks in ("none", "all", *stacks), "share_blocks",
         f"{cfg.name} has no {cfg.share_blocks} stack; valid: none, all, {', '.join(stacks)}")
    need(cfg.share_blocks == "none" or cfg.value_embeddings == 0, "share_blocks",
         "not with value_embeddings (the layers sharing a block would read different tables); valid: none")
    need(not cfg.step_signal or cfg.memory_tokens == 0, "step_signal",
         "not with memory_tokens (the memory has no position to re-add at each step); valid: false")
    need(not cfg.transparent_attention or MODEL.get(cfg.name).needs_source, "transparent_attention",
         f"{cfg.name} has no decoder that cross-attends to an encoder; valid: false, or model encoder_decoder")
    need(not (cfg.transparent_attention and cfg.act), "transparent_attention",
         "not with act (an encoder layer's output under ACT is not the state the stack passes on); valid: false")
    need(is_number(cfg.act_threshold) and 0 < cfg.act_threshold <= 1, "act_threshold",
         f"got {cfg.act_threshold!r}; valid: a number in (0, 1] (the paper's 1 - 0.01)")
    need(is_number(cfg.ponder_cost) and cfg.ponder_cost >= 0, "ponder_cost",
         f"got {cfg.ponder_cost!r}; valid: a number >= 0 (the paper's 0.01)")


def layer_blocks(cfg: ModelSpec, n_layers: int, causal: bool) -> list[int]:
    """The block each of a stack's layers applies: layer i its own block i, or block 0 for every layer where
    model.share_blocks names this stack (causal: a decoder)."""
    shared = cfg.share_blocks in ("all", "decoder" if causal else "encoder")
    return [0] * n_layers if shared else list(range(n_layers))


def step_sinusoid(step: int, d: int, like: torch.Tensor) -> torch.Tensor:
    """(d,): sin(step / 10000^(2j/d)) at 2j, cos(step / 10000^(2j/d)) at 2j + 1 (the sinusoid of positions, in t)."""
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device=like.device) / d)
    out = torch.zeros(d, dtype=torch.float64, device=like.device)
    out[0::2] = torch.sin(step * inv_freq)
    out[1::2] = torch.cos(step * inv_freq)[: d // 2]
    return out.to(like.dtype)


Layer = Callable[[int, torch.Tensor], torch.Tensor]  # (layer index, state) -> the layer's block applied to it


class Depth(nn.Module):
    """A stack's loop over its layers: x = layer(i, x) for i = 0..n-1, with the step signal and ACT (above) where
    the model asks for them. Its parameters: ACT's halting unit (d_model + 1), counted with the FFNs."""

    count_as = "ffn"

    def __init__(self, cfg: ModelSpec, ctx: Context, n_layers: int):
        super().__init__()
        self.n_layers, self.step_signal, self.act = n_layers, cfg.step_signal, cfg.act
        self.threshold, self.ponder_cost = cfg.act_threshold, cfg.ponder_cost
        if self.act:  # the halting unit: one weight vector and a scalar bias, 1 at init (tensor2tensor's)
            self.halt_weight = nn.Parameter(torch.empty(ctx.d_model))
            self.halt_bias = nn.Parameter(torch.empty(()))
            self.constants = {"halt_bias": 1.0}
        self.aux_losses: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor, layer: Layer, position: nn.Module, offset: int,
                padding: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d) -> (B, T, d). position: the stack's (re-added at each step); offset: x's first position;
        padding (B, T): True for real tokens (the ponder cost averages over them)."""
        if not (self.step_signal or self.act):
            for i in range(self.n_layers):
                x = layer(i, x)
            return x
        b, t, d = x.shape
        # per position: the sum of p so far, the remainder, the steps taken, and whether it has halted (kept apart
        # from the sum: sum + remainder can round to just under 1)
        halted, remainder, steps, done = (x.new_zeros(b, t) for _ in range(4))
        y = torch.zeros_like(x)
        for i in range(self.n_layers):
            if self.step_signal:  # P^t: the positions (already in the embedding at step 1) and the step's sinusoid
                x = (position.embed(x, offset) if i else x) + step_sinusoid(i + 1, d, x)
            if self.act:
                p = torch.sigmoid(x @ self.halt_weight + self.halt_bias)  # (B, T)
                running = 1 - done
                new_halted = (halted + p * running > self.threshold).to(x.dtype) * running
                running = running - new_halted
                halted = halted + p * running
                remainder = remainder + new_halted * (1 - halted)
                done = done + new_halted
                steps = steps + running + new_halted
                w = (p * running + new_halted * remainder)[..., None]  # this step's share of the output
            x = layer(i, x)
            if self.act:
                y = x * w + y * (1 - w)
        if not self.act:
            return x
        cost = steps + remainder
        mean = cost.mean() if padding is None else cost[padding].mean()
        self.aux_losses = {"act_ponder": self.ponder_cost * mean}
        return y

    def flops(self, t: int) -> int:
        """The halting unit's product per token and step."""
        return 2 * self.n_layers * self.halt_weight.numel() if self.act else 0


class TransparentMix(nn.Module):
    """The encoder's states (N + 1, B, S, d) -> decoder layer j's memory, sum_i softmax(W[:, j])_i states[i], for
    every j: (M, B, S, d). W (N + 1, M), counted with the attention."""

    count_as = "attention"
    constants = {"weight": 0.0}  # an even mix at init

    def __init__(self, cfg: ModelSpec, n_decoder_layers: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.n_layers + 1, n_decoder_layers))
        self.d_model = cfg.d_model

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        need(states.dim() == 4 and states.shape[0] == self.weight.shape[0], "transparent_attention",
             f"the decoder needs the encoder's {self.weight.shape[0]} states (encode() gives them), got a memory of "
             f"shape {tuple(states.shape)}")
        return torch.einsum("im,ibsd->mbsd", self.weight.softmax(0).to(states.dtype), states)

    def flops(self, t: int) -> int:
        """The mixes, per source token (zoo counts an encoder_decoder per target token, with a source as long)."""
        return 2 * self.weight.numel() * self.d_model
