"""`init_from=hf:<model id or local dir>`: start a run from a Hugging Face GPT-2, BERT, Llama, BART or T5 checkpoint.

    python train.py init_from=hf:path/to/gpt2 data=text_file data.path=my.txt          # fine-tune it
    python train.py init_from=hf:path/to/gpt2 norm=pre_rms                             # ablate: swap its norm

The architecture comes from the checkpoint (zoo.convert.config_from_hf), not from the model, attention, position,
norm and ffn groups' defaults (nor from an experiment preset's). What the command line sets explicitly (Hydra's
overrides) goes on top: `model=<lineage>` must be the checkpoint's own; a group choice (`norm=pre_rms`,
`ffn=swiglu`) swaps that component, keeping the checkpoint's values of the options both components have (d_ff,
eps, ...) unless the preset or the command line sets them; `model.<key>=...` and `model.<component>.<option>=...`
set that value.

A local directory is checked whole when the run config is made, before any data (zoo.convert.check_pretrained: its
files stay inside it, config.json, safetensors headers against their files, every parameter stored with its shape),
each problem one ConfigError line.

The weights (`load_weights`): the checkpoint is converted with zoo.convert.from_pretrained, and every zoo parameter
whose name and shape match a converted one is loaded; the others (a swapped component's new weights) keep zoo's
own initialisation. The run prints one line: how many tensors were loaded, which were fresh, which pretrained
ones went unused (LayerNorm biases when swapping to RMSNorm).

Ids: the data's tokenizer is the checkpoint's (`hf:<same>`, zoo.data.tokenizers.HFTokenizer), which puts zoo's 20
special ids first (zoo id = 20 + pretrained id), so every objective works unchanged. The token embedding (and an
untied head) gets 20 rows in front: each special row is the pretrained row of the token with the same role where
the tokenizer has one (`SPECIAL_ROLES`), else the mean of the pretrained rows, which keeps those tokens'
probabilities near the average. The vocabulary covers both the tokenizer's ids and the embedding's rows.

A resumed run (`ckpt_path=last`) converts nothing: it reads the checkpoint's config.json again (the architecture must
be the one the zoo checkpoint holds) and takes every weight from the zoo checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.build import COMPONENTS, ConfigError, resolve_config
from zoo.commands import needs
from zoo.component import option_fields
from zoo.convert import ConversionError, check_pretrained, config_from_hf, first_line, from_pretrained
from zoo.data.corpus import DataError
from zoo.data.tokenizers import N_SPECIAL, SENTINEL_IDS, SPECIALS, HFTokenizer
from zoo.data.tokens import read_manifest
from zoo.net import bound_network
from zoo.registry import POSITION
from zoo.training.console import say
from zoo.training.data import DATA, TokenData

PREFIX = "hf:"
VALID = "hf:<Hugging Face model id or save_pretrained directory>, or null"

# zoo special -> where its row comes from: the first of these tokens the pretrained tokenizer (or, for
# decoder_start_token_id, the model config) has. An encoder-decoder's decoder starts from <bos> in zoo, so <bos> is
# the token the checkpoint's decoder starts from (T5: <pad>, BART: </s>); BERT's [CLS] and [SEP] open and close.
SPECIAL_ROLES: dict[str, tuple[str, ...]] = {
    "<pad>": ("pad_token",), "<bos>": ("decoder_start_token_id", "bos_token", "cls_token"),
    "<eos>": ("eos_token", "sep_token"), "<mask>": ("mask_token",),
    **{f"<extra_{i}>": (f"<extra_id_{i}>",) for i in range(16)},  # T5's sentinels
}


@dataclass
class InitFrom:
    source: str  # the model id or directory, without hf:
    vocab_size: int  # rows of the checkpoint's token embedding


def source_of(plain: dict[str, Any]) -> str | None:
    """The model id or directory `init_from` names, or None; a one-line error for anything but hf:<...>."""
    return source_in(plain.get("init_from"))


def source_in(value: Any) -> str | None:
    """source_of for init_from's value."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(PREFIX) or value == PREFIX:
        raise ConfigError(f"init_from: got {value!r}; valid: {VALID}")
    return value.removeprefix(PREFIX)


def apply(plain: dict[str, Any], overrides: list[str]) -> InitFrom | None:
    """Make the run config start from the checkpoint init_from names (a no-op without it): plain["model"] becomes
    the checkpoint's architecture with the explicit command-line `overrides` on top, and the data's tokenizer the
    checkpoint's. Reads the checkpoint's config only; every error is one line, before any data or weight."""
    source = source_of(plain)
    if source is None:
        return None
    if plain.get("budget") is not None:
        raise ConfigError(f"budget: resizes d_ff, which init_from=hf:{source} fixes; valid with init_from: null")
    base = _base_config(source)
    plain["model"] = _with_overrides(base, plain["model"], overrides, source)
    _use_tokenizer(plain["data"], source, overrides)
    _check_context(plain["model"], plain["data"], source)
    return InitFrom(source, base["vocab_size"])


def _path(source: str) -> str:
    """What transformers loads: the directory (~ expanded) or the hub id."""
    return os.path.expanduser(source)


def _base_config(source: str) -> dict[str, Any]:
    """The zoo model config of the checkpoint (config.json only)."""
    path = Path(source).expanduser()
    if source.startswith(("/", ".", "~")) and not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        raise ConfigError(f"init_from: 'hf:{source}': {what} (a save_pretrained folder or a hub id)")
    try:
        import transformers  # optional: hf
    except ImportError:
        raise ConfigError(needs("transformers", "hf", "init_from")) from None
    bound_network()  # a hub that never answers: ZOO_NET_TIMEOUT_S, not forever
    try:
        if Path(_path(source)).exists():  # a local directory: checked whole, weights too, before any data is read
            hf_config = check_pretrained(_path(source))
        else:
            hf_config = _hub_config(transformers, source)
        return resolve_config(config_from_hf(hf_config)).as_dict()  # every option spelled out, with its default
    except ConversionError as e:
        raise ConfigError(f"init_from: 'hf:{source}': {e}") from None


def _hub_config(transformers: Any, source: str) -> Any:
    try:
        return transformers.AutoConfig.from_pretrained(_path(source))
    except Exception as e:  # offline hub misses: one line, whatever was raised
        raise ConfigError(f"init_from: cannot load 'hf:{source}' ({first_line(e)})") from None


def _explicit(overrides: list[str]) -> dict[str, set[str]]:
    """The model keys the command line sets: {"groups": {"norm", ...}, "model": {"dropout", ...},
    "<component>": {its options}}; `model` in groups for model=<lineage>."""
    out: dict[str, set[str]] = {"groups": set(), "model": set(), **{k: set() for k in COMPONENTS}}
    for o in overrides:
        key = o.lstrip("+~").partition("=")[0]
        parts = key.split(".")
        if len(parts) == 1 and (key in COMPONENTS or key == "model"):
            out["groups"].add(key)
        elif parts[0] == "model" and len(parts) == 2 and parts[1] in COMPONENTS:  # model.norm={...}: a whole node
            out["groups"].add(parts[1])
        elif parts[0] == "model" and len(parts) == 2:
            out["model"].add(parts[1])
        elif parts[0] == "model" and len(parts) >= 3 and parts[1] in COMPONENTS:
            out[parts[1]].add(parts[2])
    return out


def _with_overrides(base: dict[str, Any], composed: dict[str, Any], overrides: list[str],
                    source: str) -> dict[str, Any]:
    """The checkpoint's model config with what the command line chose explicitly on top (composed: the run's
    model config as Hydra composed it, which holds the values of those choices)."""
    given = _explicit(overrides)
    if ("model" in given["groups"] or "name" in given["model"]) and composed["name"] != base["name"]:
        raise ConfigError(f"model: '{composed['name']}' but init_from=hf:{source} is a {base['name']} checkpoint; "
                          f"valid with init_from: {base['name']} (or leave model out)")
    model = dict(base)
    for key in given["model"] - set(COMPONENTS) - {"name"}:
        model[key] = composed.get(key)  # a key ModelConfig lacks is refused by resolve_config, naming it
    for kind in COMPONENTS:
        chosen = kind in given["groups"]
        model[kind] = _component(kind, base[kind], composed.get(kind) or {}, chosen or bool(given[kind]), chosen,
                                 given[kind])
    return model


def _component(kind: str, base: dict[str, Any], composed: dict[str, Any], touched: bool, chosen: bool,
               options: set[str]) -> dict[str, Any]:
    """One component's node: the checkpoint's, or, where the command line swapped it (`chosen`: <kind>=<preset>)
    or set some of its options, the composed one for those, with the checkpoint's values of the options the old
    and the new component share, where neither the preset nor the command line set them."""
    if not touched:
        return dict(base)
    registry, name_key, skip = COMPONENTS[kind]
    node = dict(composed) if chosen else {**base, **{k: composed[k] for k in options if k in composed}}
    new = option_fields(registry.options(node[name_key]))
    old = option_fields(registry.options(base[name_key]))
    for opt in (set(new) & set(old)) - options:
        f = new[opt]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if not chosen or node.get(opt) == default:  # a preset's own value (window=32) stays
            node[opt] = base[opt]
    return {k: v for k, v in node.items() if k == name_key or k in skip or k in new}


def _use_tokenizer(data: dict[str, Any], source: str, overrides: list[str]) -> None:
    """The data's tokenizer must be the checkpoint's: set it where the data has one, check a prepared corpus's."""
    ours = f"{PREFIX}{source}"
    if "tokenizer" in data:
        theirs = data["tokenizer"]
        explicit = any(o.lstrip("+~").partition("=")[0] == "data.tokenizer" for o in overrides)
        if explicit and not _same_tokenizer(theirs, ours):
            raise ConfigError(f"data.tokenizer: '{theirs}' but init_from={ours} reads the ids of its own tokenizer; "
                              f"valid with init_from: {ours} (the default)")
        data["tokenizer"] = ours
        return
    if data.get("kind") in DATA and issubclass(DATA.get(data["kind"]), TokenData):  # a prepared corpus
        if not isinstance(data.get("path"), str):
            return  # the data module names the missing path
        theirs = read_manifest(data["path"])["tokenizer"]
        try:
            mine = HFTokenizer(source).state_dict()
        except DataError as e:
            raise ConfigError(f"init_from: {e}") from None
        if any(theirs.get(k) != mine.get(k) for k in ("name", "tokenizer_json", "eot")):
            raise ConfigError(f"data.path: '{data['path']}' was prepared with another tokenizer than init_from's; "
                              f"prepare it with --tokenizer {ours}")
        return
    raise ConfigError(f"data.kind: '{data.get('kind')}' has a tokenizer of its own; init_from={ours} needs text "
                      f"data (data=shakespeare, text_file or hf: their tokenizer becomes {ours}) or a corpus "
                      f"prepared with --tokenizer {ours} (data=tokens)")


def _same_tokenizer(a: Any, b: str) -> bool:
    if a == b:
        return True
    if not isinstance(a, str) or not a.startswith(PREFIX):
        return False
    x, y = (Path(s.removeprefix(PREFIX)).expanduser() for s in (a, b))
    return x.is_dir() and y.is_dir() and x.resolve() == y.resolve()


def _check_context(model: dict[str, Any], data: dict[str, Any], source: str) -> None:
    """The data's windows must fit the checkpoint's learned positions (a converted model cannot grow them)."""
    if not POSITION.get(model["position"]["name"]).hard_limit:
        return
    limit = model["max_seq_len"]
    if limit is None:  # model.max_seq_len=null on the command line: sized to the data, as without init_from
        return
    for key in ("context", "long_context"):
        n = data.get(key)
        if isinstance(n, int) and n > limit:
            raise ConfigError(f"data.{key}: {n} is past the learned positions of init_from=hf:{source} "
                              f"(max_seq_len={limit}); valid: 1..{limit}")


def vocab_size(init: InitFrom, tokenizer_vocab: int) -> int:
    """The run's vocabulary: the tokenizer's ids and the checkpoint's rows, both after zoo's specials."""
    return max(tokenizer_vocab, N_SPECIAL + init.vocab_size)


# ------------------------------------------------------------------------------------------------ weights


def special_rows(source: str) -> dict[int, tuple[int, str]]:
    """zoo special id -> (pretrained id, its token) whose row it starts from (SPECIAL_ROLES); the specials left out
    take the mean row."""
    import transformers  # optional: hf (init_from=hf: checked it is installed before the run)

    try:
        tok = transformers.AutoTokenizer.from_pretrained(_path(source))
        config = transformers.AutoConfig.from_pretrained(_path(source))
    except Exception as e:  # a damaged tokenizer file: one line, whatever the library raised
        raise ConfigError(f"init_from: 'hf:{source}': cannot load its tokenizer ({first_line(e)})") from None
    vocab = tok.get_vocab()
    out: dict[int, tuple[int, str]] = {}
    for zoo_id, special in enumerate(SPECIALS):
        for role in SPECIAL_ROLES[special]:
            if role == "decoder_start_token_id":
                pid = getattr(config, role, None) if getattr(config, "is_encoder_decoder", False) else None
            elif re.fullmatch(r"<extra_id_\d+>", role):
                pid = vocab.get(role)
            else:
                token = getattr(tok, role, None)
                pid = vocab.get(str(token)) if token is not None else None
            if isinstance(pid, int):
                out[zoo_id] = (pid, tok.convert_ids_to_tokens(pid))
                break
    return out


def _token_tensors(model: nn.Module) -> set[int]:
    """ids of the parameters with one row per token: the token embedding, the output head's weight and bias
    (modules outside every component whose size is the vocabulary)."""
    inside = {id(m) for c in model.modules() if hasattr(c, "count_as") for m in c.modules()}
    vocab, out = model.cfg.vocab_size, set()
    for m in model.modules():
        if id(m) in inside:
            continue
        if isinstance(m, nn.Embedding) and m.num_embeddings == vocab:
            out.add(id(m.weight))
        elif isinstance(m, nn.Linear) and m.out_features == vocab:
            out |= {id(p) for p in (m.weight, m.bias) if p is not None}
    return out


def _shift(t: torch.Tensor, rows: int, specials: dict[int, tuple[int, str]]) -> torch.Tensor:
    """A per-token tensor in pretrained ids -> `rows` rows in zoo ids: the specials first, then the pretrained rows,
    then mean rows for ids only the tokenizer has."""
    mean = t.float().mean(0).to(t.dtype)
    out = mean.expand(rows, *t.shape[1:]).clone()
    for zoo_id, (pid, _) in specials.items():
        if pid < t.shape[0]:
            out[zoo_id] = t[pid]
    n = min(t.shape[0], rows - N_SPECIAL)
    out[N_SPECIAL:N_SPECIAL + n] = t[:n]
    return out


def _grouped(names: list[str]) -> str:
    """decoder.blocks.0.attn.norm.bias, decoder.blocks.1.attn.norm.bias -> decoder.blocks.*.attn.norm.bias (x2)."""
    counts: dict[str, int] = {}
    for n in names:
        key = re.sub(r"\.\d+\.", ".*.", n)
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(k + (f" (x{c})" if c > 1 else "") for k, c in counts.items()) or "none"


@torch.no_grad()  # type: ignore[untyped-decorator]  # torch is read untyped (pyproject.toml)
def load_weights(model: nn.Module, source: str) -> str:
    """Copy the converted checkpoint into `model` (built and initialised by zoo) where names and shapes match.
    Returns the one-line report: loaded, fresh (zoo's init kept), unused pretrained tensors."""
    try:
        converted = from_pretrained(_path(source))
    except ConversionError as e:  # the directory changed since apply() checked it
        raise ConfigError(f"init_from: 'hf:{source}': {e}") from None
    specials = special_rows(source)
    theirs_token = _token_tensors(converted)
    theirs = dict(converted.named_parameters(remove_duplicate=False))  # a tied head by its own name too
    used: set[int] = set()
    loaded, fresh = 0, []
    for name, p in model.named_parameters():
        src = theirs.get(name)
        if src is not None and id(src) in theirs_token:
            value = _shift(src, p.shape[0], specials)
        else:
            value = src
        if value is None or value.shape != p.shape:
            fresh.append(name)
            continue
        p.copy_(value)
        used.add(id(src))
        loaded += 1
    unused = [n for n, t in converted.named_parameters() if id(t) not in used]
    named = sorted(z for z in specials if z not in SENTINEL_IDS)
    sentinels = [specials[z][1] for z in sorted(specials) if z in SENTINEL_IDS]  # T5's: one entry for all 16
    roles = ", ".join([f"{SPECIALS[z]} = {specials[z][1]}" for z in named] +
                      ([f"{len(sentinels)} sentinels = {sentinels[0]}..{sentinels[-1]}"] if sentinels else []))
    return (f"init_from hf:{source}: loaded {loaded} of {loaded + len(fresh)} tensors; fresh (zoo init): "
            f"{_grouped(fresh)}; unused pretrained: {_grouped(unused)}; token ids +{N_SPECIAL}, special rows from "
            f"{roles or 'no token'} ({N_SPECIAL - len(specials)} the mean row)")


def init_weights(model: nn.Module, init_from: str | None) -> None:
    """The run's weights from init_from (a fresh run only: a resume takes its checkpoint's); says what it loaded."""
    source = source_in(init_from)
    if source is None:
        return
    say(load_weights(model, source))
