"""What the catalogue's attention reference tests share (tests/test_catalogue_*.py): a zoo attention and
x-transformers' Attention with the same weights, run on the same float64 inputs at odd shapes.

A pair (zoo parameter, transform, x-transformers parameter, added) says x-transformers' parameter is
transform(zoo's) + added; transform is linear (slices, head permutations), so its gradient is transform(zoo's
gradient). zoo shares key/value head g among query heads g * group .. (repeat_interleave); x-transformers among
heads g, g + kv_heads, ... (repeat): query heads are permuted between the two."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from zoo.block import NO_POSITION
from zoo.component import Context, build
from zoo.layers.attention import KVCache, attention_bias, cross_attention_mask
from zoo.registry import ATTENTION
from zoo.schema import Part

Pair = tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor], torch.Tensor, float | torch.Tensor]
B, T = 2, 13  # odd shapes: with 3 heads of 4 (d_model 12), or 6 heads sharing 3 or 2 key/value heads


def zoo_attention(name: str, d_model: int, n_heads: int, cross: bool = False, causal: bool = False,
                  max_seq_len: int = 64, **options) -> torch.nn.Module:
    """A zoo attention alone, float64, no biases (x-transformers' projections have none), weights ~ N(0, 0.3)."""
    ctx = Context(d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, bias=False, cross=cross, causal=causal)
    attn = build(ATTENTION, Part(name, ATTENTION.options(name)(**options)), ctx).double()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    return attn


def head_order(attn) -> torch.Tensor:
    """x-transformers' query head j -> zoo's query head (the same key/value head, the same place in its group)."""
    H, kv = attn.n_heads, attn.n_kv_heads
    return torch.tensor([(j % kv) * (H // kv) + j // kv for j in range(H)])


def projection_pairs(attn, xt) -> list[Pair]:
    """zoo's q, k, v (fused, or q and kv when cross-attending) and out -> x-transformers' to_q, to_k, to_v, to_out."""
    return qkv_pairs(attn, xt) + [(attn.out.weight, head_columns(attn), xt.to_out.weight, 0.0)]


def qkv_pairs(attn, xt) -> list[Pair]:
    """zoo's q, k, v (fused, or q and kv when cross-attending) -> x-transformers' to_q, to_k, to_v."""
    H, hd, perm = attn.n_heads, attn.head_dim, head_order(attn)
    q_dim, kv_dim = H * hd, attn.n_kv_heads * hd
    heads = lambda w: w.unflatten(0, (H, hd))[perm].flatten(0, 1)  # noqa: E731  rows grouped by head
    if hasattr(attn, "qkv"):
        q, kv, kv_off = (attn.qkv.weight, lambda w: heads(w[:q_dim])), attn.qkv.weight, q_dim
    else:
        q, kv, kv_off = (attn.q.weight, heads), attn.kv.weight, 0
    return [(q[0], q[1], xt.to_q.weight, 0.0),
            (kv, lambda w: w[kv_off: kv_off + kv_dim], xt.to_k.weight, 0.0),
            (kv, lambda w: w[kv_off + kv_dim: kv_off + 2 * kv_dim], xt.to_v.weight, 0.0)]


def head_columns(attn) -> Callable[[torch.Tensor], torch.Tensor]:
    """A weight reading the query heads' outputs joined (columns grouped by head, zoo's order) -> x-transformers'."""
    H, hd, perm = attn.n_heads, attn.head_dim, head_order(attn)
    return lambda w: w.unflatten(1, (H, hd))[:, perm].flatten(1)


def width(attn) -> int:
    """The layer's input width, d_model."""
    return (attn.qkv if hasattr(attn, "qkv") else attn.q).in_features


def float64_softmax(xt):
    """x-transformers takes its softmax in float32 whatever the input; in float64 here, so the comparison is to
    float64 precision. The layer, for chaining."""
    fn = xt.attend.attn_fn
    if isinstance(fn, partial) and fn.keywords.get("dtype") == torch.float32:
        xt.attend.attn_fn = partial(fn.func, *fn.args, **{**fn.keywords, "dtype": torch.float64})
    return xt


def copy_pairs(pairs: list[Pair]) -> None:
    with torch.no_grad():
        for zoo_p, transform, xt_p, added in pairs:
            xt_p.copy_(transform(zoo_p) + added)


def run_zoo(attn, x: torch.Tensor, padding: torch.Tensor | None = None, context: torch.Tensor | None = None,
            causal: bool = False) -> torch.Tensor:
    """The zoo layer as a stack calls it: the mask from padding (self) or from the source's padding (cross)."""
    if context is not None:
        return attn(x, NO_POSITION, cross_attention_mask(padding), context=context)
    mask, is_causal = attention_bias(x.shape[1], x.shape[1], causal, None, NO_POSITION, padding, x.device, x.dtype)
    return attn(x, NO_POSITION, mask, is_causal)


def compare(attn, xt, pairs: list[Pair], cross: bool = False, causal: bool = False, padded: bool = True) -> None:
    """Outputs and gradients (input and every paired weight) of the two layers on one float64 batch with a
    padded row: the real query rows only (zoo lets a padded query keep its own key; x-transformers masks it)."""
    copy_pairs(pairs)
    float64_softmax(xt)
    torch.manual_seed(1)
    d = width(attn)
    x = torch.randn(B, T, d, dtype=torch.float64, requires_grad=True)
    src = torch.randn(B, T - 4, d, dtype=torch.float64, requires_grad=True) if cross else None
    n = (src if cross else x).shape[1]
    padding = torch.ones(B, n, dtype=torch.bool)
    if padded:
        padding[1, n - 3:] = False
    real = torch.ones(B, T, dtype=torch.bool) if cross else padding
    ours = run_zoo(attn, x, padding, src, causal)
    theirs = xt(x, context=src, context_mask=padding) if cross else xt(x, mask=padding)
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-10, rtol=0)
    w = torch.randn_like(ours)
    inputs = [x] + ([src] if cross else [])
    zoo_g = torch.autograd.grad((ours * w)[real].sum(), inputs + [p[0] for p in pairs])
    xt_g = torch.autograd.grad((theirs * w)[real].sum(), inputs + [p[2] for p in pairs])
    for a, b in zip(zoo_g[: len(inputs)], xt_g[: len(inputs)], strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    for (_, transform, _, _), a, b in zip(pairs, zoo_g[len(inputs):], xt_g[len(inputs):], strict=True):
        torch.testing.assert_close(transform(a), b, atol=1e-10, rtol=0)


def check_cached_decoding(attn, first: int = 7, chunks: tuple[int, ...] = (1, 3, 1, 1)) -> None:
    """A causal layer fed `first` tokens, then the rest in chunks with a KVCache at each offset, gives the rows its
    full forward gives (float64)."""
    torch.manual_seed(2)
    x = torch.randn(B, first + sum(chunks), width(attn), dtype=torch.float64)
    with torch.no_grad():
        full = run_zoo(attn, x, causal=True)
        cache, start, rows = KVCache(), 0, []
        for t in (first, *chunks):
            mask, is_causal = attention_bias(t, start + t, True, None, NO_POSITION, None, x.device, x.dtype)
            rows.append(attn(x[:, start:start + t], NO_POSITION, mask, is_causal, cache=cache, offset=start))
            start += t
    torch.testing.assert_close(torch.cat(rows, dim=1), full, atol=1e-12, rtol=0)


def check_chunked_decoding(model, tokens: torch.Tensor, chunks: tuple[int, ...] = (5, 1, 3, 1, 3),
                           atol: float = 1e-12) -> None:
    """A whole model's logits decoded `chunks` tokens at a time through its cache equal the full forward's (an
    encoder_decoder reads tokens[:, :7] as its source)."""
    src = tokens[:, :7] if model.needs_source else None
    with torch.no_grad():
        full = model(src, tokens) if src is not None else model(tokens)
        memory = model.encode(src) if src is not None else None
        cache, steps, start = model.new_cache(), [], 0
        for t in chunks:
            chunk = tokens[:, start:start + t]
            steps.append(model.decode(chunk, memory, cache=cache) if src is not None else model(chunk, cache=cache))
            start += t
    torch.testing.assert_close(torch.cat(steps, dim=1), full[:, :start], atol=atol, rtol=0)


def check_against_paper(m, x: torch.Tensor, causal: bool, paper: Callable) -> None:
    """A self-attention replacement m on x (B=2, float64; in an encoder the second sequence ends in 4 pad tokens)
    equals `paper(m, x, causal, padding)`, the equations written out, in its output and every gradient."""
    padding = None
    if not causal:
        padding = torch.ones(2, x.shape[1], dtype=torch.bool)
        padding[1, -4:] = False
    mask, is_causal = attention_bias(x.shape[1], x.shape[1], causal, None, NO_POSITION, padding, x.device, x.dtype)
    ours, theirs = m(x, NO_POSITION, mask, is_causal), paper(m, x, causal, padding)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    probe, wrt = torch.randn_like(ours), [x, *m.parameters()]
    for a, b in zip(torch.autograd.grad((ours * probe).sum(), wrt, retain_graph=True),
                    torch.autograd.grad((theirs * probe).sum(), wrt), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
