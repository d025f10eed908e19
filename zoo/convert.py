"""Hugging Face -> zoo: load GPT-2, BERT, Llama, BART and T5 weights into zoo models, with exact parity.

    from transformers import GPT2LMHeadModel
    model = zoo.convert.convert(GPT2LMHeadModel.from_pretrained("gpt2"))   # or from_pretrained("gpt2")

API
- `config_from_hf(hf_config) -> dict`: a zoo model config (dispatch on `model_type`); per model:
  `gpt2_config_from_hf`, `bert_config_from_hf`, `llama_config_from_hf`, `bart_config_from_hf`,
  `t5_config_from_hf`.
- `from_hf(hf_model)` / `convert(hf_model)`: a zoo model with the HF weights (dispatch on the class
  name); per model: `gpt2_from_hf` (GPT2LMHeadModel), `bert_from_hf` (BertForMaskedLM),
  `llama_from_hf` (LlamaForCausalLM), `bart_from_hf` (BartForConditionalGeneration),
  `t5_from_hf` (T5ForConditionalGeneration: the original T5 and T5 v1.1).
- `from_pretrained(name_or_path, **kw)`: a local directory of safetensors is checked, then read directly
  (below); a hub name or extra `kw` goes through transformers (safetensors only), then `convert`.
- `check_pretrained(directory)`: every check from_pretrained makes on a local directory, reading no weight.

Trust: a local directory is checked before any weight is read, each problem one `ConversionError` line:
no entry may be a symbolic link out of it (`check_directory`; a Hugging Face cache snapshot may link into
its repository folder), a file read by name must be a regular file, config.json valid JSON naming a supported
model_type, a shard index may name only files inside the directory, and the weights must be safetensors:
pickled weights (`pytorch_model.bin`) are refused and never unpickled. The safetensors library validates each
file's header against the file before anything is allocated (so a truncated file, or a header claiming 4 TiB,
is an error, not an allocation), and every parameter the config implies must be stored with its shape. The
format has no checksum: changed data bytes are read as they are, except that NaN or infinity in a float
tensor is refused.

Every zoo parameter must be written exactly once and every HF parameter read (or explicitly set
aside, see below), so a missed weight is an error, never a silent random init. A config the zoo
cannot express raises `ConversionError` (a ValueError) naming the key.

Mapping notes
- GPT-2's Conv1D stores weights as (in, out): transposed into torch Linear's (out, in).
- Self-attention q, k, v projections are concatenated into zoo's fused `qkv` ([q; k; v] rows);
  cross-attention k, v into `kv`. RoPE in zoo is the half-split (rotate_half) layout of HF Llama,
  so Llama's q/k rows need no permutation.
- BERT: zoo has no token-type embeddings. Row 0 of `token_type_embeddings` is folded into the
  learned position table, so the zoo model equals BERT called with token_type_ids = 0 (the
  default); the other rows are dropped. The MLM head (dense -> exact GELU -> LayerNorm -> decoder
  with a bias) maps onto encoder_only's head_dense / head_norm / head. Padding: pass the HF
  attention_mask as `padding=attention_mask.bool()`.
- BART: the learned position tables have 2 extra leading rows (HF's offset of 2), dropped here.
  `final_logits_bias` must be zero (zoo's head has no bias). Encoder and decoder must share the
  token embedding (they do whenever tie_word_embeddings is set).
- T5: attention scores are not scaled by 1/sqrt(head_dim) in T5, so the query rows are multiplied by
  sqrt(d_kv) here; the relative bias tables (in HF, layer 0's self-attention of each stack) become the
  two stacks' `position=t5` tables; T5LayerNorm is RMSNorm. The original T5 multiplies the decoder
  output by d_model**-0.5 before its tied head (`scale_decoder_outputs`, or `tie_word_embeddings` in
  older transformers): folded into the decoder's final norm gain. v1.1's gated-gelu is `geglu_tanh`.
  `d_kv * num_heads` must equal d_model (zoo's head size is d_model / n_heads).
- Memory and precision: the zoo model is built with its parameters on the meta device (no memory,
  no random init), and the source tensors are assigned in their own dtype and device: a bf16 or
  float64 checkpoint is never staged through float32. `convert(hf_model)` needs the HF model plus one
  copy. `from_pretrained(directory)` on `model.safetensors` (or shards with
  `model.safetensors.index.json`) never makes the HF model: it builds its skeleton with parameters on
  meta (its own init is then a no-op; persistent buffers such as BART's final_logits_bias are read
  from the file), and each tensor is read when the converter takes it (by parameter name, or without
  the `base_model_prefix`; tied parameters by any of their names), by the safetensors library with plain
  reads (its pread backend: no mmap, so nothing of the file stays mapped and a file changed afterwards
  cannot touch the model) into a new tensor of the file's dtype. The parts of a fused
  projection (q, k, v) are copied into their rows of one tensor as each is read (one part alive at a
  time); a tensor read whole becomes the zoo parameter as it is (no second copy); nothing read is kept
  after it is written. Peak memory is the weights once (`python -m zoo.bench --only convert` measures
  the peak RSS and the peak of allocations alone against transformers' path). A tensor missing from the files is
  an error naming it (transformers would initialise it randomly). Ties follow the checkpoint, as in
  transformers: two tied names stored with different values are untied.
- Dropout: zoo has one rate for every site; it is set from the model's main (residual) dropout.
  This only matters for training; in eval mode the outputs match exactly.
- `transformers` is imported lazily (it is the optional `hf` extra): `import zoo.convert` works
  without it, and only `from_pretrained` needs it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn

from zoo.build import resolve_config
from zoo.io import (
    FileFormatError,
    first_line,  # noqa: F401 (zoo.eval and init_from import it from here)
    parse_json,
)
from zoo.registry import MODEL

__all__ = [
    "ConversionError", "config_from_hf", "from_hf", "convert", "from_pretrained", "check_pretrained", "check_directory",
    "gpt2_config_from_hf", "gpt2_from_hf", "bert_config_from_hf", "bert_from_hf",
    "llama_config_from_hf", "llama_from_hf", "bart_config_from_hf", "bart_from_hf", "t5_config_from_hf", "t5_from_hf",
]


class ConversionError(ValueError):
    """An HF config or checkpoint that the zoo cannot represent exactly."""


def _need(ok: bool, model: str, msg: str) -> None:
    if not ok:
        raise ConversionError(f"cannot convert {model}: {msg}")


# HF activation name -> zoo FFN name, for plain MLPs and for gated (GLU) FFNs.
_MLP_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh",
                    "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "relu": "relu"}
_GLU_ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_python": "geglu",
                    "gelu_new": "geglu_tanh", "gelu_pytorch_tanh": "geglu_tanh", "gelu_fast": "geglu_tanh",
                    "relu": "reglu"}


def _activation(model: str, key: str, act: Any, table: dict[str, str]) -> str:
    _need(isinstance(act, str) and act in table, model,
          f"unsupported activation {key}={act!r}; supported: {', '.join(sorted(table))}")
    return table[act]


def _attention(n_heads: int, n_kv_heads: int) -> dict:
    if n_kv_heads == n_heads:
        return {"name": "mha"}
    if n_kv_heads == 1:
        return {"name": "mqa"}
    return {"name": "gqa", "n_kv_heads": n_kv_heads}


# ---------------------------------------------------------------------------------------- configs


def gpt2_config_from_hf(config: Any) -> dict:
    """GPT2Config -> decoder_only: learned positions, pre-LayerNorm, GELU(tanh) MLP, biases."""
    m = "GPT-2"
    _need(not getattr(config, "add_cross_attention", False), m, "add_cross_attention=True is not supported")
    _need(getattr(config, "scale_attn_weights", True), m,
          "scale_attn_weights=False (unscaled attention scores) is not supported")
    _need(not getattr(config, "scale_attn_by_inverse_layer_idx", False), m,
          "scale_attn_by_inverse_layer_idx=True is not supported")
    d = config.n_embd
    return {
        "name": "decoder_only", "vocab_size": config.vocab_size, "d_model": d,
        "n_layers": config.n_layer, "n_heads": config.n_head, "max_seq_len": config.n_positions,
        "dropout": float(config.resid_pdrop), "bias": True,
        "tie_embeddings": bool(config.tie_word_embeddings), "scale_embeddings": False, "embed_norm": False,
        "init_std": config.initializer_range,
        "attention": {"name": "mha"}, "position": {"name": "learned"},
        "norm": {"placement": "pre", "type": "layernorm", "eps": config.layer_norm_epsilon},
        "ffn": {"name": _activation(m, "activation_function", config.activation_function, _MLP_ACTIVATIONS),
                "d_ff": config.n_inner or 4 * d},
    }


def bert_config_from_hf(config: Any) -> dict:
    """BertConfig -> encoder_only: post-LayerNorm, embedding LayerNorm, learned positions, GELU."""
    m = "BERT"
    _need(not getattr(config, "is_decoder", False), m, "is_decoder=True (causal BERT) is not supported")
    _need(not getattr(config, "add_cross_attention", False), m, "add_cross_attention=True is not supported")
    pos = getattr(config, "position_embedding_type", "absolute") or "absolute"
    _need(pos == "absolute", m, f"position_embedding_type={pos!r} is not supported; only 'absolute'")
    # The zoo MLM head uses exact GELU, and BERT's head uses hidden_act too: only exact GELU maps.
    act = config.hidden_act
    _need(isinstance(act, str) and _MLP_ACTIVATIONS.get(act) == "gelu", m,
          f"unsupported activation hidden_act={act!r}; the zoo MLM head needs exact GELU ('gelu')")
    return {
        "name": "encoder_only", "vocab_size": config.vocab_size, "d_model": config.hidden_size,
        "n_layers": config.num_hidden_layers, "n_heads": config.num_attention_heads,
        "max_seq_len": config.max_position_embeddings, "dropout": float(config.hidden_dropout_prob),
        "bias": True, "tie_embeddings": bool(getattr(config, "tie_word_embeddings", True)),
        "scale_embeddings": False, "embed_norm": True, "init_std": config.initializer_range,
        "attention": {"name": "mha"}, "position": {"name": "learned"},
        "norm": {"placement": "post", "type": "layernorm", "eps": config.layer_norm_eps},
        "ffn": {"name": "gelu", "d_ff": config.intermediate_size},
    }


def _rope_theta(config: Any, m: str) -> float:
    """rope_theta from `rope_parameters` (transformers 5) or the older flat attributes."""
    params = getattr(config, "rope_parameters", None) or {}
    _need(isinstance(params, dict) and (not params or "rope_theta" in params or "rope_type" in params), m,
          f"unsupported rope_parameters={params!r} (per-layer-type RoPE)")
    rope_type = params.get("rope_type", params.get("type", "default"))
    _need(rope_type == "default", m, f"RoPE scaling is not supported: rope_type={rope_type!r} "
          "(zoo implements plain RoPE only)")
    scaling = getattr(config, "rope_scaling", None)
    _need(not scaling or scaling.get("rope_type", scaling.get("type", "default")) == "default", m,
          f"RoPE scaling is not supported: rope_scaling={scaling!r}")
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    _need(partial in (None, 1, 1.0), m, f"partial_rotary_factor={partial} is not supported (zoo rotates full heads)")
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def llama_config_from_hf(config: Any) -> dict:
    """LlamaConfig -> decoder_only: RoPE, pre-RMSNorm, SwiGLU, no biases, GQA."""
    m = "Llama"
    d, h = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // h
    _need(head_dim * h == d, m, f"head_dim={head_dim} != hidden_size / num_attention_heads = {d}/{h}")
    attn_bias, mlp_bias = bool(getattr(config, "attention_bias", False)), bool(getattr(config, "mlp_bias", False))
    _need(attn_bias == mlp_bias, m, f"attention_bias={attn_bias} with mlp_bias={mlp_bias}: zoo has one bias switch")
    kv = getattr(config, "num_key_value_heads", None) or h
    return {
        "name": "decoder_only", "vocab_size": config.vocab_size, "d_model": d,
        "n_layers": config.num_hidden_layers, "n_heads": h, "max_seq_len": config.max_position_embeddings,
        "dropout": float(getattr(config, "attention_dropout", 0.0) or 0.0), "bias": attn_bias,
        "tie_embeddings": bool(config.tie_word_embeddings), "scale_embeddings": False, "embed_norm": False,
        "init_std": config.initializer_range,
        "attention": _attention(h, kv), "position": {"name": "rope", "theta": _rope_theta(config, m)},
        "norm": {"placement": "pre", "type": "rmsnorm", "eps": config.rms_norm_eps},
        "ffn": {"name": _activation(m, "hidden_act", config.hidden_act, _GLU_ACTIVATIONS),
                "d_ff": config.intermediate_size},
    }


def bart_config_from_hf(config: Any) -> dict:
    """BartConfig -> encoder_decoder: post-LayerNorm, embedding LayerNorm, learned positions, GELU."""
    m = "BART"
    enc_h, dec_h = config.encoder_attention_heads, config.decoder_attention_heads
    _need(enc_h == dec_h, m, f"encoder_attention_heads={enc_h} != decoder_attention_heads={dec_h}; "
          "zoo uses one head count for both stacks")
    enc_ff, dec_ff = config.encoder_ffn_dim, config.decoder_ffn_dim
    _need(enc_ff == dec_ff, m, f"encoder_ffn_dim={enc_ff} != decoder_ffn_dim={dec_ff}; "
          "zoo uses one FFN size for both stacks")
    _need(not getattr(config, "normalize_before", False), m, "normalize_before=True (pre-norm BART) is not supported")
    _need(not getattr(config, "add_final_layer_norm", False), m, "add_final_layer_norm=True is not supported")
    return {
        "name": "encoder_decoder", "vocab_size": config.vocab_size, "d_model": config.d_model,
        "n_layers": config.encoder_layers, "n_decoder_layers": config.decoder_layers, "n_heads": enc_h,
        "max_seq_len": config.max_position_embeddings, "dropout": float(config.dropout), "bias": True,
        "tie_embeddings": bool(config.tie_word_embeddings), "scale_embeddings": bool(config.scale_embedding),
        "embed_norm": True, "init_std": config.init_std,
        "attention": {"name": "mha"}, "position": {"name": "learned"},
        "norm": {"placement": "post", "type": "layernorm", "eps": 1e-5},  # BART's nn.LayerNorm default
        "ffn": {"name": _activation(m, "activation_function", config.activation_function, _MLP_ACTIVATIONS),
                "d_ff": enc_ff},
    }


def t5_config_from_hf(config: Any) -> dict:
    """T5Config -> encoder_decoder: relative position bias, pre-RMSNorm, ReLU (T5) or gated GELU (v1.1), no biases."""
    m = "T5"
    d, h = config.d_model, config.num_heads
    _need(config.d_kv * h == d, m, f"d_kv * num_heads = {config.d_kv} * {h} != d_model={d}; "
          "zoo's head size is d_model / n_heads")
    gated = bool(getattr(config, "is_gated_act", False))
    act = getattr(config, "dense_act_fn", config.feed_forward_proj)
    ffn = _activation(m, "feed_forward_proj", act, _GLU_ACTIVATIONS if gated else _MLP_ACTIVATIONS)
    # The original T5 ties its head and scales the decoder output; v1.1 does neither. transformers 5 keeps
    # that in scale_decoder_outputs (and ties the head in memory regardless); older ones in tie_word_embeddings.
    original = bool(getattr(config, "scale_decoder_outputs", config.tie_word_embeddings))
    return {
        "name": "encoder_decoder", "vocab_size": config.vocab_size, "d_model": d,
        "n_layers": config.num_layers, "n_decoder_layers": config.num_decoder_layers or config.num_layers,
        "n_heads": h, "max_seq_len": getattr(config, "n_positions", None) or 512,  # no limit: T5's training length
        "dropout": float(config.dropout_rate), "bias": False,
        "tie_embeddings": original,  # t5_from_hf decides from the weights themselves
        "scale_embeddings": False, "embed_norm": False,
        "attention": {"name": "mha"},
        "position": {"name": "t5", "num_buckets": config.relative_attention_num_buckets,
                     "max_distance": config.relative_attention_max_distance},
        "norm": {"placement": "pre", "type": "rmsnorm", "eps": config.layer_norm_epsilon},
        "final_norm": True, "ffn": {"name": ffn, "d_ff": config.d_ff},
    }


_CONFIGS: dict[str, Callable[[Any], dict]] = {
    "gpt2": gpt2_config_from_hf, "bert": bert_config_from_hf,
    "llama": llama_config_from_hf, "bart": bart_config_from_hf, "t5": t5_config_from_hf,
}


def config_from_hf(hf_config: Any) -> dict:
    """A zoo model config dict from a transformers config (GPT-2, BERT, Llama, BART or T5)."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in _CONFIGS:
        raise ConversionError(f"cannot convert model_type={model_type!r}; supported: {', '.join(_CONFIGS)}")
    return _CONFIGS[model_type](hf_config)


# ----------------------------------------------------------------------------- a pretrained directory

# A pretrained directory, as save_pretrained writes it.
CONFIG, INDEX, SINGLE = "config.json", "model.safetensors.index.json", "model.safetensors"
# Every file a Hugging Face loader reads by name (config, weights, shard index, tokenizer, generation config) ends
# in one of these: such an entry must be a regular file, never a directory, FIFO (a read would wait forever) or device.
READ_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".jinja")
# Pickled weights: loading them can run code, so zoo never does; safetensors holds only tensors.
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.ckpt.index", "tf_model.h5",
           "flax_model.msgpack")
MAX_JSON_BYTES = 64 << 20  # a config or shard index is kilobytes: a larger file is not what its name says


def _fail(path: Path | str, problem: str) -> NoReturn:
    raise ConversionError(f"{path}: {problem}")


def _root(directory: Path) -> Path:
    """Where the files of a pretrained directory may lead: inside it, or, for a snapshot in Hugging Face's cache
    (<repo>/snapshots/<revision>/, whose files are links to <repo>/blobs/), inside its repository folder."""
    real = directory.resolve()
    return real.parent.parent if real.parent.name == "snapshots" else real


def check_directory(directory: Path) -> None:
    """A pretrained directory's entries stay inside it: a symbolic link out of it is refused (never followed),
    and each file a loader reads by name (READ_SUFFIXES) is a regular file. One ConversionError line each."""
    if not directory.is_dir():
        _fail(directory, "no such directory (a save_pretrained folder)" if not directory.exists() else
              "not a directory (hf:<dir> names a save_pretrained folder)")
    root = _root(directory)
    try:
        entries = sorted(directory.iterdir())
    except OSError as e:
        _fail(directory, f"cannot list it ({e.strerror or e})")
    for entry in entries:
        if entry.is_symlink():
            try:
                target = entry.resolve(strict=False)
            except (OSError, RuntimeError):  # a loop of links
                _fail(entry, "a symbolic link that does not resolve")
            if not target.is_relative_to(root):
                _fail(entry, f"a symbolic link to {target}, outside {root}; zoo reads no file outside a pretrained "
                      "directory: copy the file in, or link the whole directory instead")
        if entry.name.endswith(READ_SUFFIXES) and entry.exists() and not entry.is_file():
            _fail(entry, "not a regular file (a directory, FIFO or device where a file belongs)")


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        _fail(path.parent, f"no {path.name} ({what})")
    try:
        size = path.stat().st_size
        raw = path.read_bytes() if size <= MAX_JSON_BYTES else None
    except OSError as e:
        _fail(path, f"cannot read it ({e.strerror or e})")
    if raw is None:
        _fail(path, f"{size} bytes, too large for {what}")
    try:
        return parse_json(raw.decode("utf-8"), str(path))
    except UnicodeDecodeError as e:
        _fail(path, f"is not JSON ({first_line(e)})")
    except FileFormatError as e:  # not JSON, nested too deep, a number out of range
        _fail(path, first_line(e).removeprefix(f"'{path}'").lstrip(": "))


def _weight_files(directory: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files of a checked directory (model.safetensors, or the shards its index names, each a file
    name inside the directory) and the index's map from tensor names to shards (None without an index)."""
    index = directory / INDEX
    if not index.exists():
        if (directory / SINGLE).is_file():
            return [directory / SINGLE], None
        pickle = next((n for n in PICKLES if (directory / n).exists()), None)
        if pickle is not None:
            _fail(directory, f"has {pickle} but no {SINGLE}: zoo never loads pickled weights (unpickling can run "
                  "code); convert them to safetensors where you trust the file: transformers' "
                  "from_pretrained(dir), then save_pretrained(dir, safe_serialization=True)")
        _fail(directory, f"no {SINGLE} or {INDEX} (the weights of a save_pretrained folder)")
    raw = _read_json(index, "the shard index")
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        _fail(index, "no weight_map from tensor names to shard file names")
    shards = sorted(set(weight_map.values()))
    for name in shards:
        if name in ("", ".", "..") or "/" in name or "\\" in name:
            _fail(index, f"names shard {name!r}, which is not a file name inside the directory")
        if not (directory / name).is_file():
            _fail(index, f"names shard {name!r}, which is missing or not a regular file")
    return [directory / name for name in shards], weight_map


class _Safetensors:
    """The tensors of a pretrained directory's safetensors file(s) (one, or the shards listed in
    `model.safetensors.index.json`), read with the safetensors library.

    Opening a file validates its header against the file before anything is allocated (the header's size, its
    JSON, each tensor's dtype, and byte ranges that match its shape, lie inside the file and cover it without
    gaps or overlaps), so a truncated file, flipped header bytes or a header claiming terabytes is one line.
    Each tensor is then read when asked, with plain reads (the library's pread backend, not mmap: nothing of the
    file stays mapped, and a file changed after loading cannot change or crash the model) into a fresh tensor of
    the file's dtype. The format holds no checksum: changed data bytes are read as they are, except that a
    float tensor holding NaN or infinity is refused (no trained checkpoint holds one)."""

    DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
    FINITE = (torch.float64, torch.float32, torch.float16, torch.bfloat16)  # checked for NaN and infinity

    def __init__(self, directory: Path):
        from safetensors import safe_open

        self.directory = directory
        files, index = _weight_files(directory)
        self.handles: list[Any] = []
        # name -> (file, its open handle, dtype, shape)
        self.entries: dict[str, tuple[Path, Any, torch.dtype, tuple[int, ...]]] = {}
        try:
            for path in files:
                try:
                    handle = safe_open(path, framework="pt", backend="pread")
                except TypeError:  # no `backend` argument: the library predates 0.8
                    raise ConversionError("zoo.convert needs safetensors >= 0.8 (its pread backend): "
                                          "pip install -U 'safetensors>=0.8'") from None
                except Exception as e:  # SafetensorError (not an OSError): the header does not fit the file
                    _fail(path, f"not a valid safetensors file ({first_line(e)})")
                self.handles.append(handle)
                for name in handle.keys():
                    info = handle.get_slice(name)
                    if info.get_dtype() not in self.DTYPES:
                        _fail(path, f"tensor {name!r} has dtype {info.get_dtype()}; supported: "
                              f"{', '.join(self.DTYPES)}")
                    if name in self.entries:
                        _fail(path, f"tensor {name!r} is also in {self.entries[name][0].name}")
                    self.entries[name] = (path, handle, self.DTYPES[info.get_dtype()], tuple(info.get_shape()))
            for name, shard in (index or {}).items():
                if name not in self.entries or self.entries[name][0].name != shard:
                    _fail(directory / INDEX, f"names tensor {name!r} in {shard}, which does not hold it")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for handle in self.handles:
            handle.__exit__(None, None, None)
        self.handles.clear()

    def __enter__(self) -> _Safetensors:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def dtype(self, name: str) -> torch.dtype:
        return self.entries[name][2]

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """A new tensor holding `name`, or `out` (of its shape and dtype) filled with it."""
        path, handle, dtype, shape = self.entries[name]
        if out is not None and (tuple(out.shape) != shape or out.dtype != dtype):
            raise RuntimeError(f"conversion bug: reading {name} {list(shape)} {dtype} into {list(out.shape)} "
                               f"{out.dtype}")
        try:
            t = handle.get_tensor(name)
        except Exception as e:  # SafetensorError: the file changed after it was opened and checked
            _fail(path, f"cannot read tensor {name!r} ({first_line(e)})")
        if t.dtype in self.FINITE and t.numel() and not all(math.isfinite(v) for v in torch.aminmax(t)):
            _fail(path, f"tensor {name!r} holds NaN or infinite values: the file is damaged")
        if out is None:
            return t
        out.copy_(t)
        return out

    def check(self, hf_model: nn.Module) -> None:
        """Every parameter of a skeleton (parameters on meta) is in the files, with its shape: checked before any
        tensor is read, so that a file that does not fit config.json costs nothing."""
        prefix = hf_model.base_model_prefix + "."
        groups: dict[int, tuple[nn.Parameter, list[str]]] = {}
        for name, p in hf_model.named_parameters(remove_duplicate=False):  # tied parameters have several names
            groups.setdefault(id(p), (p, []))[1].append(name)
        for p, names in groups.values():
            if self.key(names, prefix) is None:
                _fail(self.directory, f"tensor {names[0]!r} is not in its safetensors file(s)")
            for key in filter(None, (self.key([n], prefix) for n in names)):
                path, _, _, shape = self.entries[key]
                if shape != tuple(p.shape):
                    _fail(path, f"tensor {key!r} has shape {list(shape)}; {CONFIG} makes it {list(p.shape)}")

    def key(self, names: list[str], prefix: str) -> str | None:
        """The file's name for a parameter known by `names` (tied parameters have several): the name
        itself, or without the model's base prefix (a checkpoint of the base model)."""
        for n in names:
            for k in (n, n.removeprefix(prefix)):
                if k in self.entries:
                    return k
        return None

    def prepare(self, hf_model: nn.Module) -> None:
        """Make a skeleton (parameters on meta) match the file: the persistent buffers found in it (BART's
        final_logits_bias) are read, and a parameter tied by the config whose names the file stores with
        different values is untied, as transformers does (the checkpoint, not the config, decides)."""
        prefix = hf_model.base_model_prefix + "."
        persistent = set(hf_model.state_dict(keep_vars=True))
        for name, _ in list(hf_model.named_buffers()):
            key = self.key([name], prefix)
            if name in persistent and key is not None:
                module, _, leaf = name.rpartition(".")
                hf_model.get_submodule(module)._buffers[leaf] = self.read(key)
        tied: dict[int, list[tuple[str, nn.Parameter]]] = {}
        for name, p in hf_model.named_parameters(remove_duplicate=False):
            tied.setdefault(id(p), []).append((name, p))
        for named in tied.values():
            stored = [(name, p) for name, p in named if name in self.entries]
            if len(stored) < 2:
                continue
            first = self.read(stored[0][0])
            for name, p in stored[1:]:
                if not torch.equal(first, self.read(name)):
                    module, _, leaf = name.rpartition(".")
                    setattr(hf_model.get_submodule(module), leaf,
                            nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad))


# ---------------------------------------------------------------------------------- weight copying


class _Copier:
    """Copies tensors into a zoo model and keeps the books on both sides.

    Each zoo parameter must be written exactly once; each HF parameter must be read (`take`) or
    explicitly set aside (`drop`). `finish` raises if either side has leftovers. Writes are kept
    and assigned as the zoo model's parameters by `assign` (the zoo model is built on the meta device).

    An HF parameter on the meta device (a skeleton built by `from_pretrained`) is read from `files`
    when taken, in the file's dtype; the copier keeps no taken tensor, only the written values."""

    def __init__(self, hf_model: nn.Module | None = None, files: _Safetensors | None = None):
        self.files = files
        self.zoo_names: dict[int, str] = {}
        self.written: set[int] = set()
        self.values: dict[int, torch.Tensor] = {}
        self.hf_names: dict[int, list[str]] = {}  # every name of a tied parameter
        self.hf_storage: set[int] = set()
        self.prefix = ""
        self.first: torch.Tensor | None = None  # the HF model's first parameter: it sets the zoo model's dtype
        if hf_model is not None:
            self.prefix = getattr(hf_model, "base_model_prefix", "") + "."
            for n, p in hf_model.named_parameters(remove_duplicate=False):
                self.hf_names.setdefault(id(p), []).append(n)
                if p.device.type != "meta":
                    self.hf_storage.add(p.untyped_storage().data_ptr())
                self.first = p if self.first is None else self.first
        self.read: set[int] = set()

    def build(self, cfg: dict) -> nn.Module:
        """The zoo model of `cfg`, its parameters on the meta device: the values come from `write`."""
        spec = resolve_config(cfg)
        with _parameters_on_meta():
            model = MODEL.get(spec.name)(spec)
        self.zoo_names = {id(p): n for n, p in model.named_parameters()}
        return model

    # HF side
    def _key(self, p: torch.Tensor) -> str:
        names = self.hf_names.get(id(p), ["?"])
        if self.files is None:
            raise RuntimeError(f"conversion bug: HF parameter {names[0]} is on the meta device and there is no file")
        key = self.files.key(names, self.prefix)
        _need(key is not None, str(self.files.directory),
              f"tensor {names[0]!r} is not in its safetensors file(s)")
        return key

    def peek(self, p: torch.Tensor) -> torch.Tensor:
        """An HF parameter's value without marking it read (a meta one is read from the file, fresh)."""
        return self.files.read(self._key(p)) if p.device.type == "meta" else p.detach()

    def take(self, p: torch.Tensor) -> torch.Tensor:
        self.read.add(id(p))
        return self.peek(p)

    def take_rows(self, ps: list[torch.Tensor]) -> torch.Tensor:
        """The row-wise concatenation of HF parameters (a fused projection's parts). Parts in the file are
        copied into their rows of one new tensor as each is read, so only one part is alive at a time
        (torch.cat would hold them all next to the result). One part is taken as it is (no copy)."""
        if len(ps) == 1:
            return self.take(ps[0])
        if self.files is None or any(p.device.type != "meta" for p in ps):
            return torch.cat([self.take(p) for p in ps], dim=0)
        keys = [self._key(p) for p in ps]
        parts = [self.files.entries[k] for k in keys]  # (file, handle, dtype, shape)
        if len({(e[2], e[3][1:]) for e in parts}) > 1:  # mixed dtypes or widths: torch.cat's rules apply
            return torch.cat([self.take(p) for p in ps], dim=0)
        out = torch.empty((sum(e[3][0] for e in parts), *parts[0][3][1:]), dtype=parts[0][2])
        row = 0
        for p, key, e in zip(ps, keys, parts, strict=True):
            self.read.add(id(p))
            self.files.read(key, out=out[row:row + e[3][0]])
            row += e[3][0]
        return out

    def same(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """Whether two HF parameters hold equal values (tied ones are the same tensor)."""
        return a is b or torch.equal(self.peek(a), self.peek(b))

    def drop(self, p: torch.Tensor | None) -> None:
        """An HF parameter deliberately not used (e.g. BERT's token-type rows 1.., unused duplicates)."""
        if p is not None:
            self.read.add(id(p))

    def source(self) -> tuple[torch.device, torch.dtype]:
        """The device and dtype of the HF model's first parameter (for a meta one: the CPU, the file's dtype)."""
        if self.first is None:
            raise RuntimeError("conversion bug: the HF model has no parameters")
        if self.first.device.type == "meta":
            return torch.device("cpu"), self.files.dtype(self._key(self.first))
        return self.first.device, self.first.dtype

    # zoo side
    def write(self, dst: torch.Tensor, value: torch.Tensor) -> None:
        name = self.zoo_names.get(id(dst))
        if name is None:
            raise RuntimeError("conversion bug: writing a tensor that is not a parameter of the zoo model")
        if id(dst) in self.written:
            raise RuntimeError(f"conversion bug: zoo parameter {name} written twice")
        if tuple(dst.shape) != tuple(value.shape):
            raise RuntimeError(f"conversion bug: {name} has shape {tuple(dst.shape)}, source {tuple(value.shape)}")
        self.values[id(dst)] = value
        self.written.add(id(dst))

    def linear(self, dst: nn.Linear, *srcs: nn.Module, conv1d: bool = False) -> None:
        """dst <- the row-wise concatenation of srcs (several for a fused projection)."""
        if conv1d:  # GPT-2's Conv1D: (in, out), one source; assign makes the transposition contiguous
            (src,) = srcs
            self.write(dst.weight, self.take(src.weight).t())
        else:
            self.write(dst.weight, self.take_rows([s.weight for s in srcs]))
        biases = [s.bias for s in srcs]
        if dst.bias is None:
            if any(b is not None for b in biases):
                raise RuntimeError("conversion bug: HF layer has a bias the zoo layer lacks")
            return
        if any(b is None for b in biases):
            raise RuntimeError("conversion bug: zoo layer has a bias the HF layer lacks")
        self.write(dst.bias, self.take_rows(biases))

    def norm(self, dst: nn.Module, src: nn.Module) -> None:
        self.write(dst.weight, self.take(src.weight))
        dst_b, src_b = getattr(dst, "bias", None), getattr(src, "bias", None)
        if (dst_b is None) != (src_b is None):
            raise RuntimeError(f"conversion bug: norm bias mismatch ({type(dst).__name__} vs {type(src).__name__})")
        if dst_b is not None:
            self.write(dst_b, self.take(src_b))

    def head(self, zoo_model: nn.Module, cfg: dict, out: torch.Tensor, inp: torch.Tensor, m: str) -> None:
        """The output projection weight: shared with the (already written) embedding, or its own."""
        if cfg["tie_embeddings"]:
            _need(self.same(out, inp), m, "tie_word_embeddings is set but the output and input embeddings differ")
            self.drop(out)
        else:
            self.write(zoo_model.head.weight, self.take(out))

    def finish(self) -> None:
        missing = [n for i, n in self.zoo_names.items() if i not in self.written]
        if missing:
            raise RuntimeError(f"conversion bug: {len(missing)} zoo parameter(s) never written: {', '.join(missing)}")
        unread = [n[0] for i, n in self.hf_names.items() if i not in self.read]
        if unread:
            raise RuntimeError(f"conversion bug: {len(unread)} HF parameter(s) never read: {', '.join(unread)}")

    def assign(self, zoo_model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
        """Make the written values the zoo model's parameters (tied parameters stay one tensor).

        A value that is an HF parameter itself (or a view of one) is copied, so training the zoo model
        leaves the HF model alone, and so is a view of part of a tensor (a transposition, BART's position
        rows), so each parameter owns compact storage; concatenations, sums and tensors read from a file
        are fresh and used as they are (never a second copy)."""
        new: dict[int, nn.Parameter] = {}
        for module in zoo_model.modules():
            for name, p in module._parameters.items():
                if p is None:
                    continue
                if id(p) not in new:
                    value = self.values.pop(id(p)).to(device=device, dtype=dtype)
                    compact = (value.is_contiguous() and value.storage_offset() == 0
                               and value.untyped_storage().nbytes() == value.numel() * value.element_size())
                    if not compact or value.untyped_storage().data_ptr() in self.hf_storage:
                        value = value.clone(memory_format=torch.contiguous_format)
                    new[id(p)] = nn.Parameter(value, requires_grad=p.requires_grad)
                module._parameters[name] = new[id(p)]


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device: no memory and no random init
    (an init on meta is a no-op). Buffers (RoPE and sinusoidal tables, ALiBi slopes) stay real."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":  # a tied (already meta) parameter stays itself
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def _finish(model: nn.Module, copier: _Copier, hf_model: nn.Module) -> nn.Module:
    copier.finish()
    device, dtype = copier.source()
    copier.assign(model, device, dtype)
    model.to(device=device, dtype=dtype)  # the buffers; the parameters are there already
    return model.train(hf_model.training)


def _pairs(zoo_blocks: Iterable, hf_layers: Iterable) -> Iterable:
    return zip(zoo_blocks, hf_layers, strict=True)


@torch.no_grad()
def gpt2_from_hf(hf_model: nn.Module, files: _Safetensors | None = None) -> nn.Module:
    """GPT2LMHeadModel -> zoo decoder_only."""
    cfg = gpt2_config_from_hf(hf_model.config)
    c = _Copier(hf_model, files)
    model = c.build(cfg)
    t, dec = hf_model.transformer, model.decoder
    c.write(model.embed.weight, c.take(t.wte.weight))
    c.write(dec.position.weight, c.take(t.wpe.weight))
    for blk, h in _pairs(dec.blocks, t.h):
        c.norm(blk.attn.norm, h.ln_1)
        c.linear(blk.attn.f.qkv, h.attn.c_attn, conv1d=True)  # columns already [q | k | v]
        c.linear(blk.attn.f.out, h.attn.c_proj, conv1d=True)
        c.norm(blk.ffn.norm, h.ln_2)
        c.linear(blk.ffn.f.up, h.mlp.c_fc, conv1d=True)
        c.linear(blk.ffn.f.down, h.mlp.c_proj, conv1d=True)
    c.norm(dec.final_norm, t.ln_f)
    c.head(model, cfg, hf_model.lm_head.weight, t.wte.weight, "GPT-2")
    return _finish(model, c, hf_model)


@torch.no_grad()
def bert_from_hf(hf_model: nn.Module, files: _Safetensors | None = None) -> nn.Module:
    """BertForMaskedLM -> zoo encoder_only (token_type_ids = 0 folded into the positions)."""
    cfg = bert_config_from_hf(hf_model.config)
    c = _Copier(hf_model, files)
    model = c.build(cfg)
    e, enc = hf_model.bert.embeddings, model.encoder
    c.write(model.embed.weight, c.take(e.word_embeddings.weight))
    token_type = c.take(e.token_type_embeddings.weight)  # rows 1.. are dropped: zoo has no segments
    c.write(enc.position.weight, c.take(e.position_embeddings.weight) + token_type[0])
    del token_type  # nothing read is kept past its use
    c.norm(enc.embed_norm, e.LayerNorm)
    for blk, layer in _pairs(enc.blocks, hf_model.bert.encoder.layer):
        a = layer.attention
        c.linear(blk.attn.f.qkv, a.self.query, a.self.key, a.self.value)
        c.linear(blk.attn.f.out, a.output.dense)
        c.norm(blk.attn.norm, a.output.LayerNorm)
        c.linear(blk.ffn.f.up, layer.intermediate.dense)
        c.linear(blk.ffn.f.down, layer.output.dense)
        c.norm(blk.ffn.norm, layer.output.LayerNorm)
    p = hf_model.cls.predictions
    c.linear(model.head_dense, p.transform.dense)
    c.norm(model.head_norm, p.transform.LayerNorm)
    c.head(model, cfg, p.decoder.weight, e.word_embeddings.weight, "BERT")
    c.write(model.head.bias, c.take(p.decoder.bias))  # the bias the forward pass adds
    c.drop(p.bias)  # the same tensor when tied; an unused duplicate otherwise
    return _finish(model, c, hf_model)


@torch.no_grad()
def llama_from_hf(hf_model: nn.Module, files: _Safetensors | None = None) -> nn.Module:
    """LlamaForCausalLM -> zoo decoder_only (RoPE, RMSNorm, SwiGLU, GQA)."""
    cfg = llama_config_from_hf(hf_model.config)
    c = _Copier(hf_model, files)
    model = c.build(cfg)
    m, dec = hf_model.model, model.decoder
    c.write(model.embed.weight, c.take(m.embed_tokens.weight))
    for blk, layer in _pairs(dec.blocks, m.layers):
        a, f = layer.self_attn, layer.mlp
        c.norm(blk.attn.norm, layer.input_layernorm)
        c.linear(blk.attn.f.qkv, a.q_proj, a.k_proj, a.v_proj)
        c.linear(blk.attn.f.out, a.o_proj)
        c.norm(blk.ffn.norm, layer.post_attention_layernorm)
        c.linear(blk.ffn.f.gate, f.gate_proj)
        c.linear(blk.ffn.f.up, f.up_proj)
        c.linear(blk.ffn.f.down, f.down_proj)
    c.norm(dec.final_norm, m.norm)
    c.head(model, cfg, hf_model.lm_head.weight, m.embed_tokens.weight, "Llama")
    return _finish(model, c, hf_model)


def _bart_attention(c: _Copier, wrapper: nn.Module, hf_attn: nn.Module, hf_norm: nn.Module, cross: bool) -> None:
    f = wrapper.f
    if cross:
        c.linear(f.q, hf_attn.q_proj)
        c.linear(f.kv, hf_attn.k_proj, hf_attn.v_proj)
    else:
        c.linear(f.qkv, hf_attn.q_proj, hf_attn.k_proj, hf_attn.v_proj)
    c.linear(f.out, hf_attn.out_proj)
    c.norm(wrapper.norm, hf_norm)


@torch.no_grad()
def bart_from_hf(hf_model: nn.Module, files: _Safetensors | None = None) -> nn.Module:
    """BartForConditionalGeneration -> zoo encoder_decoder."""
    cfg = bart_config_from_hf(hf_model.config)
    bias = getattr(hf_model, "final_logits_bias", None)
    _need(bias is None or not torch.any(bias != 0), "BART",
          "final_logits_bias is non-zero; the zoo output head has no bias")
    c = _Copier(hf_model, files)
    model = c.build(cfg)
    m = hf_model.model
    enc_embed, dec_embed = m.encoder.embed_tokens.weight, m.decoder.embed_tokens.weight
    _need(c.same(dec_embed, enc_embed), "BART",
          "encoder and decoder token embeddings differ; zoo shares one embedding (set tie_word_embeddings)")
    c.write(model.embed.weight, c.take(enc_embed))
    c.drop(dec_embed)  # equal to enc_embed (checked above)
    c.drop(m.shared.weight)  # the encoder's table when tied; not used by the forward pass otherwise
    for stack, hf_stack in ((model.encoder, m.encoder), (model.decoder, m.decoder)):
        table = hf_stack.embed_positions
        c.write(stack.position.weight, c.take(table.weight)[getattr(table, "offset", 2):])
        c.norm(stack.embed_norm, hf_stack.layernorm_embedding)
        for blk, layer in _pairs(stack.blocks, hf_stack.layers):
            _bart_attention(c, blk.attn, layer.self_attn, layer.self_attn_layer_norm, cross=False)
            if blk.cross is not None:
                _bart_attention(c, blk.cross, layer.encoder_attn, layer.encoder_attn_layer_norm, cross=True)
            c.linear(blk.ffn.f.up, layer.fc1)
            c.linear(blk.ffn.f.down, layer.fc2)
            c.norm(blk.ffn.norm, layer.final_layer_norm)
    c.head(model, cfg, hf_model.lm_head.weight, enc_embed, "BART")
    return _finish(model, c, hf_model)


def _t5_attention(c: _Copier, wrapper: nn.Module, hf_layer: nn.Module, cross: bool) -> None:
    """One T5 attention sublayer: the query rows carry sqrt(d_kv), since T5 does not scale its scores."""
    a, f = hf_layer.EncDecAttention if cross else hf_layer.SelfAttention, wrapper.f
    scale = a.key_value_proj_dim ** 0.5
    if cross:
        c.write(f.q.weight, c.take(a.q.weight) * scale)
        c.linear(f.kv, a.k, a.v)
    else:
        qkv = c.take_rows([a.q.weight, a.k.weight, a.v.weight])  # a new tensor: scaled in place
        qkv[:a.q.weight.shape[0]].mul_(scale)
        c.write(f.qkv.weight, qkv)
    c.linear(f.out, a.o)
    c.norm(wrapper.norm, hf_layer.layer_norm)


@torch.no_grad()
def t5_from_hf(hf_model: nn.Module, files: _Safetensors | None = None) -> nn.Module:
    """T5ForConditionalGeneration (T5 or T5 v1.1) -> zoo encoder_decoder."""
    m, config = "T5", hf_model.config
    cfg = t5_config_from_hf(config)
    c = _Copier(hf_model, files)
    shared, head = hf_model.shared.weight, hf_model.lm_head.weight
    cfg["tie_embeddings"] = c.same(head, shared)
    for stack in (hf_model.encoder, hf_model.decoder):
        _need(c.same(stack.embed_tokens.weight, shared), m,
              "the encoder's or decoder's token embeddings differ from `shared`; zoo shares one embedding")
    model = c.build(cfg)
    c.write(model.embed.weight, c.take(shared))
    for stack, hf_stack in ((model.encoder, hf_model.encoder), (model.decoder, hf_model.decoder)):
        c.drop(hf_stack.embed_tokens.weight)  # `shared` itself, or checked equal to it above
        c.write(stack.position.weight, c.take(hf_stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight))
        for blk, hf_blk in _pairs(stack.blocks, hf_stack.block):
            _t5_attention(c, blk.attn, hf_blk.layer[0], cross=False)
            if blk.cross is not None:
                _t5_attention(c, blk.cross, hf_blk.layer[1], cross=True)
            ff = hf_blk.layer[-1]
            dense = ff.DenseReluDense
            if hasattr(dense, "wi_0"):  # gated: act(wi_0 x) * wi_1 x
                c.linear(blk.ffn.f.gate, dense.wi_0)
                c.linear(blk.ffn.f.up, dense.wi_1)
            else:
                c.linear(blk.ffn.f.up, dense.wi)
            c.linear(blk.ffn.f.down, dense.wo)
            c.norm(blk.ffn.norm, ff.layer_norm)
    c.write(model.encoder.final_norm.weight, c.take(hf_model.encoder.final_layer_norm.weight))
    # The original T5 scales the decoder output by d_model**-0.5 before the head: a factor on the final gain.
    scale = getattr(config, "scale_decoder_outputs", config.tie_word_embeddings)  # as t5_config_from_hf
    gain = c.take(hf_model.decoder.final_layer_norm.weight)
    c.write(model.decoder.final_norm.weight, gain * config.d_model ** -0.5 if scale else gain)
    del gain  # nothing read is kept past its use
    c.head(model, cfg, head, shared, m)
    return _finish(model, c, hf_model)


# --------------------------------------------------------------------------------------- dispatch

_CONVERTERS: dict[str, Callable[..., nn.Module]] = {
    "GPT2LMHeadModel": gpt2_from_hf, "BertForMaskedLM": bert_from_hf,
    "LlamaForCausalLM": llama_from_hf, "BartForConditionalGeneration": bart_from_hf,
    "T5ForConditionalGeneration": t5_from_hf,
}
_CLASS_FOR_TYPE = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "llama": "LlamaForCausalLM",
                   "bart": "BartForConditionalGeneration", "t5": "T5ForConditionalGeneration"}


def convert(hf_model: nn.Module) -> nn.Module:
    """A zoo model with the weights of a transformers model, chosen by its class name."""
    name = type(hf_model).__name__
    if name not in _CONVERTERS:
        raise ConversionError(f"cannot convert {name}; supported classes: {', '.join(_CONVERTERS)}")
    return _CONVERTERS[name](hf_model)


from_hf = convert

_HUB_KWARGS = ("revision", "cache_dir", "local_files_only", "token", "subfolder", "force_download", "proxies")
_DIRECT_KWARGS = {"local_files_only", "attn_implementation"}  # nothing to do when reading local files into zoo


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:  # the optional `hf` extra
        from zoo.cli.common import needs

        raise ImportError(needs("transformers", "hf", "zoo.convert.from_pretrained")) from err
    return transformers


def _class_name(model_type: Any) -> str:
    if model_type not in _CLASS_FOR_TYPE:
        raise ConversionError(f"cannot convert model_type={model_type!r}; supported: {', '.join(_CLASS_FOR_TYPE)}")
    return _CLASS_FOR_TYPE[model_type]


def _local(name_or_path: str | os.PathLike, kw: dict) -> Path | None:
    """The directory `name_or_path` names on this machine (in its `subfolder`), or None for a hub id."""
    path = Path(name_or_path).expanduser()
    if not path.exists() and not str(name_or_path).startswith(("/", ".", "~")):
        return None
    return path / kw["subfolder"] if kw.get("subfolder") else path


def _local_config(directory: Path) -> Any:
    """The transformers config of a local directory, once the directory and its config.json are checked."""
    transformers = _transformers()
    check_directory(directory)
    raw = _read_json(directory / CONFIG, "the model's config")
    if not isinstance(raw, dict):
        _fail(directory / CONFIG, "not a JSON object")
    _class_name(raw.get("model_type"))
    try:
        return transformers.AutoConfig.from_pretrained(directory)
    except Exception as e:  # a value the config class rejects: whatever transformers raises, one line
        _fail(directory / CONFIG, f"transformers cannot read it ({first_line(e)})")


def _skeleton(directory: Path, config: Any) -> nn.Module:
    """The HF model of `config` with its parameters on the meta device (its own init is then a no-op)."""
    cls_name = _class_name(config.model_type)
    try:
        with _parameters_on_meta():
            return getattr(_transformers(), cls_name)(config)
    except Exception as e:  # sizes the model code rejects (heads that do not divide the width, ...)
        _fail(directory / CONFIG, f"transformers cannot build {cls_name} from it ({first_line(e)})")


def check_pretrained(directory: str | os.PathLike) -> Any:
    """Check a local save_pretrained directory as from_pretrained reads it, without reading a weight: its entries
    stay inside it (check_directory), config.json is valid JSON naming a supported model_type, the weights are
    safetensors (a pickle is refused, never loaded), each file's header fits the file, a shard index names only
    files inside the directory, and every parameter the config implies is stored with its shape. Returns the
    transformers config; raises ConversionError (one line) on the first problem."""
    directory = Path(directory).expanduser()
    config = _local_config(directory)
    with _Safetensors(directory) as files:
        files.check(_skeleton(directory, config))
    return config


def from_pretrained(name_or_path: str | os.PathLike, **kw: Any) -> nn.Module:
    """Load a GPT-2 / BERT / Llama / BART / T5 checkpoint (hub name or local directory) and convert it.

    A local directory is checked first (check_pretrained's checks; ConversionError, one line), then its
    safetensors weights are read directly: the HF model is built as a skeleton with its parameters on the meta
    device, and each tensor is read from the file when the converter takes it, in the file's dtype (see "Memory
    and precision"). A hub name, or `kw` other than local_files_only and attn_implementation, is loaded by
    transformers' `from_pretrained(name_or_path, use_safetensors=True, **kw)`, then converted: pickled weights
    (pytorch_model.bin) are never loaded."""
    transformers = _transformers()
    directory = _local(name_or_path, kw)
    if directory is None:  # a hub id
        config = transformers.AutoConfig.from_pretrained(name_or_path, **{k: kw[k] for k in _HUB_KWARGS if k in kw})
        cls = getattr(transformers, _class_name(config.model_type))
        return convert(cls.from_pretrained(name_or_path, **{"use_safetensors": True, **kw}).eval())
    config = _local_config(directory)
    cls_name = _class_name(config.model_type)
    with _Safetensors(directory) as files:
        if set(kw) <= _DIRECT_KWARGS:
            skeleton = _skeleton(directory, config)
            files.check(skeleton)
            files.prepare(skeleton)
            return _CONVERTERS[cls_name](skeleton.eval(), files)
    cls = getattr(transformers, cls_name)
    return convert(cls.from_pretrained(name_or_path, **{"use_safetensors": True, **kw}).eval())
