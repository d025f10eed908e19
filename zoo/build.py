"""build_model(model_cfg): a model from registry names and numbers only, plus analytic counts.

The model config is a plain dict (or the Hydra subtree `cfg.model`):

    {"name": "decoder_only", "vocab_size": 65, "d_model": 128, "n_layers": 4, "n_heads": 4,
     "max_seq_len": 256, "attention": {"name": "gqa", "n_kv_heads": 2},
     "position": {"name": "rope"}, "norm": {"placement": "pre", "type": "rmsnorm"},
     "ffn": {"name": "swiglu"}}

Anything left out takes the value in DEFAULTS. Bad values fail in `resolve_config`, with one line
naming the key, before any weight is allocated. `resolve_config` returns the typed, frozen
`zoo.spec.ModelSpec` the models read (`spec.as_dict()` is the plain dict again); every function here
takes either form, or the config's model node (zoo.config.schema.ModelConfig, a dataclass).
"""

from __future__ import annotations

import copy
import dataclasses
import zlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

import zoo.layers  # noqa: F401  (registers the components)
import zoo.models  # noqa: F401  (registers the lineages)
from zoo.block import SUBLAYER_LETTERS, TransformerBlock
from zoo.component import (
    ConfigError,
    Options,
    check_options,
    declared,
    is_int,
    is_number,
    need,
    option_fields,
    refusal,
)
from zoo.meta import on_meta, spec_of
from zoo.models.stack import applications, flops_shares
from zoo.mup import FIXED, init_scale, roles, width_mult
from zoo.mup import check as check_parametrization
from zoo.registry import ATTENTION, FFN, MODEL, NORM, POSITION, REGISTRIES, RESIDUAL, Registry
from zoo.spec import ModelSpec, Part, model_defaults

# The model keys and their defaults, declared once (zoo/spec.py ModelSpec); a component's options are
# declared, with their defaults, in its own options dataclass.
DEFAULTS: dict[str, Any] = model_defaults()

# config key -> (registry, the key that names the component, keys of the node that are not its options)
COMPONENTS: dict[str, tuple[Registry, str, tuple[str, ...]]] = {
    "attention": (ATTENTION, "name", ()),
    "position": (POSITION, "name", ()),
    "norm": (NORM, "type", ("placement",)),
    "ffn": (FFN, "name", ()),
}

# model.residual_init: where the weights parts list in residual_outputs start (init_weights)
RESIDUAL_INITS = ("scaled", "zero")

# A model config as callers hand it over: a mapping (a dict, an omegaconf DictConfig), the config's model node (a
# dataclass instance), or one resolve_config has already resolved.
ModelInput = Mapping[str, Any] | ModelSpec | Any


def _plain(cfg: Any) -> Any:
    if hasattr(cfg, "_metadata"):  # an omegaconf container; imported lazily to keep zoo light
        from omegaconf import OmegaConf

        return OmegaConf.to_container(cfg, resolve=True)
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):  # zoo.config.schema.ModelConfig
        return dataclasses.asdict(cfg)
    return copy.deepcopy(cfg)


def resolve_config(model_cfg: ModelInput) -> ModelSpec:
    """DEFAULTS overlaid with model_cfg, validated: the typed, frozen ModelSpec (returned as is when given one)."""
    if isinstance(model_cfg, ModelSpec):
        return model_cfg
    return checked(_spec(model_cfg))


def _spec(model_cfg: ModelInput) -> ModelSpec:
    """resolve_config's spec before the checks that only building it can make (`checked`)."""
    user = _plain(model_cfg)
    unknown = sorted(set(user) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"model.{unknown[0]}: unknown key; valid: {', '.join(sorted(DEFAULTS))}")
    cfg = copy.deepcopy(DEFAULTS)
    for key, value in user.items():
        if isinstance(DEFAULTS[key], dict):
            if not isinstance(value, Mapping):
                raise ConfigError(f"model.{key}: expected a mapping with a name, got {value!r}")
            cfg[key] = {**DEFAULTS[key], **value}
        else:
            cfg[key] = value
    _validate(cfg)
    parts = _parts(cfg)  # takes the component nodes out of cfg
    _check_refusals(cfg["name"], parts)
    return ModelSpec(**cfg, **parts)


def checked(spec: ModelSpec) -> ModelSpec:
    """The checks of a spec that only building it can make, for a new one or a changed copy
    (dataclasses.replace): each component checks its own constraints as it is built, on the meta device, which
    allocates nothing; then muP's reference widths, built the same way."""
    on_meta(spec)
    check_parametrization(spec)
    return spec


def flatten_config(d: Mapping, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: the dotted keys of a nested config."""
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _positive_int(key: str, v: Any, optional: bool = False) -> None:
    ok = (optional and v is None) or (is_int(v) and v > 0)
    need(ok, key, f"must be a positive integer{' or null' if optional else ''}, got {v!r}")


def _positive_number(key: str, v: Any) -> None:
    ok = is_number(v) and v > 0
    need(ok, key, f"must be positive, got {v!r}; valid: a finite number > 0")


def _boolean(key: str, v: Any) -> None:
    need(isinstance(v, bool), key, f"must be true or false, got {v!r}")


def _check_name(registry: Registry, key: str, name: Any) -> None:
    need(isinstance(name, str) and name in registry, key,
          f"unknown {registry.kind} {name!r}; valid: {', '.join(registry.names())}")


def _validate(cfg: dict) -> None:
    _check_name(MODEL, "name", cfg["name"])
    for key in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
        _positive_int(key, cfg[key])
    _positive_int("n_decoder_layers", cfg["n_decoder_layers"], optional=True)
    d, h = cfg["d_model"], cfg["n_heads"]
    need(d % h == 0, "d_model", f"{d} is not divisible by n_heads={h}")
    need(isinstance(cfg["dropout"], (int, float)) and 0 <= cfg["dropout"] < 1, "dropout",
          f"must be in [0, 1), got {cfg['dropout']!r}")
    _positive_number("init_std", cfg["init_std"])
    need(cfg["final_norm"] in (True, False, None), "final_norm",
          f"must be true, false or null, got {cfg['final_norm']!r}; valid: true, false, null")
    for key in ("bias", "tie_embeddings", "scale_embeddings", "embed_norm", "embed_skip", "value_residual"):
        _boolean(key, cfg[key])
    cap = cfg["logit_softcap"]
    need(cap is None or (is_number(cap) and cap > 0), "logit_softcap",
         f"must be positive or null, got {cap!r}; valid: a finite number > 0 (the speedrun's 30 or 15), or null")
    need(is_int(cfg["value_embeddings"]) and cfg["value_embeddings"] >= 0, "value_embeddings",
         f"must be an integer >= 0, got {cfg['value_embeddings']!r} (0: none)")
    need(is_int(cfg["memory_tokens"]) and cfg["memory_tokens"] >= 0, "memory_tokens",
         f"must be an integer >= 0, got {cfg['memory_tokens']!r} (0: none)")
    need(is_int(cfg["shift_tokens"]) and cfg["shift_tokens"] >= 0, "shift_tokens",
         f"must be an integer >= 0, got {cfg['shift_tokens']!r} (0: off, 1: half a decoder's channels from the "
         "previous token)")
    need(is_int(cfg["residual_streams"]) and cfg["residual_streams"] >= 1, "residual_streams",
         f"must be an integer >= 1, got {cfg['residual_streams']!r} (the hyper-connection placements' streams)")
    need(cfg["residual_init"] in RESIDUAL_INITS, "residual_init",
         f"unknown {cfg['residual_init']!r}; valid: {', '.join(RESIDUAL_INITS)}")

    _check_sublayers(cfg)
    _check_name(RESIDUAL, "norm.placement", cfg["norm"]["placement"])
    # conf/norm/*.yaml set placement and type; the preset's name is only the Hydra option (norm=post_ln).
    _check_name(NORM, "norm.type", cfg["norm"]["type"])
    norm_keys = ", ".join(sorted(["placement", "type", *option_fields(NORM.options(cfg["norm"]["type"]))]))
    need("name" not in cfg["norm"], "norm.name", "unknown key (the presets pre_ln, post_ln, ... are chosen with "
         f"norm=post_ln and set placement and type); valid: {norm_keys}")


def _check_sublayers(cfg: dict) -> None:
    value, n = cfg["sublayers"], cfg["n_layers"]
    patterns = [value] if isinstance(value, str) else value
    valid = (f"a string of the letters {', '.join(SUBLAYER_LETTERS)} for every block, a list of one per block, "
             "or null")
    need(value is None or (isinstance(patterns, list) and all(isinstance(p, str) and p and set(p) <= set(
        SUBLAYER_LETTERS) for p in patterns)), "sublayers", f"got {value!r}; valid: {valid}")
    layers = {n, cfg["n_decoder_layers"] or n} if len(MODEL.get(cfg["name"]).stacks) == 2 else {n}
    need(not isinstance(value, list) or layers == {len(value)}, "sublayers",
         f"a list of {len(value or [])} blocks' sublayers for a stack of {' and '.join(map(str, sorted(layers)))}; "
         "valid: one string per block of every stack")
    need(value is None or not cfg["value_embeddings"], "sublayers",
         "not with model.value_embeddings (the tables are read by the standard block's attention); valid: null")


def _parts(cfg: dict) -> dict[str, Any]:
    """Each component node of a checked config -> its Part: the name and its options dataclass, checked."""
    parts: dict[str, Any] = {}
    for key, (registry, name_key, skip) in COMPONENTS.items():
        node = cfg.pop(key)
        _check_name(registry, f"{key}.{name_key}", node[name_key])
        values = {k: v for k, v in node.items() if k != name_key and k not in skip}
        opts = check_options(key, node[name_key], registry.options(node[name_key]), values)
        parts[key] = Part(node[name_key], opts, node["placement"] if key == "norm" else "")
    return parts


def chosen_parts(name: str, parts: dict[str, Any]) -> dict[str, tuple[str, Any, Any, str]]:
    """The model's parts by registry kind: kind -> (name, options, registered entry, config key)."""
    norm = parts["norm"]
    return {"model": (name, Options(), MODEL.get(name), "name"),
            "residual": (norm.placement, Options(), RESIDUAL.get(norm.placement), "norm.placement"),
            **{key: (p.name, p.options, registry.get(p.name), f"{key}.{name_key}")
               for key, (registry, name_key, _) in COMPONENTS.items() for p in (parts[key],)}}


def _check_refusals(name: str, parts: dict[str, Any]) -> None:
    """Each part's declared refusals (Part.refuses, Placement.refuses) of another part of this model, one line naming
    both, before anything is built."""
    chosen = chosen_parts(name, parts)
    for kind, (who, _, entry, _) in chosen.items():
        for other, (them, opts, _, key) in chosen.items():
            found = refusal(entry, other, them, opts) if other != kind else None
            if found is None:
                continue
            by, why = found
            refused = declared(entry, "refuses")[other]
            at, valid = (key, ", ".join(n for n in REGISTRIES[other].names() if n not in refused)) if by == them else (
                f"{key.rpartition('.')[0] or key}.{by}", "false")  # refused for an option it sets
            word = {"residual": "placement", "model": "lineage"}  # the kinds as the config names them
            raise ConfigError(f"model.{at}: {word.get(other, other)} '{them}' cannot be in one model with "
                              f"{word.get(kind, kind)} '{who}', whose `refuses` says: {why}; valid: {valid}")


def build_model(model_cfg: ModelInput, seed: int = 0) -> nn.Module:
    """Build and initialise a model from registry names and numbers (see the module docstring). A config not yet
    resolved is checked by this build itself (each component checks its constraints as it is built, which is what
    resolve_config's build on the meta device is for), then muP's reference widths: built once, not twice."""
    cfg = model_cfg if isinstance(model_cfg, ModelSpec) else _spec(model_cfg)
    model = MODEL.get(cfg.name)(cfg)
    check_parametrization(cfg)
    init_weights(model, cfg, seed)
    return model


def meta_model(model_cfg: ModelInput) -> nn.Module:
    """The model built on the meta device: every shape and component, no memory, no initialisation."""
    return on_meta(resolve_config(model_cfg))


def has_final_norm(cfg: ModelSpec) -> bool:
    """model.final_norm, or where it is null, what the placement needs (pre, sandwich, parallel: yes; post: no)."""
    if cfg.final_norm is not None:
        return cfg.final_norm
    return RESIDUAL.get(cfg.norm.placement).final_norm


def init_weights(model: nn.Module, cfg: ModelSpec, seed: int = 0) -> None:
    """The zoo's initialisation, documented in docs/options.md (Initialisation):

    - weights ~ N(0, init_std): linear layers, embeddings, learned positions, any other weight;
    - the weights a component lists in `residual_outputs` (attention `out`, FFN `down`: they write
      into the residual stream) get init_std / sqrt(2 * blocks), so the residual sum keeps its
      scale with depth (GPT-2), or 0 with model.residual_init=zero (the speedrun's zero-initialised
      projections: each block starts as the identity, and the first step's gradient reaches these
      weights through their inputs, which are not zero);
    - biases 0, and the parameters a component lists in `constants` their constant (norm weights 1, a mix's
      scalars their start, zoo/layers/mix.py).
    Each parameter draws from its own generator, seeded by the seed and the parameter's name, so
    swapping one component leaves every other component's initial weights unchanged.
    Under model.parametrization=mup, hidden weights' std is further divided by sqrt(width_mult) (zoo/mup.py).
    Last, each placement that declares `init_for_depth(blocks)` sets its own start for the model's depth. A placement's
    `after_step(model)` (nGPT's unit matrices) is not run here, so the draws stay every placement's: a fresh training
    run calls it before its first step (zoo/training/module.py's on_fit_start).
    """
    times = applications(model)  # a shared block counts once per layer that applies it
    n_blocks = sum(times.get(id(m), 1) for m in model.modules() if isinstance(m, TransformerBlock))
    constants: dict[int, float] = {}
    residual_out: set[int] = set()
    for m in model.modules():
        if hasattr(m, "count_as"):  # a part (zoo.component.Part): it declares its init roles
            constants |= {id(getattr(m, name)): value for name, value in declared(m, "constants").items()}
            residual_out |= {id(getattr(m, name).weight) for name in declared(m, "residual_outputs")}
    if cfg.residual_init == "zero":
        constants |= dict.fromkeys(residual_out, 0.0)
    std = cfg.init_std
    role = roles(cfg) if width_mult(cfg) != 1 else {}  # muP's roles; at width_mult 1 every factor is 1
    with torch.no_grad():
        for name, p in model.named_parameters():
            if id(p) in constants:
                p.fill_(constants[id(p)])
            elif name.endswith("bias"):
                p.zero_()
            else:
                g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
                s = std / (2 * n_blocks) ** 0.5 if id(p) in residual_out else std
                p.copy_(torch.randn(p.shape, generator=g) * (s * init_scale(role.get(name, FIXED), cfg)))
        for m in model.modules():  # a placement's own start for this depth (Placement.init_for_depth)
            if callable(getattr(m, "init_for_depth", None)):
                m.init_for_depth(n_blocks)


COUNT_GROUPS = ("embedding", "position", "attention", "ffn", "norm", "head")


def _owners(model: nn.Module) -> dict[int, nn.Module]:
    """Each parameter (by id) -> the innermost module that declares `count_as`, when one does."""
    owners = {}
    for m in model.modules():  # outer modules come first, so inner ones overwrite them
        if hasattr(m, "count_as"):
            owners.update({id(p): m for p in m.parameters()})
    return owners


def count_params(model_cfg: ModelInput) -> dict[str, int]:
    """Parameters by component, counted on the model built on the meta device (nothing allocated).

    Keys: embedding (token embeddings), position, attention, ffn, norm, head (output layers), total,
    and active: the parameters one token uses (less than total for sparse parts such as experts)."""
    model = meta_model(model_cfg)
    owners = _owners(model)
    out = dict.fromkeys(COUNT_GROUPS, 0)
    for m in model.modules():  # token embeddings: every nn.Embedding no component owns
        if isinstance(m, nn.Embedding) and id(m.weight) not in owners:
            owners[id(m.weight)] = m
    for p in model.parameters():  # each shared (tied) parameter once
        owner = owners.get(id(p))
        group = "embedding" if isinstance(owner, nn.Embedding) else getattr(owner, "count_as", "head")
        out[group] += p.numel()
    out["total"] = sum(out.values())
    parts = [m for m in model.modules() if hasattr(m, "count_as")]
    out["active"] = out["total"] - sum(declared(m, "inactive_params")() for m in parts)
    return out


def flops_per_token(model_cfg: ModelInput, seq_len: int | None = None) -> dict[str, int]:
    """Matrix-multiply FLOPs per token at context `seq_len` (default max_seq_len).

    forward = what each component reports (`flops(t)`; by default 2 per weight of its linear layers,
    and attention adds 4 * t * d for the scores and the weighted sum), plus 2 per weight of the linear
    layers outside components (the output head); only active weights for sparse parts (Kaplan et al.
    2020; PaLM appendix B). train = 3 * forward. For encoder_decoder it is per target token, with a
    source of the same length."""
    model = meta_model(model_cfg)
    t = seq_len or spec_of(model).max_seq_len
    forward, inside, times, shares = 0, set(), applications(model), flops_shares(model)
    for m in model.modules():
        if id(m) in inside or not hasattr(m, "count_as"):
            continue
        inside |= {id(sub) for sub in m.modules()}
        share, context = shares.get(id(m), (1.0, 1.0))  # model.funnel: a pooled block's tokens and context
        forward += round(share * declared(m, "flops")(max(1, round(t * context)))) * times.get(id(m), 1)
    forward += sum(2 * m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in inside)
    return {"forward": forward, "train": 3 * forward}
