"""ModelSpec: the one typed description of a model. Every key, its type and its default are declared here once;
the config's Hydra node (zoo.config.schema.ModelConfig) is made from these fields, and zoo.build.resolve_config
makes a spec from a plain model config (a dict, as config.yaml, summary.json and checkpoints hold it), checked.

- `ModelSpec`: frozen; each component a `Part` holding its registry name and an instance of its options
  dataclass. The models, blocks and layers read its attributes (`cfg.attention.options.window`); `as_dict()`
  gives back the plain form. A changed spec is `dataclasses.replace(spec, ...)` (zoo.config.budget, zoo.mup):
  it is never turned back into a dict to be resolved again.
- `sampling_error`: the one check of the sampling settings, shared by zoo.generate, the `zoo sample` command
  and the run config's `sample.*`.

Torch-free (train.py's checks read it before torch loads): a component's options class is only named for the
type checker.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from zoo.component import Options, freeze, is_int, is_number

if TYPE_CHECKING:  # the components import torch; the spec must not (train.py composes without it)
    from zoo.layers.attention import AttentionOptions
    from zoo.layers.norm import NormOptions

Opts = TypeVar("Opts", bound=Options)  # a component's options dataclass


@dataclass(frozen=True)
class Part(Generic[Opts]):
    """A resolved component: its registry name and its options (an instance of the dataclass it registered with).
    The norm's name is its `type` (its config key) and it has a `placement`: the residual wrapper around it."""

    name: str
    options: Opts
    placement: str = ""  # the norm's only: "" for every other part

    def __post_init__(self) -> None:
        freeze(self.options)

    def as_dict(self) -> dict[str, Any]:
        options = dataclasses.asdict(self.options)
        if not self.placement:
            return {"name": self.name, **options}
        return {"type": self.name, "placement": self.placement, **options}


# The components' nodes when a model config leaves them out; in a composed config the node of the chosen preset
# (conf/<kind>/) replaces these. A part's options have their defaults in its own options dataclass.
COMPONENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "attention": {"name": "mha"},
    "position": {"name": "learned"},
    "norm": {"placement": "pre", "type": "layernorm"},
    "ffn": {"name": "gelu"},
}


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A model: its numbers and its components (a name, then the component's own options), every one set and
    checked. Made by zoo.build.resolve_config; read by the models, blocks and layers. A key with no default here
    is one a model config must set (training sets vocab_size from the tokenizer)."""

    name: str = "decoder_only"  # the lineage: decoder_only, encoder_only, encoder_decoder
    vocab_size: int  # required; training sets it from the tokenizer
    d_model: int = 128
    n_layers: int = 4  # encoder layers for encoder_decoder
    n_decoder_layers: int | None = None  # encoder_decoder only; null: n_layers
    n_heads: int = 4
    max_seq_len: int = 256  # training's default is null: the data's context (zoo.config.schema.ZooConfig.model)
    dropout: float = 0.0
    bias: bool = True  # biases in linear layers and LayerNorm
    tie_embeddings: bool = True  # output head shares the token embedding matrix
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model) (Vaswani et al.)
    embed_norm: bool = False  # a norm right after the embeddings (BERT, BART)
    init_std: float = 0.02
    final_norm: bool | None = None  # a norm after each stack's last block; null: where the placement needs one
    # standard, or mup: the maximal update parametrization (zoo/mup.py), whose best learning rate holds across
    # widths; it equals standard at d_model = mup_base_d_model (the studies' width)
    parametrization: str = "standard"
    mup_base_d_model: int = 128
    # The speedrun's parts (modded-nanogpt; docs/options.md): logits = c * tanh(logits / c) (Gemma 2), null: none;
    logit_softcap: float | None = None
    # extra token-embedding tables whose vectors are mixed into the values of each stack's first and last
    # value_embeddings layers (table i: layer i and layer n - value_embeddings + i); 0: none
    value_embeddings: int = 0
    # value residual learning (ResFormer, Zhou et al. 2024): every layer's values mixed with its stack's first
    # layer's, v = a * v + b * v1 (a = b = 0.5 at init)
    value_residual: bool = False
    # where the weights parts list in residual_outputs start: scaled (init_std / sqrt(2 * blocks)) or zero
    residual_init: str = "scaled"
    embed_skip: bool = False  # each block's input is a * x + b * x0 (x0: the stack's embedding output; a=1, b=0)
    # learned tokens placed before each stack's sequence, dropped from its output (Burtsev et al. 2020; registers,
    # Darcet et al. 2023); 0: none
    memory_tokens: int = 0
    # The embedding and the output head (zoo/models/vocab.py; docs/options.md): a mixture of this many softmaxes
    softmaxes: int = 1
    embed_dim: int | None = None  # factorized embeddings (ALBERT): a table this wide, then to d_model; null: none
    tie_encoder_decoder: bool = True  # encoder_decoder: the encoder and the decoder read one token embedding
    # adaptive input embeddings (Baevski and Auli 2019) and adaptive softmax (Grave et al. 2017): the vocabulary cut
    # into clusters at adaptive_cutoffs (ids in order of frequency), cluster i of width d_model / adaptive_div^i
    adaptive_input: bool = False
    adaptive_softmax: bool = False
    adaptive_cutoffs: list[int] | None = None
    adaptive_div: float = 4.0
    # each block's sequence of sublayers, a letter each: a self-attention (in a decoder that cross-attends, a
    # cross-attention follows each), f FFN, h half-step FFN (x + f(x) / 2: macaron); one string for every block
    # ("hah": macaron) or a list of one per block (["aa", "af", "af", "ff"]: the sandwich); null: "af"
    sublayers: Any = None
    # token shift (x-transformers' shift_tokens, from RWKV): each sublayer reads channel groups of the n tokens before
    # (and, bidirectional, after) its own: n groups of shifts 0..n causal, -n..n bidirectional; 0: off
    shift_tokens: int = 0
    # hyper-connections' expansion rate (norm.placement hyper, hyper_dynamic; Zhu et al. 2024): residual streams
    residual_streams: int = 4
    # How each stack applies its blocks (zoo/models/depth.py; docs/options.md): one block for every layer of
    # none, all, the encoder or the decoder stacks (ALBERT; Narang et al.'s block sharing)
    share_blocks: str = "none"
    # the Universal Transformer (Dehghani et al. 2019): the positions and a sinusoid of the step added before
    # each layer; adaptive computation time (Graves 2016) over the layers, its halting threshold and ponder cost
    step_signal: bool = False
    act: bool = False
    act_threshold: float = 0.99
    ponder_cost: float = 0.01
    # encoder_decoder: each decoder layer cross-attends to its own learned softmax mix of the encoder's embedding
    # and every encoder layer's output (Bapna et al. 2018)
    transparent_attention: bool = False
    # the funnel encoder (Dai et al. 2020; zoo/models/funnel.py): the encoder's blocks in groups of these counts
    # ([2, 2, 2]), the sequence mean-pooled by 2 before each later group; null: off. encoder_only up-samples the
    # output back to full length and runs funnel_upsample_blocks full-length blocks after it (the paper's 2)
    funnel: list[int] | None = None
    funnel_upsample_blocks: int = 2
    # The components (their nodes by default: COMPONENT_DEFAULTS)
    attention: Part[AttentionOptions]
    position: Part[Options]
    norm: Part[NormOptions]  # its name is the norm type; its placement is set
    ffn: Part[Options]

    def as_dict(self) -> dict[str, Any]:
        """The plain form (what config.yaml, summary.json and checkpoints hold): resolve_config gives it back."""
        return {f.name: value.as_dict() if isinstance(value, Part) else value
                for f in dataclasses.fields(self) for value in [getattr(self, f.name)]}


def model_defaults() -> dict[str, Any]:
    """Every model key's default as plain data (zoo.build.DEFAULTS): None for the keys a config must set, the
    components' default nodes."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ModelSpec):
        if f.name in COMPONENT_DEFAULTS:
            out[f.name] = dict(COMPONENT_DEFAULTS[f.name])
        else:
            out[f.name] = None if f.default is dataclasses.MISSING else f.default
    return out


def sampling_error(max_new_tokens: Any = 0, temperature: Any = 1.0, top_k: Any = None, top_p: Any = None,
                   num_samples: Any = 1, names: dict[str, str] | None = None) -> str | None:
    """The first bad sampling setting as one line `<name>: got <value>; valid: <range>`, else None: the one check
    of these values, made where they are used (zoo.generate's sample_next, generate) and, before anything
    loads, by the CLI (zoo.sample) and the run's config (sample.*). `names` renames the settings
    (sample.temperature in a config, --temperature on a command line)."""
    def name(key: str) -> str:
        return (names or {}).get(key, key)

    checks = [  # (key, value, ok, valid)
        ("max_new_tokens", max_new_tokens, is_int(max_new_tokens) and max_new_tokens >= 0, "an integer >= 0"),
        # a negative temperature would invert the distribution: the least likely token first
        ("temperature", temperature, is_number(temperature) and temperature >= 0, "a finite number >= 0 (0 = greedy)"),
        ("top_k", top_k, top_k is None or (is_int(top_k) and top_k >= 1), "an integer >= 1, or none"),
        ("top_p", top_p, top_p is None or (is_number(top_p) and 0 < top_p <= 1), "a number in (0, 1], or none"),
        ("num_samples", num_samples, is_int(num_samples) and num_samples >= 1, "an integer >= 1"),
    ]
    for key, value, ok, valid in checks:
        if not ok:
            return f"{name(key)}: got {value!r}; valid: {valid}"
    return None
