"""The config's typed schema: every key's type and default, declared once.

- `ModelConfig`: the model's numbers (zoo.build.DEFAULTS is made from it). A component's options are not
  here: each component declares them in its own options dataclass (zoo/layers/*.py).
- `ModelSpec`: what `zoo.build.resolve_config` makes of a `ModelConfig` (or a dict): every key set and
  checked, frozen, each component a `Part` holding its name and an instance of its options dataclass. The
  models, blocks and layers read its attributes (`cfg.attention.options.window`); `as_dict()` gives back the
  plain form that config.yaml, summary.json and checkpoints store.
- `ZooConfig`: the training config (optim, sample, the top-level keys). data, trainer and logger differ
  from one preset to the next, so they stay mappings, checked by zoo.training.validate. A run reads it
  typed (`ZooConfig.from_plain`) once its plain form has been checked and sized. `optim` is a component group
  (zoo/optim/: the optimizer's name and its own options), read as a `Part`.
- `register()` puts them in Hydra's ConfigStore: `zoo_schema` (the first entry of conf/config.yaml's
  defaults list) and, for every registered component and optimizer, a node `_zoo/<kind>/<name>` holding its
  name and its options with their dataclass defaults. A preset in conf/<kind>/ starts from that node and writes
  only what it chooses; a component with no preset there gets `<kind>=<name>` from its node alone.
  The options are read from the registries (which import torch) and kept in zoo/__pycache__ while no
  source under zoo/ changes, so train.py's checks compose the config without torch (unless ZOO_PLUGINS
  names parts from outside zoo/: zoo.registry).

Hydra then types every key as it composes: `model.d_model=abc` fails there, and `one_line` turns
OmegaConf's many-line error into `model.d_model: got 'abc'; valid: an integer`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from zoo.component import Options, freeze, is_int, is_number

if TYPE_CHECKING:  # the components import torch; the schema must not (train.py composes without it)
    from zoo.layers.attention import AttentionOptions
    from zoo.layers.norm import NormOptions


@dataclass
class ModelConfig:
    """The model's numbers and its components (a name, then the component's own options)."""

    name: str = "decoder_only"  # the lineage: decoder_only, encoder_only, encoder_decoder
    vocab_size: int | None = None  # required; training sets it from the tokenizer
    d_model: int = 128
    n_layers: int = 4  # encoder layers for encoder_decoder
    n_decoder_layers: int | None = None  # encoder_decoder only; null: n_layers
    n_heads: int = 4
    max_seq_len: int | None = 256  # training's default is null: the data's context (see ZooConfig.model)
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
    # The components: in a composed config, the node of the chosen preset (conf/<kind>/) replaces these.
    attention: Any = field(default_factory=lambda: {"name": "mha"})
    position: Any = field(default_factory=lambda: {"name": "learned"})
    norm: Any = field(default_factory=lambda: {"placement": "pre", "type": "layernorm"})
    ffn: Any = field(default_factory=lambda: {"name": "gelu"})


Opts = TypeVar("Opts", bound=Options)  # a component's options dataclass


@dataclass(frozen=True)
class Part(Generic[Opts]):
    """A resolved component: its registry name and its options (an instance of the dataclass it registered with)."""

    name: str
    options: Opts

    def __post_init__(self) -> None:
        freeze(self.options)

    def as_dict(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self.options)}


@dataclass(frozen=True)
class NormPart(Generic[Opts]):
    """The resolved norm: its registry name is its `type`; `placement` names the residual wrapper around it."""

    type: str
    placement: str
    options: Opts

    def __post_init__(self) -> None:
        freeze(self.options)

    def as_dict(self) -> dict:
        return {"type": self.type, "placement": self.placement, **dataclasses.asdict(self.options)}


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model config: ModelConfig's keys (tests/test_schema.py keeps the two alike), every one set and
    checked, the components as Parts. Made by zoo.build.resolve_config; read by the models, blocks and layers."""

    name: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_decoder_layers: int | None
    n_heads: int
    max_seq_len: int
    dropout: float
    bias: bool
    tie_embeddings: bool
    scale_embeddings: bool
    embed_norm: bool
    init_std: float
    final_norm: bool | None
    parametrization: str
    mup_base_d_model: int
    logit_softcap: float | None
    value_embeddings: int
    value_residual: bool
    residual_init: str
    embed_skip: bool
    memory_tokens: int
    softmaxes: int
    embed_dim: int | None
    tie_encoder_decoder: bool
    adaptive_input: bool
    adaptive_softmax: bool
    adaptive_cutoffs: list[int] | None
    adaptive_div: float
    sublayers: Any
    shift_tokens: int
    residual_streams: int
    share_blocks: str
    step_signal: bool
    act: bool
    act_threshold: float
    ponder_cost: float
    transparent_attention: bool
    funnel: list[int] | None
    funnel_upsample_blocks: int
    attention: Part[AttentionOptions]
    position: Part[Options]
    norm: NormPart[NormOptions]
    ffn: Part[Options]

    def as_dict(self) -> dict:
        """The plain form (what config.yaml, summary.json and checkpoints hold): resolve_config gives it back."""
        return {f.name: value.as_dict() if isinstance(value, (Part, NormPart)) else value
                for f in dataclasses.fields(self) for value in [getattr(self, f.name)]}


@dataclass
class SampleConfig:
    """Text printed after training (decoder_only and encoder_decoder)."""

    prompt: str = "\n"
    max_new_tokens: int = 200
    temperature: float = 0.8  # 0: greedy
    top_k: int | None = 40
    top_p: float | None = None


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


@dataclass
class ZooConfig:
    """What `python train.py` composes, less Hydra's own section."""

    # Training sizes the positions to the data's context unless max_seq_len is set.
    model: ModelConfig = field(default_factory=lambda: ModelConfig(max_seq_len=None))
    # The optimizer (conf/optim/, zoo/optim/): its name and options; in a composed config the chosen preset's node.
    # Read typed (from_plain) as a Part whose options extend zoo.optim.OptimOptions: lr, min_lr, warmup_steps, ...
    optim: Any = field(default_factory=lambda: {"name": "adamw"})
    sample: SampleConfig = field(default_factory=SampleConfig)
    data: Any = field(default_factory=dict)  # conf/data/: kinds differ (text, task, hf); zoo.training.validate
    trainer: Any = field(default_factory=dict)  # conf/trainer/: Lightning Trainer arguments
    logger: Any = field(default_factory=dict)  # conf/logger/: name -> a logger to instantiate
    seed: int = 0
    threads: int | None = None  # torch intra-op threads per run; null: torch's default (one per core)
    optimized_metric: str | None = None  # set by hparams_search presets: the final metric the sweeper optimises
    compile: bool = False  # torch.compile the model (first steps slower, then faster)
    # zoo.kernels applied after building: auto (the measured rules), none, or a list of kernel names
    kernels: Any = "auto"
    init_from: str | None = None  # hf:<model id or dir>: start from its weights (zoo/training/pretrained.py)
    tf32: bool = True  # float32 matmuls and convolutions on a CUDA GPU use TF32 tensor cores; no effect on CPU
    ckpt_path: str | None = None  # a .ckpt to resume from, or `last` for <run dir>/checkpoints/last.ckpt
    overwrite: bool = False  # true: a fresh run may replace the run already in its directory (else refused)
    budget: str | None = None  # params: resize d_ff so every FFN / attention variant matches the baseline's size;
    # active_params: the same for the parameters one token uses (ffn=moe: router + top_k experts)
    # Training length as a rule of the model's size (the ladders, conf/ladder/): trainer.max_steps becomes
    # ceil(tokens_per_param * parameters / tokens per step), the parameters counted as budget counts them
    # (active ones for ffn=moe); null: trainer.max_steps as set.
    tokens_per_param: float | None = None
    # What a finished run keeps of its checkpoints (a run cut short always keeps checkpoints/last.ckpt, to resume):
    # best_weights: best.ckpt as weights only (sample, eval, init_from: a third of the size), last.ckpt whole (to
    # resume); all: both with the optimizer's state; last: last.ckpt as weights only, no best.ckpt; none: neither.
    checkpoints: str = "best_weights"
    evals_per_run: int | None = None  # with tokens_per_param: trainer.val_check_interval = max_steps / evals_per_run

    @classmethod
    def from_plain(cls, plain: Any) -> ZooConfig:
        """A checked run config as plain data (a dict, as saved in config.yaml and checkpoints) -> typed. Keys the
        schema does not declare (hydra's own, say) are left out; a missing one takes its default."""
        from zoo.optim import resolve  # the optimizers import torch; the schema must not

        plain = json_copy(plain)
        sections = {"model": ModelConfig, "sample": SampleConfig}
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in plain:
                continue
            node = sections.get(f.name)
            values[f.name] = _section(node, plain[f.name]) if node is not None else plain[f.name]
        values["optim"] = resolve(plain.get("optim"))  # a config saved before the optim group: AdamW's
        if isinstance(values.get("budget"), dict):  # a sized run's config keeps budget's record: its kind is the key
            values["budget"] = values["budget"].get("kind")
        return cls(**values)

    def to_plain(self) -> dict:
        """The plain form: what config.yaml and checkpoints hold."""
        return json_copy(dataclasses.asdict(self))


def _section(node: type, plain: Any) -> Any:
    names = {f.name for f in dataclasses.fields(node)}
    return node(**{k: v for k, v in plain.items() if k in names})


def json_copy(value: Any) -> Any:
    """A deep copy of plain data with every ModelSpec and Part turned into its plain form."""
    if isinstance(value, (ModelSpec, Part, NormPart)):
        return value.as_dict()
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_copy(v) for v in value]
    return value


def model_defaults() -> dict:
    """ModelConfig's defaults as a plain dict: zoo.build.DEFAULTS."""
    return dataclasses.asdict(ModelConfig())


def default_of(key: str, missing: Any = None) -> Any:
    """The schema's default for a dotted key (`optim.eps` -> 1e-08: the default optimizer's option), or `missing`
    where it declares none."""
    section, _, option = key.partition(".")
    if section in RUN_KINDS and option:  # a training component's option: its registered default
        kind, name_key = RUN_KINDS[section]
        name = getattr(ZooConfig(), section)[name_key]
        return name if option == name_key else component_defaults(kind, name).get(option, missing)
    node: Any = ZooConfig()
    for part in key.split("."):
        if dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}:
            node = getattr(node, part)
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return missing
    return dataclasses.asdict(node) if dataclasses.is_dataclass(node) and not isinstance(node, type) else node


def component_defaults(kind: str, name: str) -> dict:
    """A registered component's (or optimizer's) options at their dataclass defaults, plain."""
    from zoo.registry import REGISTRIES

    return dataclasses.asdict(REGISTRIES[kind].options(name)())


# config group -> (registry kind, the key that names the component). Norm presets (pre_ln, ...) pair a
# placement with a norm type, so a norm type gets a base node but no `norm=<type>` option of its own.
KINDS: dict[str, tuple[str, str]] = {
    "model": ("model", "name"),
    "attention": ("attention", "name"),
    "position": ("position", "name"),
    "norm": ("norm", "type"),
    "ffn": ("ffn", "name"),
}
# The training's component groups: the same, but their nodes are top-level sections (`# @package optim`), not
# under model.
RUN_KINDS: dict[str, tuple[str, str]] = {"optim": ("optim", "name")}
BASE = "_zoo"  # the group of the generated nodes: conf/<kind>/<preset>.yaml starts from /_zoo/<kind>/<name>


def _omegaconf_type(t: Any) -> Any:
    """An options field's type as OmegaConf can check it (Literal -> str: the component checks the choice)."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Literal:
        kinds = {type(a) for a in args if a is not None}
        base = kinds.pop() if len(kinds) == 1 and not kinds & {list, dict} else Any
        return base | None if None in args else base
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner = _omegaconf_type(rest[0])
            return inner | None if len(rest) < len(args) else inner
        return Any
    return t if t in (int, float, bool, str, list[float]) else Any


_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "list[float]": list[float], "any": Any}


def _spec_type(t: Any) -> str:
    """An OmegaConf-checkable type as text for the cache: int, float | None, any, ..."""
    optional = typing.get_origin(t) in (typing.Union, types.UnionType)
    base = next((a for a in typing.get_args(t) if a is not type(None)), Any) if optional else t
    word = next((k for k, v in _TYPES.items() if v == base), "any")
    return f"{word} | None" if optional else word


def _live_specs() -> dict:
    """{kind: {name: [[option, type, default], ...]}} from the registries (imports the components: torch)."""
    from zoo.registry import REGISTRIES

    specs: dict = {}
    for kind, (registry_kind, _) in {**KINDS, **RUN_KINDS}.items():
        registry = REGISTRIES[registry_kind]
        for name in registry.names():
            options = registry.options(name)
            hints = typing.get_type_hints(options)
            rows = specs.setdefault(kind, {}).setdefault(name, [])
            for f in dataclasses.fields(options):
                default = f.default if f.default is not dataclasses.MISSING else (
                    f.default_factory() if f.default_factory is not dataclasses.MISSING else "???")
                rows.append([f.name, _spec_type(_omegaconf_type(hints[f.name])), default])
    return specs


def _cache_path() -> Path:
    """Where the specs are kept between runs, named by the sources of zoo/: any edit there makes a new name."""
    import hashlib

    root = Path(__file__).resolve().parent
    stamp = sorted(f"{p.relative_to(root)}:{p.stat().st_mtime_ns}:{p.stat().st_size}" for p in root.rglob("*.py"))
    return root / "__pycache__" / f"zoo-options-{hashlib.sha1(' '.join(stamp).encode()).hexdigest()[:16]}.json"


def option_specs() -> dict:
    """The components' options for the Hydra nodes. Read from the registries when they are loaded (and kept in
    zoo/__pycache__), else from that copy while no source under zoo/ has changed since: the command line's
    checks then answer without importing torch."""
    import json
    import sys

    from zoo.io import read_json
    from zoo.registry import plugins

    # Not loaded yet, the registries will hold today's sources; parts from ZOO_PLUGINS are outside zoo/, which
    # names the copy, so with plugins the options are always read live.
    fresh = "zoo.layers" not in sys.modules and not plugins()
    try:
        path = _cache_path()
    except OSError:
        path = None
    if fresh and path is not None and path.is_file():
        try:
            return read_json(path)
        except (OSError, ValueError):  # damaged (FileFormatError too): read the sources live
            pass
    specs = _live_specs()
    # Kept only when this call loaded the sources the name stands for: a process that imported zoo earlier (a
    # test session, a training run) may hold components from before an edit, and must not file them under the
    # new sources' name.
    if fresh and path is not None and path == _cache_path():
        try:
            from zoo.io import atomic_write_text

            path.parent.mkdir(exist_ok=True)
            atomic_write_text(path, json.dumps(specs))  # a default JSON cannot hold raises TypeError: not kept
        except (OSError, TypeError, ValueError):
            pass
    return specs


def component_node(kind: str, name: str, rows: list) -> type:
    """A dataclass for Hydra: the component's name and its options, typed, with their dataclass defaults."""
    fields: list = [({**KINDS, **RUN_KINDS}[kind][1], str, field(default=name))]
    for option, type_text, default in rows:
        word, optional = type_text.removesuffix(" | None"), type_text.endswith(" | None")
        t = _TYPES[word] | None if optional else _TYPES[word]
        fields.append((option, t, field(default_factory=functools.partial(copy.deepcopy, default))
                       if isinstance(default, (list, dict)) else field(default=default)))
    node = dataclasses.make_dataclass(f"{kind}_{name}", fields)
    node.__module__ = __name__  # made here; pickled by value (cloudpickle) when a launcher sends the ConfigStore
    return node


def register(conf_dir: Path | None = None) -> None:
    """Put the schema and every component's node in Hydra's ConfigStore; call before composing. `conf_dir`: the
    configs' folder (default zoo.cli.common.config_dir: the clone's conf/, else the wheel's)."""
    from hydra.core.config_store import ConfigStore

    from zoo.cli.common import config_dir

    conf_dir = config_dir() if conf_dir is None else conf_dir

    cs = ConfigStore.instance()
    cs.store(name="zoo_schema", node=ZooConfig)
    for kind, components in option_specs().items():
        for name, rows in components.items():
            node = component_node(kind, name, rows)
            cs.store(group=f"{BASE}/{kind}", name=name, node=node)
            if kind != "norm" and not (conf_dir / kind / f"{name}.yaml").exists():
                cs.store(group=kind, name=name, node=node, package=package(kind))


def package(kind: str) -> str:
    """Where a group's node goes in the config: model, model.<kind>, or a training group's own section (optim)."""
    return kind if kind in ("model", *RUN_KINDS) else f"model.{kind}"


def generated_options(group: str) -> list[str]:
    """The options of a config group that come from the ConfigStore (components with no preset file)."""
    from hydra.core.config_store import ConfigStore

    try:
        names = ConfigStore.instance().list(group)
    except (OSError, KeyError):
        return []
    return sorted(n.removesuffix(".yaml") for n in names if not n.startswith("_") and n.endswith(".yaml"))


def one_line(error: BaseException) -> str | None:
    """OmegaConf's validation error (found in the cause chain of Hydra's) as one line naming the key:
    `model.d_model: got 'abc'; valid: an integer`. None when the error is not a typed value's."""
    from omegaconf.errors import ValidationError

    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, ValidationError):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    key = seen.full_key or seen.key or "config"
    hints = {}
    if dataclasses.is_dataclass(seen.object_type):
        hints = typing.get_type_hints(seen.object_type)
    t = hints.get(str(seen.key).rpartition(".")[2]) if seen.key is not None else None
    first = seen.msg.splitlines()[0] if seen.msg else ""
    target = first.rpartition(" to ")[2] if "could not be converted" in first else ""
    words = _describe(t) if t is not None else _NODE_WORDS.get(target, first)
    return f"{key}: got {seen.value!r}; valid: {words}" if seen.value is not None else f"{key}: {words}"


_NODE_WORDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}


def _describe(t: Any) -> str:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None)) + (", or null" if type(None) in args
                                                                               else "")
    if origin is list:
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    if dataclasses.is_dataclass(t):
        return f"a mapping of its settings (zoo/schema.py {getattr(t, '__name__', t)})"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(t, str(t))
