"""Autoregressive generation with a KV cache: greedy, temperature, top-k and top-p sampling.

Works for `decoder_only` (continue a prompt) and `encoder_decoder` (decode a target for a source).
With `use_cache=False` every step recomputes the whole sequence; the tests check both agree.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zoo.build import is_int
from zoo.layers.position import unlimited_positions
from zoo.registry import MODEL
from zoo.spec import sampling_error  # torch-free: the CLI checks its flags before torch loads


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits (B, V) -> next token ids (B,). temperature 0 means greedy (argmax)."""
    if error := sampling_error(temperature=temperature, top_k=top_k, top_p=top_p):
        raise ValueError(error)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits: expected a float tensor (batch, vocab), got {_describe(logits)}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        # Keep the smallest set of tokens whose probabilities sum to at least top_p (nucleus sampling).
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_logits.softmax(dim=-1) >= top_p  # mass before this token already enough
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _describe(x: Any) -> str:
    return f"{x.dtype} of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def check_ids(name: str, ids: Any, vocab_size: int | None) -> None:
    """`ids` must be a (batch >= 1, length >= 1) integer tensor of ids in [0, vocab_size)."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.is_complex() \
            or ids.dtype == torch.bool or 0 in ids.shape:
        raise ValueError(f"{name}: expected an integer tensor (batch >= 1, length >= 1), got {_describe(ids)}")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        raise ValueError(f"{name}: id {low if low < 0 else high} is outside the model's vocabulary "
                         f"(0..{vocab_size - 1 if vocab_size is not None else ''})")


def position_limit(model: nn.Module) -> int | None:
    """The longest sequence the model's positions can place (learned positions: max_seq_len), or None when any
    length works: asked of every position module with a hard limit."""
    limits = [m.max_len for m in model.modules() if getattr(m, "hard_limit", False) and m.max_len is not None]
    return min(limits) if limits else None


def check_length(model: nn.Module, total: int) -> None:
    """Learned positions cannot go past max_seq_len: fail before generating anything."""
    limit = position_limit(model)
    if limit is not None and total > limit:
        raise ValueError(f"generating to length {total} needs positions past max_seq_len={limit} of learned "
                         "positions; shorten the prompt or max_new_tokens, use slide=True (condition on the last "
                         f"{limit} tokens), or use position={'/'.join(unlimited_positions())}")


def generating_models() -> list[str]:
    """The registered lineages that continue a prompt token by token."""
    return [name for name in MODEL.names() if getattr(MODEL.get(name), "generates", False)]


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, src: torch.Tensor | None = None,
             src_padding: torch.Tensor | None = None, eos_id: int | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None, slide: bool = False) -> torch.Tensor:
    """Extend `prompt` (B, T) by up to max_new_tokens tokens and return (B, T + new).

    A model with a hard position limit (learned positions) fails past it, unless `slide`: then each
    token is predicted from the last `limit` tokens only (the cache is dropped and the window recomputed
    every step once the text is longer than the limit), as GPT-2 and nanoGPT sample past their block size.

    decoder_only: prompt is the text so far. encoder_decoder: `src` (B, S) is the source and
    `prompt` the decoder's start (e.g. a BOS column). Stops early once every row has produced
    eos_id; rows that finished earlier are padded with eos_id."""
    if error := sampling_error(max_new_tokens, temperature, top_k, top_p):
        raise ValueError(error)
    spec = getattr(model, "cfg", None)  # a zoo model's ModelSpec; any other module: nothing to check against
    vocab_size = getattr(spec, "vocab_size", None)
    check_ids("prompt", prompt, vocab_size)
    if src is not None:
        check_ids("src", src, vocab_size)
    if eos_id is not None and not (is_int(eos_id) and 0 <= eos_id and (vocab_size is None or eos_id < vocab_size)):
        raise ValueError(f"eos_id: got {eos_id!r}; valid: an id of the model's vocabulary, or None")
    name = getattr(spec, "name", None)
    if not getattr(model, "generates", False):
        raise ValueError(f"model '{name}' does not generate; generation needs {', '.join(generating_models())}")
    if model.needs_source and src is None:
        raise ValueError(f"{name} generation needs src (the source tokens)")
    window = position_limit(model) if slide else None
    if window is None:
        check_length(model, prompt.shape[1] + max_new_tokens)
    was_training = model.training
    model.eval()
    memory = model.encode(src, src_padding) if src is not None else None

    def logits_of(tokens: torch.Tensor, cache) -> torch.Tensor:
        # Only the last position is sampled from: run the output head on it alone (a large vocabulary
        # makes the head the most expensive matrix product of a prefill).
        hidden = model.decoder(tokens, memory=memory, memory_padding=src_padding, cache=cache)
        return model.head(hidden[:, -1:])

    cache = model.new_cache() if use_cache else None
    out, step_input, sliding = prompt, prompt, False
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    for _ in range(max_new_tokens):
        if window is not None and out.shape[1] > window:  # the next position would be past the last learned one
            sliding, cache, step_input = True, None, out[:, -window:]
        logits = logits_of(step_input, cache)[:, -1]
        nxt = sample_next(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            nxt = nxt.masked_fill(done, eos_id)
            done |= nxt == eos_id
        out = torch.cat([out, nxt[:, None]], dim=1)
        step_input = nxt[:, None] if use_cache and not sliding else out
        if eos_id is not None and bool(done.all()):
            break
    model.train(was_training)
    return out
