"""nanoGPT: its model.py, imported at run time from a checkout given with `--nanogpt PATH` (GPT-2 style only)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import pickle
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo.bench.contenders.base import NotInstalled
from zoo.bench.settings import Settings, Shape
from zoo.build import build_model


def load_nanogpt(path: Path):
    """nanoGPT's model.py imported from a checkout at run time (nothing of it lives in zoo)."""
    path = Path(path).expanduser().resolve()
    file = path / "model.py"
    if not file.is_file():
        raise NotInstalled(f"no model.py in {path}")
    name = "zoo_bench_nanogpt_model"
    if name not in sys.modules:
        sys.path.insert(0, str(path))
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def build_nanogpt(shape: Shape, family: str, s: Settings):
    if s.nanogpt is None:
        raise NotInstalled("not given (--nanogpt PATH)")
    if family != "gpt2":
        raise NotInstalled("GPT-2 style only")
    ng = load_nanogpt(s.nanogpt)
    cfg = ng.GPTConfig(block_size=shape.context, vocab_size=shape.vocab, n_layer=shape.n_layers,
                       n_head=shape.n_heads, n_embd=shape.d_model, dropout=0.0, bias=True)
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        model = ng.GPT(cfg)
    return model, lambda m, x, y: m(x, y)[1]  # its loss is lm_loss's call on the full logits


# ---------------------------------------------------------------------------------------------------------------
# Reading nanoGPT's checkpoints into zoo (the ttt section's yardstick scores them with zoo's evaluator).
# Facts of nanoGPT's model.py and train.py, not its code: `ckpt.pt` is a dict with `model` (the GPT's state_dict;
# `_orig_mod.` before every key when train.py ran compiled) and `model_args` (n_layer, n_head, n_embd, block_size,
# bias, vocab_size, dropout). The keys, for V = vocab_size, C = n_embd, T = block_size:
#   transformer.wte.weight (V, C), transformer.wpe.weight (T, C), lm_head.weight (V, C), tied to wte;
#   transformer.h.<i>.ln_1.weight (C), .attn.c_attn.weight (3C, C) with rows [q; k; v], heads contiguous within
#   each; .attn.c_proj.weight (C, C); .ln_2.weight (C); .mlp.c_fc.weight (4C, C); .mlp.c_proj.weight (C, 4C);
#   transformer.ln_f.weight (C); with bias=True also a `.bias` beside each of these Linear and LayerNorm weights.
#   .attn.bias (1, 1, T, T) is a causal-mask buffer, present only without torch's fused attention: not a weight.
# The model: pre-LayerNorm blocks (eps 1e-5), exact GELU, causal attention scaled by 1/sqrt(C / n_head), learned
# positions added to the token embeddings, a final LayerNorm and the tied head: zoo's GPT-2-shaped decoder_only.
# ---------------------------------------------------------------------------------------------------------------

_ZOO_OF_NANOGPT = {  # zoo's name in a block -> nanoGPT's
    "attn.norm": "ln_1", "attn.f.qkv": "attn.c_attn", "attn.f.out": "attn.c_proj",
    "ffn.norm": "ln_2", "ffn.f.up": "mlp.c_fc", "ffn.f.down": "mlp.c_proj",
}


class NanoGPTCheckpointError(ValueError):
    """A file that is not a nanoGPT checkpoint this reader can read, said in one line."""


def zoo_config_of_nanogpt(model_args: Mapping[str, Any]) -> dict:
    """zoo's decoder_only config of nanoGPT's `model_args`."""
    need = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")
    missing = [k for k in need if k not in model_args]
    if missing:
        raise NanoGPTCheckpointError(f"nanoGPT checkpoint: model_args lacks {', '.join(missing)}")
    d = int(model_args["n_embd"])
    return {"name": "decoder_only", "vocab_size": int(model_args["vocab_size"]), "d_model": d,
            "n_layers": int(model_args["n_layer"]), "n_heads": int(model_args["n_head"]),
            "max_seq_len": int(model_args["block_size"]), "dropout": 0.0, "bias": bool(model_args["bias"]),
            "tie_embeddings": True, "scale_embeddings": False, "embed_norm": False,
            "attention": {"name": "mha"}, "position": {"name": "learned"},
            "norm": {"placement": "pre", "type": "layernorm", "eps": 1e-5}, "ffn": {"name": "gelu", "d_ff": 4 * d}}


def zoo_from_nanogpt(state: Mapping[str, torch.Tensor], model_args: Mapping[str, Any]) -> nn.Module:
    """nanoGPT's GPT (its state_dict and model_args) as zoo's decoder_only, in eval mode: every nanoGPT weight is
    read exactly once and every zoo parameter written (load_state_dict's strict check), or one-line error."""
    sd = {k.removeprefix("_orig_mod."): v for k, v in state.items() if not k.endswith(".attn.bias")
          or v.dim() != 4}  # the causal-mask buffer
    cfg = zoo_config_of_nanogpt(model_args)
    if "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd.get("transformer.wte.weight")):
        raise NanoGPTCheckpointError("nanoGPT checkpoint: lm_head.weight differs from transformer.wte.weight; "
                                     "nanoGPT ties them, this reader reads tied heads only")
    pairs = {"embed.weight": "transformer.wte.weight", "decoder.embed.weight": "transformer.wte.weight",
             "head.weight": "lm_head.weight" if "lm_head.weight" in sd else "transformer.wte.weight",
             "decoder.position.weight": "transformer.wpe.weight"}
    kinds = ("weight", "bias") if cfg["bias"] else ("weight",)
    for i in range(cfg["n_layers"]):
        for z, n in _ZOO_OF_NANOGPT.items():
            pairs.update({f"decoder.blocks.{i}.{z}.{k}": f"transformer.h.{i}.{n}.{k}" for k in kinds})
    pairs.update({f"decoder.final_norm.{k}": f"transformer.ln_f.{k}" for k in kinds})
    unread = sorted(set(sd) - set(pairs.values()))
    absent = sorted({n for n in pairs.values() if n not in sd})
    if unread or absent:
        said = "; ".join(f"{what}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                         for what, names in (("unknown keys", unread), ("missing keys", absent)) if names)
        raise NanoGPTCheckpointError(f"nanoGPT checkpoint: not the GPT of its model.py with these model_args ({said})")
    model = build_model(cfg).to(sd["transformer.wte.weight"].dtype)  # the checkpoint's dtype, not float32's
    try:
        model.load_state_dict({z: sd[n] for z, n in pairs.items()}, strict=True)
    except RuntimeError as e:  # a shape that model_args does not imply
        lines = [ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln]
        raise NanoGPTCheckpointError(f"nanoGPT checkpoint: {(lines or [str(e)])[0]}") from None
    return model.eval()


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # meta.pkl holds dicts, ints and strings: nothing to import
        raise NanoGPTCheckpointError(f"nanoGPT meta.pkl: refuses to load {module}.{name}")


def read_nanogpt_checkpoint(path: str | Path, meta: str | Path) -> tuple[nn.Module, dict[str, int]]:
    """(zoo model, nanoGPT's character -> id) of a `ckpt.pt` nanoGPT's train.py wrote and the `meta.pkl` its
    shakespeare_char prepare.py wrote (`stoi`, `itos`: plain dicts, read without importing anything)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict) or "model_args" not in ckpt:
        raise NanoGPTCheckpointError(f"nanoGPT checkpoint: '{path}' has no `model` state_dict and `model_args`")
    with open(meta, "rb") as f:
        vocab = _PlainUnpickler(f).load()
    stoi = vocab.get("stoi") if isinstance(vocab, dict) else None
    if not isinstance(stoi, dict) or len(stoi) != ckpt["model_args"].get("vocab_size"):
        raise NanoGPTCheckpointError(f"nanoGPT meta.pkl: '{meta}' has no stoi of the checkpoint's vocab_size")
    return zoo_from_nanogpt(ckpt["model"], ckpt["model_args"]), stoi
