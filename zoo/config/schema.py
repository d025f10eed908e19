"""The config's typed schema: every key's type and default, declared once.

- `ModelConfig`: the model section as Hydra composes it, made from zoo.spec.ModelSpec's fields (the one typed
  description of a model; zoo.build.resolve_config makes a spec of it). A component's options are not here: each
  component declares them in its own options dataclass (zoo/layers/*.py).
- `ZooConfig`: what train.py composes (model, optim, sample, the top-level keys). data, trainer and logger differ
  from one preset to the next, so they stay mappings here, checked by zoo.config.checks; zoo.config.plan reads
  the checked, sized config into the typed RunPlan the run uses. `optim` is a component group (zoo/optim/: the
  optimizer's name and its own options), read as a `Part`.
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
import hashlib
import json
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf.errors import ConfigKeyError, ValidationError

from zoo.commands import config_dir
from zoo.component import Options
from zoo.io import atomic_write_text, read_json
from zoo.registry import REGISTRIES, plugins
from zoo.spec import COMPONENT_DEFAULTS, ModelSpec, Part


def _model_node() -> type:
    """The model's Hydra node, made from zoo.spec.ModelSpec's fields (the one place they are declared): each key
    with its type and default, a component as its default node (any mapping: its options are its own); the keys a
    spec requires (vocab_size) are null until set."""
    hints = typing.get_type_hints(ModelSpec, localns={"AttentionOptions": Options, "NormOptions": Options})
    fields: list[Any] = []
    for f in dataclasses.fields(ModelSpec):
        if f.name in COMPONENT_DEFAULTS:
            fields.append((f.name, Any, field(default_factory=functools.partial(dict, COMPONENT_DEFAULTS[f.name]))))
        elif f.default is dataclasses.MISSING:
            fields.append((f.name, hints[f.name] | None, field(default=None)))
        else:
            kind = Any if hints[f.name] is Any else hints[f.name]
            fields.append((f.name, kind if f.name != "max_seq_len" else int | None, field(default=f.default)))
    node = dataclasses.make_dataclass("ModelConfig", fields)
    node.__module__ = __name__
    node.__doc__ = "The model section of a config as Hydra composes it: zoo.spec.ModelSpec's keys, plain."
    return node


ModelConfig = _model_node()


@dataclass
class SampleConfig:
    """Text printed after training (decoder_only and encoder_decoder)."""

    prompt: str = "\n"
    max_new_tokens: int = 200
    temperature: float = 0.8  # 0: greedy
    top_k: int | None = 40
    top_p: float | None = None


@dataclass
class ZooConfig:
    """What `python train.py` composes, less Hydra's own section."""

    # Training sizes the positions to the data's context unless max_seq_len is set.
    model: ModelConfig = field(default_factory=lambda: ModelConfig(max_seq_len=None))  # type: ignore[valid-type]
    # The optimizer (conf/optim/, zoo/optim/): its name and options; in a composed config the chosen preset's node.
    # Read typed (zoo.config.plan) as a Part whose options extend zoo.optim.OptimOptions: lr, min_lr, warmup_steps, ...
    optim: Any = field(default_factory=lambda: {"name": "adamw"})
    sample: SampleConfig = field(default_factory=SampleConfig)
    data: Any = field(default_factory=dict)  # conf/data/: kinds differ (text, task, hf): zoo/config/data.py
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


def json_copy(value: Any) -> Any:
    """A deep copy of plain data with every ModelSpec and Part turned into its plain form."""
    if isinstance(value, (ModelSpec, Part)):
        return value.as_dict()
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_copy(v) for v in value]
    return value


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


def component_defaults(kind: str, name: str) -> dict[str, Any]:
    """A registered component's (or optimizer's) options at their dataclass defaults, plain."""
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


def _live_specs() -> dict[str, Any]:
    """{kind: {name: [[option, type, default], ...]}} from the registries (imports the components: torch)."""
    specs: dict[str, Any] = {}
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
    root = Path(__file__).resolve().parent
    stamp = sorted(f"{p.relative_to(root)}:{p.stat().st_mtime_ns}:{p.stat().st_size}" for p in root.rglob("*.py"))
    return root / "__pycache__" / f"zoo-options-{hashlib.sha1(' '.join(stamp).encode()).hexdigest()[:16]}.json"


def option_specs() -> dict[str, Any]:
    """The components' options for the Hydra nodes. Read from the registries when they are loaded (and kept in
    zoo/__pycache__), else from that copy while no source under zoo/ has changed since: the command line's
    checks then answer without importing torch."""
    # Not loaded yet, the registries will hold today's sources; parts from ZOO_PLUGINS are outside zoo/, which
    # names the copy, so with plugins the options are always read live.
    fresh = "zoo.layers" not in sys.modules and not plugins()
    try:
        path = _cache_path()
    except OSError:
        path = None
    if fresh and path is not None and path.is_file():
        try:
            specs: dict[str, Any] = read_json(path)
            return specs
        except (OSError, ValueError):  # damaged (FileFormatError too): read the sources live
            pass
    specs = _live_specs()
    # Kept only when this call loaded the sources the name stands for: a process that imported zoo earlier (a
    # test session, a training run) may hold components from before an edit, and must not file them under the
    # new sources' name.
    if fresh and path is not None and path == _cache_path():
        try:
            path.parent.mkdir(exist_ok=True)
            atomic_write_text(path, json.dumps(specs))  # a default JSON cannot hold raises TypeError: not kept
        except (OSError, TypeError, ValueError):
            pass
    return specs


def component_node(kind: str, name: str, rows: list[Any]) -> type:
    """A dataclass for Hydra: the component's name and its options, typed, with their dataclass defaults."""
    fields: list[Any] = [({**KINDS, **RUN_KINDS}[kind][1], str, field(default=name))]
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
    configs' folder (default zoo.commands.config_dir: the clone's conf/, else the wheel's). Stored once per
    process and folder while the registered options stay the same (`--help` asks once per group)."""
    conf_dir = config_dir() if conf_dir is None else conf_dir
    specs = option_specs()
    if _REGISTERED.get(conf_dir) == specs:
        return
    cs = ConfigStore.instance()
    cs.store(name="zoo_schema", node=ZooConfig)
    for kind, components in specs.items():
        for name, rows in components.items():
            node = component_node(kind, name, rows)
            cs.store(group=f"{BASE}/{kind}", name=name, node=node)
            if kind != "norm" and not (conf_dir / kind / f"{name}.yaml").exists():
                cs.store(group=kind, name=name, node=node, package=package(kind))
    _REGISTERED[conf_dir] = copy.deepcopy(specs)


_REGISTERED: dict[Path, Any] = {}  # conf_dir -> the options register() stored for it


def package(kind: str) -> str:
    """Where a group's node goes in the config: model, model.<kind>, or a training group's own section (optim)."""
    return kind if kind in ("model", *RUN_KINDS) else f"model.{kind}"


def generated_options(group: str) -> list[str]:
    """The options of a config group that come from the ConfigStore (components with no preset file)."""
    try:
        names = ConfigStore.instance().list(group)
    except (OSError, KeyError):
        return []
    return sorted(n.removesuffix(".yaml") for n in names if not n.startswith("_") and n.endswith(".yaml"))


def one_line(error: BaseException) -> str | None:
    """OmegaConf's validation error (found in the cause chain of Hydra's) as one line naming the key:
    `model.d_model: got 'abc'; valid: an integer`. Also a preset's key that the option chosen beside it lacks
    (`experiment=nanogpt_cpu_fast optim=adamw`: the preset sets Muon's optim.adamw_lr): the key, the preset, the
    option and its keys. None for any other error."""
    if (missing := _in_chain(error, ConfigKeyError)) is not None and missing.full_key and \
            dataclasses.is_dataclass(missing.object_type):
        parent, _, _ = missing.full_key.rpartition(".")
        group = parent.rpartition(".")[2]
        name = missing.object_type.__name__
        option = name.removeprefix(group + "_") if group else name  # the generated class: <group>_<option>
        by = re.match(r"In '([^']+)'", str(error))  # Hydra names the config that set it
        keys = [f.name for f in dataclasses.fields(missing.object_type) if f.name != "name"]  # name: the choice
        valid = ", ".join(sorted(keys))
        return f"{missing.full_key}{f' (set by {by.group(1)})' if by else ''}: not an option of {option!r}; " \
               f"valid: {valid}"
    seen = _in_chain(error, ValidationError)
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


E = typing.TypeVar("E", bound=BaseException)


def _in_chain(error: BaseException, kind: type[E]) -> E | None:
    """The first error of `kind` in error's chain of causes (error itself included)."""
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, kind):
        seen = seen.__cause__ or seen.__context__
    return seen


_NODE_WORDS = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}


def _describe(t: Any) -> str:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not type(None)) + (", or null" if type(None) in args
                                                                               else "")
    if origin is list:
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    if dataclasses.is_dataclass(t):
        return f"a mapping of its settings (zoo/config/schema.py {getattr(t, '__name__', t)})"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(t, str(t))
