"""build_model(model_cfg): a model from registry names and numbers only, plus analytic counts.

The model config is a plain dict (or the Hydra subtree `cfg.model`):

    {"name": "decoder_only", "vocab_size": 65, "d_model": 128, "n_layers": 4, "n_heads": 4,
     "max_seq_len": 256, "attention": {"name": "gqa", "n_kv_heads": 2},
     "position": {"name": "rope"}, "norm": {"placement": "pre", "type": "rmsnorm"},
     "ffn": {"name": "swiglu"}}

Anything left out takes the value in DEFAULTS. Bad values fail in `resolve_config`, with one line
naming the key, before any weight is allocated.
"""

from __future__ import annotations

import copy
import inspect
import math
import zlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

import zoo.layers  # noqa: F401  (registers the components)
import zoo.models  # noqa: F401  (registers the lineages)
from zoo.layers.attention import BACKENDS, kv_heads
from zoo.layers.ffn import default_d_ff
from zoo.registry import ATTENTION, FFN, MODEL, NORM, POSITION, RESIDUAL, Registry

DEFAULTS: dict[str, Any] = {
    "name": "decoder_only",
    "vocab_size": None,  # required; training sets it from the tokenizer
    "d_model": 128,
    "n_layers": 4,
    "n_decoder_layers": None,  # encoder_decoder only; None = n_layers
    "n_heads": 4,
    "max_seq_len": 256,
    "dropout": 0.0,
    "bias": True,  # biases in linear layers and LayerNorm
    "tie_embeddings": True,  # output head shares the token embedding matrix
    "scale_embeddings": False,  # multiply token embeddings by sqrt(d_model) (Vaswani et al.)
    "embed_norm": False,  # a norm right after the embeddings (BERT, BART)
    "init_std": 0.02,
    "final_norm": None,  # a norm after each stack's last block; None: where the placement needs one (pre, sandwich)
    "attention": {"name": "mha", "window": None, "backend": "sdpa"},
    "position": {"name": "learned"},
    "norm": {"placement": "pre", "type": "layernorm", "eps": 1e-5},
    "ffn": {"name": "gelu", "d_ff": None},
}


class ConfigError(ValueError):
    """A bad model or training config, reported as one line that names the key."""


def _plain(cfg: Any) -> Any:
    if hasattr(cfg, "_metadata"):  # an omegaconf container; imported lazily to keep zoo light
        from omegaconf import OmegaConf

        return OmegaConf.to_container(cfg, resolve=True)
    return copy.deepcopy(cfg)


def resolve_config(model_cfg: Mapping) -> dict:
    """DEFAULTS overlaid with model_cfg, validated. Returns a new plain dict."""
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
    return cfg


def flatten_config(d: Mapping, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}: the dotted keys of a nested config."""
    out = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _need(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ConfigError(f"model.{key}: {msg}")


def is_int(v: Any) -> bool:
    """An integer from a config (YAML's true/false are ints in Python, not counts)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A finite int or float from a config, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _positive_int(key: str, v: Any, optional: bool = False) -> None:
    ok = (optional and v is None) or (is_int(v) and v > 0)
    _need(ok, key, f"must be a positive integer{' or null' if optional else ''}, got {v!r}")


def _positive_number(key: str, v: Any) -> None:
    ok = is_number(v) and v > 0
    _need(ok, key, f"must be positive, got {v!r}; valid: a finite number > 0")


def _boolean(key: str, v: Any) -> None:
    _need(isinstance(v, bool), key, f"must be true or false, got {v!r}")


def _check_name(registry: Registry, key: str, name: Any) -> None:
    _need(isinstance(name, str) and name in registry, key,
          f"unknown {registry.kind} {name!r}; valid: {', '.join(registry.names())}")


def _check_options(key: str, fn: Any, opts: dict, standard: set[str]) -> None:
    """Extra options of a component must be parameters of its constructor."""
    params = set(inspect.signature(fn).parameters) - standard
    for opt in opts:
        _need(opt in params, f"{key}.{opt}", f"not an option of '{fn.__name__}'; valid: "
              f"{', '.join(sorted(params)) or 'none'}")


def _validate(cfg: dict) -> None:
    _check_name(MODEL, "name", cfg["name"])
    for key in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
        _positive_int(key, cfg[key])
    _positive_int("n_decoder_layers", cfg["n_decoder_layers"], optional=True)
    d, h = cfg["d_model"], cfg["n_heads"]
    _need(d % h == 0, "d_model", f"{d} is not divisible by n_heads={h}")
    _need(isinstance(cfg["dropout"], (int, float)) and 0 <= cfg["dropout"] < 1, "dropout",
          f"must be in [0, 1), got {cfg['dropout']!r}")
    _positive_number("init_std", cfg["init_std"])
    _need(cfg["final_norm"] in (True, False, None), "final_norm",
          f"must be true, false or null, got {cfg['final_norm']!r}; valid: true, false, null")
    for key in ("bias", "tie_embeddings", "scale_embeddings", "embed_norm"):
        _boolean(key, cfg[key])

    att = cfg["attention"]
    _check_name(ATTENTION, "attention.name", att["name"])
    _check_options("attention", ATTENTION.get(att["name"]),
                   {k: v for k, v in att.items() if k not in ("name", "window")},
                   {"d_model", "n_heads", "bias", "dropout", "cross"})
    _need(att.get("backend", "sdpa") in BACKENDS, "attention.backend",
          f"unknown '{att.get('backend')}'; valid: {', '.join(BACKENDS)}")
    _positive_int("attention.window", att.get("window"), optional=True)
    if att["name"] == "gqa":
        kv = att.get("n_kv_heads")
        _positive_int("attention.n_kv_heads", kv)
        _need(h % kv == 0, "attention.n_kv_heads", f"n_heads={h} is not divisible by n_kv_heads={kv}")

    pos = cfg["position"]
    _check_name(POSITION, "position.name", pos["name"])
    _check_options("position", POSITION.get(pos["name"]), {k: v for k, v in pos.items() if k != "name"},
                   {"self", "d_model", "n_heads", "max_seq_len"})
    for opt in ("theta", "base"):  # RoPE's and sinusoidal's wavelength bases: 0 or less gives nan angles
        if opt in pos:
            _positive_number(f"position.{opt}", pos[opt])
    if pos["name"] == "rope":
        _need((d // h) % 2 == 0, "position.name", f"rope needs an even head size, got d_model/n_heads={d // h}")

    norm = cfg["norm"]
    _check_name(NORM, "norm.type", norm["type"])
    _check_name(RESIDUAL, "norm.placement", norm["placement"])
    _positive_number("norm.eps", norm["eps"])
    # conf/norm/*.yaml set placement and type; the preset's name is only the Hydra option (norm=post_ln).
    _need("name" not in norm, "norm.name", "unknown key (the presets pre_ln, post_ln, ... are chosen with "
          "norm=post_ln and set placement and type); valid: eps, placement, type")
    unknown = sorted(set(norm) - {"type", "placement", "eps"})
    _need(not unknown, f"norm.{unknown[0] if unknown else ''}", "unknown key; valid: eps, placement, type")

    ffn = cfg["ffn"]
    _check_name(FFN, "ffn.name", ffn["name"])
    _positive_int("ffn.d_ff", ffn.get("d_ff"), optional=True)
    unknown = sorted(set(ffn) - {"name", "d_ff"})
    _need(not unknown, f"ffn.{unknown[0] if unknown else ''}", "unknown key; valid: d_ff, name")


def build_model(model_cfg: Mapping, seed: int = 0) -> nn.Module:
    """Build and initialise a model from registry names and numbers (see the module docstring)."""
    cfg = resolve_config(model_cfg)
    model = MODEL.get(cfg["name"])(cfg)
    init_weights(model, cfg, seed)
    return model


def has_final_norm(cfg: dict) -> bool:
    """model.final_norm, or where it is null, what the placement needs (pre and sandwich: yes, post: no)."""
    if cfg["final_norm"] is not None:
        return cfg["final_norm"]
    return RESIDUAL.get(cfg["norm"]["placement"]).final_norm


def total_layers(cfg: dict) -> int:
    """Blocks in the whole model: the encoder's and the decoder's for encoder_decoder."""
    if cfg["name"] == "encoder_decoder":
        return cfg["n_layers"] + (cfg["n_decoder_layers"] or cfg["n_layers"])
    return cfg["n_layers"]


def init_weights(model: nn.Module, cfg: dict, seed: int = 0) -> None:
    """The zoo's initialisation, documented in the README:

    - weights of linear layers, embeddings and learned positions ~ N(0, init_std);
    - the projections that write into the residual stream (attention `out`, FFN `down`) get
      init_std / sqrt(2 * layers), so the residual sum keeps its scale with depth (GPT-2);
    - biases 0, norm gains 1.
    Each parameter draws from its own generator, seeded by the seed and the parameter's name, so
    swapping one component leaves every other component's initial weights unchanged.
    """
    n_layers = total_layers(cfg)
    norm_params = {id(p) for m in model.modules() if isinstance(m, tuple(NORM.get(n) for n in NORM.names()))
                   for p in m.parameters()}
    std = cfg["init_std"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if id(p) in norm_params:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                residual_out = name.endswith(("f.out.weight", "f.down.weight"))
                g = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
                s = std / (2 * n_layers) ** 0.5 if residual_out else std
                p.copy_(torch.randn(p.shape, generator=g) * s)


def count_params(model_cfg: Mapping) -> dict[str, int]:
    """Parameter count by component, computed from the config alone (no model is built).

    Keys: embedding (tokens and learned positions), attention, ffn, norm, head, total."""
    c = resolve_config(model_cfg)
    d, v, b, h = c["d_model"], c["vocab_size"], int(c["bias"]), c["n_heads"]
    hd, kv = d // h, kv_heads(c["attention"]["name"], h, c["attention"].get("n_kv_heads"))
    ffn_cls = FFN.get(c["ffn"]["name"])
    d_ff = c["ffn"].get("d_ff") or default_d_ff(d, ffn_cls.gated)
    n_mats = 3 if ffn_cls.gated else 2
    norm = d + (b * d if c["norm"]["type"] == "layernorm" else 0)
    residual = RESIDUAL.get(c["norm"]["placement"])

    attention = d * (h + 2 * kv) * hd + b * (h + 2 * kv) * hd + h * hd * d + b * d
    ffn = n_mats * d * d_ff + b * ((n_mats - 1) * d_ff + d)
    enc_layers = c["n_layers"]
    dec_layers = c["n_decoder_layers"] or c["n_layers"]
    stacks = {"decoder_only": [(enc_layers, False)], "encoder_only": [(enc_layers, False)],
              "encoder_decoder": [(enc_layers, False), (dec_layers, True)]}[c["name"]]
    out = {"embedding": v * d, "attention": 0, "ffn": 0, "norm": 0, "head": 0}
    for layers, cross in stacks:
        sublayers = 3 if cross else 2
        out["attention"] += layers * (2 if cross else 1) * attention
        out["ffn"] += layers * ffn
        out["norm"] += layers * sublayers * residual.n_norms * norm
        out["norm"] += norm * (int(has_final_norm(c)) + int(c["embed_norm"]))
        out["embedding"] += c["max_seq_len"] * d if c["position"]["name"] == "learned" else 0
    head = 0 if c["tie_embeddings"] else v * d
    if c["name"] == "encoder_only":  # MLM transform (dense + norm) and the output bias
        head += d * d + b * d + b * v
        out["norm"] += norm
    out["head"] = head
    out["total"] = sum(out.values())
    return out


def flops_per_token(model_cfg: Mapping, seq_len: int | None = None) -> dict[str, int]:
    """Matrix-multiply FLOPs per token at context `seq_len` (default max_seq_len).

    forward = 2 * (weights a token multiplies, the output head included) + 4 * layers * T * d for
    attention scores and the weighted sum (Kaplan et al. 2020; PaLM appendix B); train = 3 * forward.
    For encoder_decoder it is per target token, with a source of the same length."""
    c = resolve_config(model_cfg)
    t = seq_len or c["max_seq_len"]
    p = count_params(c)
    d, v = c["d_model"], c["vocab_size"]
    weights = p["attention"] + p["ffn"] + v * d + (d * d if c["name"] == "encoder_only" else 0)
    # attention score FLOPs: one term per self-attention layer, plus one per decoder cross-attention
    attn_layers = total_layers(c) + (c["n_decoder_layers"] or c["n_layers"]) * (c["name"] == "encoder_decoder")
    forward = 2 * weights + 4 * attn_layers * t * d
    return {"forward": forward, "train": 3 * forward}
