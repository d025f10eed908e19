"""nGPT, the normalized Transformer (Loshchilov et al. 2024, "nGPT: Normalized Transformer with Representation
Learning on the Hypersphere"): every hidden vector, and every matrix's vectors along the embedding dimension, on the
unit sphere.

The placement `ngpt` (`norm=ngpt`) is the per-sublayer part, the paper's residual update (its eq. 10-11):
    h <- Norm(h + alpha * (Norm(f(h)) - h))        Norm(x) = x / |x|
with alpha a learned vector over d_model, an "eigen learning rate" per sublayer (alpha_A for attention, alpha_M for
the FFN). It uses no LayerNorm/RMSNorm anywhere and declares what the rest of the model must do (zoo/component.py):
- `sphere`: the stack builds every part with ctx.sphere (no final norm); the first step normalises the embeddings.
  Attention (zoo/layers/attention.py) normalises each query and key head and scales it by a learned s_qk, with the
  softmax scale sqrt(d_k) in place of 1 / sqrt(d_k); a gated FFN (zoo/layers/ffn.py) scales u by s_u and v by
  s_v * sqrt(d_model) before the activation; the head (zoo/models/stack.py's Readout) scales the logits by s_z.
  A part that cannot is refused in one line before the build, as NGPTStep.refuses declares (Placement.refuses).
- `after_step(model)`: after every optimizer step (and before a fresh run's first) every matrix is renormalised
  along its embedding dimension: the rows of the token embedding, the head and each matrix that reads the stream,
  the columns of each matrix that writes into it (a part's `residual_outputs`).
  Not at build: the draws stay every placement's (swapping the placement keeps every other weight's bits).
- `weight_decay = False`: the training step trains with optim.weight_decay 0 (the paper uses none; on a
  renormalised matrix it would only rescale the learning rate).
Every learned scale is stored scaled, as the paper's (section 2.5): s = stored * (init / scale), stored starting at
`scale`, so the optimizer moves s init / scale times faster than a plain parameter. nGPT's choice of no warm-up is
a training setting, not the model's: set optim.warmup_steps=0 to follow it.
parametrization=mup is allowed, zoo's extension (the paper has none; tests/test_mup.py trains every part under
it): muP's roles set the learning rates (hidden matrices at lr / width_mult) and its output multiplier applies; its
init scaling is moot, the matrices being renormalised.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import declared
from zoo.registry import RESIDUAL

ALPHA_INIT = 0.05  # the paper's alpha_A,init = alpha_M,init ("in order of 1 / n_layers")


def unit(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x scaled to unit L2 norm along dim: the paper's Norm."""
    return F.normalize(x, dim=dim)


class EigenScale(nn.Module):
    """A learned vector s = stored * (init / scale) (nGPT's scaled parameters): stored starts at `scale`, so s starts
    at `init`. Counted as a norm parameter: it stands where the norms' gains would."""

    count_as = "norm"

    def __init__(self, shape: int | tuple[int, ...], init: float, scale: float):
        super().__init__()
        self.stored = nn.Parameter(torch.full((shape,) if isinstance(shape, int) else shape, float(scale)))
        self.factor = init / scale
        self.constants = {"stored": float(scale)}

    def forward(self) -> torch.Tensor:
        return self.stored * self.factor

    def flops(self, t: int) -> int:
        return 0  # an elementwise product


@RESIDUAL.register("ngpt")
class NGPTStep(nn.Module):
    """Norm(h + alpha * (Norm(f(h)) - h)), alpha per channel from 0.05 (scale 1 / sqrt(d_model))."""

    final_norm, parallel, sphere, weight_decay = False, False, True, False
    # What cannot keep its vectors on the sphere or scale for it (Placement.refuses): the build refuses each in one
    # line before it builds. A sublayer whose `sphere` is false and is not listed here fails the build too, asking
    # for its line here (zoo/block.py's built), so this list and the parts' `sphere` cannot drift apart.
    refuses = {
        "attention": {
            "cope": "its position gates read the raw scores, not unit queries and keys scaled by s_qk",
            "cosine": "it normalises queries and keys itself, with its own temperature in place of s_qk",
            "differential": "two softmaxes over half-width heads: no one unit query and key per head for s_qk",
            "dynamic_conv": "a convolution has no queries and keys to put on the sphere",
            "lightweight_conv": "a convolution has no queries and keys to put on the sphere",
            "memory_kv": "its learned memory keys and values are not normalised with the tokens'",
            "mla": "its keys come from a normalised low-rank latent with a rotary part, not unit heads for s_qk",
            "synthesizer": "its synthetic weights come from no query and key dot products to normalise",
            "qk_norm": "the placement already puts each query and key head on the unit sphere",
        },
        "ffn": {
            "moe": "its router and experts are not unit matrices with s_u, s_v (nGPT's FFN)",
            "pkm": "its product-key lookup has its own query norm and value table, not nGPT's scaled FFN",
        },
    }

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.f = f
        d_model = make_norm().weight.shape[-1]  # the width, as LayerScale reads it; the norm itself is not kept
        self.alpha = EigenScale(d_model, ALPHA_INIT, 1 / math.sqrt(d_model))

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        h = unit(x)  # unit from the step before; at the first, the embeddings (and any position added) normalised
        return unit(h + self.alpha() * (unit(self.f(h, **kw)) - h))

    @staticmethod
    def after_step(model: nn.Module) -> None:
        """Every matrix unit-norm along its embedding (d_model) dimension."""
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, NGPTStep):
                    writes = {id(getattr(p, name).weight) for p in m.f.modules() if hasattr(p, "count_as")
                              for name in declared(p, "residual_outputs")}
                    for lin in (c for c in m.f.modules() if isinstance(c, nn.Linear)):
                        # (out, in): a matrix writing into the stream has d_model rows, so its columns are unit
                        lin.weight.copy_(unit(lin.weight, dim=0 if id(lin.weight) in writes else 1))
                elif isinstance(m, nn.Embedding) or (isinstance(m, nn.Linear) and getattr(m, "readout", False)):
                    m.weight.copy_(unit(m.weight, dim=1))  # token table and head: a d_model row per token
