"""The component contract, stated once: what every part receives, and what it declares.

A part is built by its registered factory: an attention, position or FFN as `factory(ctx, opts)`, a norm as
`factory(ctx, opts, dim=None)`, a norm placement as `factory(f, make_norm)`, a lineage as `factory(cfg)`.
- `ctx` is the `Context` (what the stack knows); `opts` the part's own options, an instance of the dataclass
  it registered with, declared once, typed, with defaults (`@dataclass class GQAOptions(AttentionOptions)`).
  `check_options` turns a config mapping into that dataclass, or fails in one line naming
  `model.<kind>.<option>` and the valid options.
- A part checks its own constraints with `need(...)` in its own file, before it allocates.
- Options that are widths (grow with d_model, as `d_ff`) are listed in the options class's `widths`
  (a ClassVar): model.parametrization=mup scales them along when it builds the model at its base width.
- What a part declares is one protocol per kind, below: `Part` (every attention, position, norm and FFN),
  `AttentionPart`, `PositionPart`, `NormPart`, `FFNPart`, `Placement` and `Lineage`. Whatever other code
  needs to know it asks the part through these members (`declared` supplies the contract's default where a
  part leaves an optional one out), never its name. tests/test_contract.py checks every registered part
  against its kind's protocol on an instance built on the meta device, and the table in docs/components.md
  against `contract_markdown()`.
- Initialisation: every weight ~ N(0, init_std), biases 0, but for the children a part lists in
  `residual_outputs` (scaled down with depth) and the parameters it lists in `constants` (norm gains: 1); then
  each placement's `init_for_depth(blocks)`, for a start that depends on the model's depth.
- Auxiliary losses (any part): during its forward a module sets `self.aux_losses`, a dict
  name -> scalar tensor, already weighted (ffn=moe: {"moe_balance": ..., "moe_z": ...}). The training
  step calls `clear_aux_losses(model)` before the forward and `aux_losses(model)` right after it: the
  values summed by name over modules, and cleared, so a value from an earlier forward (validation,
  sampling) is never added. The step adds their sum to the objective's loss and logs each as
  `train_<name>` (zoo/training/module.py). Each DDP process adds its own, like its own loss.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol, TypeGuard


class ConfigError(ValueError):
    """A bad model or training config, reported as one line that names the key."""


def need(ok: bool, key: str, msg: str, section: str = "model") -> None:
    """Fail with `model.<key>: <msg>` unless ok: a component's own constraint check. section: the config section
    the key is in ("" for a top-level one, as the optimizer's `optim.<option>`)."""
    if not ok:
        raise ConfigError(f"{section}.{key}: {msg}" if section else f"{key}: {msg}")


@dataclass(frozen=True)
class Context:
    """What the stack knows when it builds a component; each component takes what it needs."""

    d_model: int
    n_heads: int
    max_seq_len: int
    layer: int = 0  # this block's index in the whole model (the encoder's blocks first)
    n_layers: int = 1  # blocks in the whole model
    causal: bool = False  # a decoder stack: each token sees only earlier ones
    cross: bool = False  # cross-attention: queries from the decoder, keys and values from the encoder
    rotary: bool = False  # the stack's position rotates queries and keys (its `rotary`; RoPE)
    bias: bool = True  # biases in linear layers and LayerNorm
    dropout: float = 0.0
    value_embed: bool = False  # this layer's self-attention mixes a value embedding into its values (value_dim)
    keep_values: bool = False  # it keeps its new tokens' values, before any mix, in kept_values (value_residual)
    sphere: bool = False  # the placement keeps hidden vectors on the unit sphere (nGPT): attention and FFN scale for it
    memory_tokens: int = 0  # model.memory_tokens: positions before the sequence that self-attention also sees
    residual_streams: int = 1  # the residual streams a placement keeps (model.residual_streams: hyper-connections)
    norm: Callable[..., Any] = field(default=lambda dim=None: _no_norm())  # the model's: norm(dim=None) -> a new one

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def _no_norm() -> Any:
    raise TypeError("Context.norm: this context has no norm; zoo.models.stack.context sets the model's")


@dataclass(kw_only=True)
class Options:
    """A component without options of its own.

    Options in a resolved config (zoo.spec.Part) are frozen: assigning to one raises, as a frozen dataclass
    does, without each component's dataclass having to say frozen=True. dataclasses.replace makes a changed copy."""

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(f"cannot assign to field '{name}': a resolved config's options "
                                                  "are frozen (dataclasses.replace makes a changed copy)")
        object.__setattr__(self, name, value)


def freeze(opts: Any) -> Any:
    """opts, frozen from now on (Options.__setattr__); its dataclass fields, equality and asdict are unchanged."""
    object.__setattr__(opts, "_frozen", True)
    return opts


def is_int(v: Any) -> TypeGuard[int]:
    """An integer from a config (YAML's true/false are ints in Python, not counts)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> TypeGuard[int | float]:
    """A finite int or float from a config, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _type_name(t: Any) -> str:
    if typing.get_origin(t) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(t))
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(t))
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(t, str(t))


def _fits(value: Any, t: Any) -> bool:
    origin = typing.get_origin(t)
    if origin is typing.Literal:
        return value in typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in typing.get_args(t))
    if t is type(None):
        return value is None
    if origin is tuple:  # tuple[str, ...]: names
        return isinstance(value, tuple) and all(_fits(v, typing.get_args(t)[0]) for v in value)
    if origin is dict:  # dict[str, float]: names and their values
        key, val = typing.get_args(t)
        return isinstance(value, dict) and all(_fits(k, key) and _fits(v, val) for k, v in value.items())
    if t is bool:
        return isinstance(value, bool)
    if t is int:
        return is_int(value)
    if t is float:
        return is_number(value)
    if t is str:
        return isinstance(value, str)
    return True  # a type the checker does not know: the component checks it


def option_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def check_options(key: str, name: str, cls: type, values: Mapping, section: str = "model") -> Any:
    """values (a component's config without `name`) -> an instance of its options dataclass.

    key is the config path (`attention`, `norm`, ...) in `section` (need's); errors are one line naming
    key.option."""
    fields, hints = option_fields(cls), typing.get_type_hints(cls)
    valid = ", ".join(sorted(fields)) or "none"
    for opt, value in values.items():
        need(opt in fields, f"{key}.{opt}", f"not an option of '{name}'; valid: {valid}", section)
        choices = typing.get_args(hints[opt]) if typing.get_origin(hints[opt]) is typing.Literal else None
        need(_fits(value, hints[opt]), f"{key}.{opt}", f"unknown {value!r}; valid: {', '.join(map(str, choices))}"
             if choices else f"expected {_type_name(hints[opt])}, got {value!r}", section)
    for opt, f in fields.items():
        missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        need(opt in values or not missing, f"{key}.{opt}", f"required by '{name}' ({_type_name(hints[opt])})",
             section)
    return cls(**{k: float(v) if hints[k] is float else v for k, v in values.items()})


def build(registry: Any, part: Any, ctx: Context) -> Any:
    """The component a resolved config's Part (zoo.spec) names, built with its options: `factory(ctx, opts)`."""
    return registry.get(part.name)(ctx, part.options)


def option_values(opts: Any) -> dict:
    """An options instance as a plain dict, for the resolved config."""
    return dataclasses.asdict(opts)


def linear_flops(module: Any) -> int:
    """2 FLOPs per weight of every linear layer in module (an nn.Module): its matrix products, per token."""
    # lazy: the contract stays torch-free, so train.py's refusals answer before torch (2.7 s)
    from torch import nn

    return sum(2 * m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def aux_losses(model: Any) -> dict[str, Any]:
    """The auxiliary losses model's modules left in `aux_losses` since the last clear, summed by name; clears them."""
    out: dict[str, Any] = {}
    for m in model.modules():
        held = vars(m).get("aux_losses")  # not getattr: a module's missing-attribute path raises, every step
        for name, value in (held or {}).items():
            out[name] = out[name] + value if name in out else value
        if held:
            m.aux_losses = {}
    return out


def after_step(model: Any) -> None:
    """Run each `after_step(model)` hook the model's modules' classes declare (Placement.after_step), each class's
    once: the training step calls this after every optimizer step, and a fresh run before its first."""
    hooks = {type(m): type(m).after_step for m in model.modules() if callable(getattr(type(m), "after_step", None))}
    for hook in hooks.values():
        hook(model)


def refusal(part: Any, kind: str, name: str, opts: Any) -> tuple[str, str] | None:
    """What `part` (a registered entry, or a built part) refuses of the `kind` part `name` built with `opts` (its
    options dataclass instance), as its `refuses` declares: (the key that refuses it, why); None: nothing. A key of
    refuses[kind] is that part's registered name, or one of its options, refused when set (truthy). The build's
    refusal (zoo.build) and the tests' covering design (tests/helpers.py) both read this, so they cannot drift."""
    for key, why in declared(part, "refuses").get(kind, {}).items():
        if key == name or (dataclasses.is_dataclass(opts) and key in option_fields(type(opts)) and getattr(opts, key)):
            return key, why
    return None


def clear_aux_losses(model: Any) -> None:
    """Forget every auxiliary loss a module holds: call before a forward whose losses will be collected."""
    for m in model.modules():
        if vars(m).get("aux_losses"):
            m.aux_losses = {}


# ---- The protocols: what each kind of part declares. Attributes carry their meaning (Annotated); a method's
# docstring says what it returns. A member with a value here (an attribute) or marked @default (a method) is
# optional: `declared` gives that default where a part leaves it out. The rest every part of the kind declares.

def default(method: Callable) -> Callable:
    """Marks a protocol method whose body is the contract's default, for parts that leave the method out."""
    method.contract_default = True  # type: ignore[attr-defined]
    return method


REFUSES = ("the parts of another kind it cannot be in one model with, by kind (attention, position, norm, residual, "
           "ffn, model): {kind: {a registered name, or an option of theirs refused when set: why}}, read from the "
           "registered entry without building; the build refuses each in one line naming both, and the tests' "
           "covering design leaves those pairs out (zoo.component.refusal)")


class Part(Protocol):
    """Every attention, position, norm and FFN."""

    count_as: Annotated[str, "the count group of its parameters: attention, ffn, norm or position "
                             "(count_params)"]
    residual_outputs: Annotated[tuple[str, ...], "children whose weights write into the residual stream: drawn "
                                                 "with init_std / sqrt(2 * blocks) (init_weights)"] = ()
    constants: Annotated[dict[str, float], "parameters set to a constant, as norm gains to 1 and a mix's scalars "
                                           "(init_weights)"] = {}
    refuses: Annotated[dict[str, dict[str, str]], REFUSES] = {}

    @default
    def flops(self, t: int) -> int:
        """Forward FLOPs per token at context t (flops_per_token); if left out, 2 per weight of its linear
        layers."""
        return linear_flops(self)

    @default
    def inactive_params(self) -> int:
        """Parameters a token does not use, as experts it is not routed to (count_params' `active`); if left
        out, 0."""
        return 0


class AttentionPart(Part, Protocol):
    """Self- or cross-attention (ctx.cross), built as `factory(ctx, opts)`."""

    n_kv_heads: Annotated[int, "key/value heads, each shared by n_heads // n_kv_heads query heads (zoo.bench)"]
    head_dim: Annotated[int, "the size of a key/value head (zoo.bench)"]
    window: Annotated[int | None, "a query sees the keys at distance < window; null: all of them. The stack "
                                  "builds its mask from it"]
    record: Annotated[bool, "set true by attention_maps: compute with the math backend and keep the weights "
                            "(B, H, Tq, Tk) in `weights`"]
    value_dim: Annotated[int | None, "the width of its values (n_kv_heads * head_dim), into which, built with "
                                     "ctx.value_embed, it mixes forward's value_embed (B, T, value_dim); built with "
                                     "ctx.keep_values, it keeps its new tokens' own values in kept_values (B, T, "
                                     "value_dim); null: it does neither (model.value_embeddings, "
                                     "model.value_residual)"] = None
    order_aware: Annotated[bool, "it tells positions apart itself (weights per absolute position, a convolution's "
                                 "kernel), so even with position=none it is no set operation"] = False
    pools_queries: Annotated[bool, "its forward takes `queries`: only x's first `queries` rows ask, the rest are "
                                   "keys and values alone (model.funnel's pool-q-only)"] = False
    chains_scores: Annotated[bool, "its forward takes `scores`, a list the stack hands its self-attention layers in "
                                   "turn during one forward, empty at the first: it adds the last entry, the previous "
                                   "layer's pre-softmax scores (B, H, Tq, Tk), to its own and leaves its own in its "
                                   "place (residual attention)"] = False

    sphere: Annotated[bool, "built with ctx.sphere (a placement's `sphere`), it normalises each query and key head "
                            "to unit length, scales them by a learned s_qk and scores at sqrt(head_dim) instead of "
                            "1 / sqrt(head_dim) (nGPT); false: it cannot, and a sphere placement must list it in "
                            "its `refuses` (the block fails the build of one it does not)"] = False

    def forward(self, x: Any, pos: Any, mask: Any = None, is_causal: bool = False, context: Any = None,
                cache: Any = None, offset: int = 0, value_embed: Any = None) -> Any:
        """x (B, T, d_model) -> (B, T, d_model); positions from `pos` (a PositionPart), keys and values from
        `context` when cross-attending, past ones kept in `cache` (a KVCache) when decoding, value_embed mixed
        into the values before they are cached (given only to a layer built with ctx.value_embed)."""

    def cache_bytes_per_token(self, element_size: int) -> int:
        """The KV-cache bytes one token adds to this layer, at element_size bytes a number (zoo.bench)."""


class PositionPart(Part, Protocol):
    """A stack's position scheme, built as `factory(ctx, opts)`, shared by its layers. Each method is a no-op
    (or returns None) where the scheme does not apply; `offset` is the position of the first token."""

    rotary: Annotated[bool, "it places positions by rotate(q, k, offset), for any even last dimension (the "
                            "stack tells attention, as ctx.rotary)"]
    hard_limit: Annotated[bool, "no positions past max_seq_len (learned): training and generation refuse "
                                "longer sequences"]
    max_len: Annotated[int | None, "that limit; null: any length"]

    def embed(self, x: Any, offset: int = 0) -> Any:
        """Token embeddings x (B, T, d_model) with the positions added (an absolute scheme), else x."""

    def rotate(self, q: Any, k: Any, offset: int = 0) -> Any:
        """Queries and keys (B, H, T, dim) rotated by their positions (a rotary scheme), else (q, k)."""

    def score_bias(self, t_q: int, t_k: int, offset: int = 0) -> Any:
        """(H, t_q, t_k) added to the attention scores (a bias scheme: ALiBi, T5), else None."""


class NormPart(Part, Protocol):
    """A norm, built as `factory(ctx, opts, dim=None)` over the last dimension, dim (default d_model)."""

    def forward(self, x: Any) -> Any:
        """x (..., dim) -> normalised, the same shape and dtype."""


class FFNPart(Part, Protocol):
    """A position-wise feed-forward network, built as `factory(ctx, opts)`."""

    sphere: Annotated[bool, "built with ctx.sphere (a placement's `sphere`), it scales its hidden pre-activations by "
                            "learned s_u, s_v (and the gate's by sqrt(d_model)) as nGPT's; false: it cannot, and a "
                            "sphere placement must list it in its `refuses` (the block fails the build of one it "
                            "does not)"] = False

    def forward(self, x: Any) -> Any:
        """x (B, T, d_model) -> (B, T, d_model)."""

    @classmethod
    def resize(cls, opts: Any, size: int) -> Any:
        """Its options with its hidden size set to size: what budget=params varies to match the baseline's
        parameters (the count must grow linearly with size)."""


class Placement(Protocol):
    """A norm placement, built as `factory(f, make_norm)`: f the sublayer it wraps (the block's sublayers by
    name, {"attn": ..., "ffn": ...}, when parallel), make_norm() a new norm of the model's type."""

    final_norm: Annotated[bool, "a norm after the last block (model.final_norm: null follows it)"]
    parallel: Annotated[bool, "the block hands it all its sublayers at once, for one residual step, "
                              "instead of one at a time"]
    carry: Annotated[Any, "the state it carries beside the stream x (ResiDual's second stream): a module class, "
                          "built by the stack as carry(ctx), whose open(x) makes the state from the embeddings and "
                          "close(x, state) gives the stack's output before any final norm; the block passes the "
                          "state to each step as forward's `state`. null: none"] = None
    sphere: Annotated[bool, "it keeps every hidden vector on the unit sphere (nGPT): the stack builds its parts with "
                            "ctx.sphere, its first step normalises the embeddings (no embed_norm), and the head "
                            "scales its logits by a learned s_z"] = False
    weight_decay: Annotated[bool, "the optimizer's decoupled weight decay applies; false: the training step sets "
                                  "optim.weight_decay to 0 (its after_step renormalises the matrices anyway)"] = True
    contextual: Annotated[bool, "the block builds it as factory(f, make_norm, ctx), with the build Context (layer "
                                "index, d_model, residual_streams); built without one it still works"] = False
    refuses: Annotated[dict[str, dict[str, str]], REFUSES] = {}

    def forward(self, x: Any, **kw: Any) -> Any:
        """x (B, T, d_model) -> x after the residual step; kw: the sublayer's keyword arguments (by name when
        parallel)."""

    @default
    def init_for_depth(self, blocks: int) -> None:
        """Its own initialisation, run by init_weights after the zoo's, in a model of `blocks` blocks: a start
        that depends on depth (LayerScale's); if left out, nothing."""

    @default
    def after_step(self, model: Any) -> None:
        """Puts the whole model back where this placement keeps it, run once per placement class by after_step(model)
        after every optimizer step and before a fresh training run's first (nGPT: every matrix unit-norm along its
        embedding dimension); not at build, so the initial draws are every placement's; if left out, nothing."""


class Lineage(Protocol):
    """A model, built as `factory(cfg)` from the resolved model config."""

    cfg: Annotated[Any, "the resolved model config it was built from (zoo.spec.ModelSpec: attributes)"]
    generates: Annotated[bool, "sample.py and zoo.generate continue a prompt token by token (then it has "
                               "new_cache())"]
    needs_source: Annotated[bool, "the forward pass and generation take a source sequence to encode"]
    next_token_lm: Annotated[bool, "a per-token next-token loss on running text (perplexity, bits per "
                                   "character)"]
    stacks: Annotated[tuple[str, ...], "its stacks of blocks: encoder, decoder or both (model.share_blocks and "
                                       "the other options that name a stack)"]

    def forward(self, *inputs: Any, **kw: Any) -> Any:
        """tokens (B, T) (needs_source: source (B, S) and target (B, T)) -> logits (B, T, vocab_size)."""


# registry kind -> the protocol its parts keep
PROTOCOLS: dict[str, type] = {"attention": AttentionPart, "position": PositionPart, "norm": NormPart,
                              "ffn": FFNPart, "residual": Placement, "model": Lineage}


@dataclass(frozen=True)
class Member:
    """One member of a protocol: its name, type (attributes) or parameters (methods), meaning and default."""

    name: str
    kind: str  # "attribute" or "method"
    type: Any  # an attribute's type; a method's parameters, as text: "(t)"
    meaning: str
    left_out: str | None  # what applies where a part leaves it out; None: every part of the kind declares it

    def fits(self, value: Any) -> bool:
        """Whether a part's value for this member has the declared type (a method: is callable)."""
        return _fits(value, self.type) if self.kind == "attribute" else callable(value)


def _parameters(fn: Callable) -> str:
    import inspect

    prefix: dict[Any, str] = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    params = list(inspect.signature(fn).parameters.values())[1:]  # without self / cls
    return f"({', '.join(prefix.get(p.kind, '') + p.name for p in params)})"


def members(protocol: type) -> list[Member]:
    """A protocol's members, its bases' first, in the order they are written."""
    import inspect

    out: dict[str, Member] = {}
    for cls in reversed([c for c in protocol.__mro__ if c not in (Protocol, typing.Generic, object)]):
        hints = typing.get_type_hints(cls, include_extras=True)
        for name in cls.__dict__.get("__annotations__", {}):
            t, meaning = typing.get_args(hints[name])
            left_out = f"`{cls.__dict__[name]!r}`" if name in cls.__dict__ else None
            out[name] = Member(name, "attribute", t, meaning, left_out)
        for name, value in cls.__dict__.items():
            fn = getattr(value, "__func__", value)
            if inspect.isfunction(fn) and fn.__doc__ and not name.startswith("_"):
                meaning, _, left_out = " ".join(fn.__doc__.split()).partition("; if left out, ")
                optional = getattr(fn, "contract_default", False)
                out[name] = Member(name, "method", _parameters(fn), meaning.removesuffix("."),
                                   left_out.removesuffix(".") if optional else None)
    return list(out.values())


def declared(part: Any, member: str) -> Any:
    """What a part (an instance) declares for a member of the contract: its own, or the default of the
    protocol that declares one (`Part`, `AttentionPart`) where it leaves the member out. Methods come bound to the
    part."""
    if hasattr(part, member):
        return getattr(part, member)
    value = next(p.__dict__[member] for p in (Part, *PROTOCOLS.values()) if member in p.__dict__)  # else: not an
    # optional member of the contract (StopIteration)
    return value.__get__(part, type(part)) if callable(value) else value


def resize_options(registry: Any, name: str, opts: Any, size: int) -> Any:
    """A component's options with its size set to `size`, as the part itself says (its `resize`): what
    budget=params varies. One line naming the part when it declares no resize."""
    part = registry.get(name)
    if not callable(getattr(part, "resize", None)):
        sizable = [n for n in registry.names() if callable(getattr(registry.get(n), "resize", None))]
        raise ConfigError(f"budget: {registry.kind} '{name}' declares no resize(opts, size) (zoo/component.py), so "
                          f"the budget cannot size it; valid: {', '.join(sizable)}")
    return part.resize(opts, size)


def resized(registry: Any, node: Mapping, size: int, name_key: str = "name") -> dict:
    """resize_options for a component's plain config node: the node with its size set."""
    name = node[name_key]
    opts = registry.options(name)(**{k: v for k, v in node.items() if k != name_key})
    return {name_key: name, **option_values(resize_options(registry, name, opts, size))}


def contract_markdown() -> str:
    """The contract as docs/components.md shows it: one table per kind, from the protocols (a test compares)."""
    lines, shared = [], {m.name for m in members(Part)}
    for kind, protocol in [("every part", Part), *PROTOCOLS.items()]:
        rows = [m for m in members(protocol) if Part not in protocol.__mro__[1:] or m.name not in shared]
        lines += [f"**{kind}** (`{protocol.__name__}`): {' '.join((protocol.__doc__ or '').split())}", "",
                  "| member | meaning | if a part leaves it out |", "|---|---|---|"]
        for m in rows:
            name = m.name + (m.type if m.kind == "method" else "")
            lines.append(f"| `{name}` | {m.meaning.replace('|', '/')} | {m.left_out or 'required'} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
