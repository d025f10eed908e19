"""Perplexity and bits per byte of a next-token LM on any data: a zoo checkpoint, or a Hugging Face model.

    python -m zoo.eval outputs/<date>/<time>/checkpoints/best.ckpt            # its own run's validation windows
    python -m zoo.eval run/checkpoints/best.ckpt data=text_file data.path=my.txt --max-windows 48
    python -m zoo.eval hf:gpt2 data.context=1024 --json                       # a converted GPT-2 (online)

The windows are the ones training scores as val_loss: `data.eval_batches` batches of `data.batch_size`
windows of `data.context + 1` tokens, drawn from the validation split with the same fixed seed, so a
checkpoint's loss here is its run's final val_loss. A checkpoint is evaluated on its own run's data unless
data overrides say otherwise (`data=<name>` replaces it; `data.key=value` changes one key), at the context it
was trained with unless data.context is given. `hf:<name or dir>` converts the model with
zoo.convert.from_pretrained and tokenizes with its own Hugging Face tokenizer, ids unshifted (zoo's hf:
tokenizers shift ids past zoo's 20 special ids; a converted model never saw those), at the model's
max_seq_len unless data.context is given. Bits per byte (and per character) use the split's
bytes (characters) per token: loss * tokens / (bytes * ln 2).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from zoo.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    OneLineParser,
    command,
    compose,
    missing_module,
    needs,
)
from zoo.component import ConfigError
from zoo.io import checkpoint_file_error, collect_once_at_exit

HF_PREFIX = "hf:"
SPLITS = ("val", "train")  # every text source splits into these two; none holds a separate test split


class EvalError(ValueError):
    """A bad checkpoint, model, data option or split, reported as one line."""


# ----------------------------------------------------------------------------------------------
# Model and data
# ----------------------------------------------------------------------------------------------

def load_model(source: str):
    """(model in eval mode, encode(text) -> ids or None for a zoo tokenizer, tokenizer state or None, run config
    or None). `source` is a checkpoint path or hf:<name or dir>."""
    if source.startswith(HF_PREFIX):
        name = source[len(HF_PREFIX):]
        try:
            from transformers import AutoTokenizer

            from zoo.convert import ConversionError, first_line, from_pretrained
            from zoo.net import bound_network
        except ImportError:
            raise EvalError(needs("transformers", "hf", "hf:<name>")) from None
        what = "it"
        try:
            bound_network()  # a hub that never answers: ZOO_NET_TIMEOUT_S, not forever
            model = from_pretrained(name)  # a local directory is checked first (zoo.convert.check_pretrained)
            what = "its tokenizer"
            tok = AutoTokenizer.from_pretrained(name)
        except ConversionError as e:
            raise EvalError(f"{source}: {e}") from None
        except Exception as e:  # not on the hub, or a damaged tokenizer file: one line, whatever the library raised
            raise EvalError(f"{source}: cannot load {what} ({first_line(e)})") from None
        return model.eval(), lambda text: tok(text, verbose=False)["input_ids"], None, None
    from zoo.kernels import apply_kernels
    from zoo.training.checkpoint import CheckpointError, load_checkpoint

    try:
        model, tokenizer, cfg = load_checkpoint(source)
        apply_kernels(model, cfg.get("kernels", "auto"))  # the run's kernel policy, as its validation had
    except (CheckpointError, ConfigError) as e:
        raise EvalError(str(e)) from None
    return model, lambda text: tokenizer.encode(text, errors="replace"), tokenizer.state_dict(), cfg


def data_config(overrides: list[str], run_cfg: dict | None) -> dict:
    """The data config: composed from conf/ with the overrides (which checks them, one line each); for a
    checkpoint without `data=<name>`, its run's data with only the overridden keys changed."""
    for o in overrides:
        if not o.lstrip("+~").startswith(("data=", "data.")):
            raise EvalError(f"overrides: '{o}' is not a data override; zoo.eval takes data=<name> and data.<key>=value")
    try:
        groups = [o for o in overrides if o.lstrip("+~").startswith("data=")]
        base = compose(groups)["data"] if groups or run_cfg is None else run_cfg["data"]
        for o in overrides:  # hydra says only "could not override": name the valid keys
            key = o.partition("=")[0].split(".")
            if len(key) > 1 and not o.startswith("+") and key[1] not in base:
                raise EvalError(f"data.{key[1]}: unknown data option; valid: {', '.join(sorted(base))}")
        composed = compose(overrides)["data"]
    except ConfigError as e:
        raise EvalError(str(e)) from None
    if run_cfg is None or any(o.lstrip("+~").startswith("data=") for o in overrides):
        return composed
    data = json.loads(json.dumps(run_cfg["data"]))  # a deep copy of plain data
    for o in overrides:
        path = o.lstrip("+~").partition("=")[0].split(".")[1:]
        src, dst = composed, data
        for key in path[:-1]:
            src, dst = src[key], dst.setdefault(key, {})
        if o.startswith("~"):
            dst.pop(path[-1], None)
        else:
            dst[path[-1]] = src[path[-1]]
    return data


def split_tokens(data: dict, split: str, encode, tokenizer_state: dict | None):
    """(TokenSplit, bytes per token, characters per token) of one split of the data."""
    import numpy as np

    from zoo.data.corpus import DataError, split_text
    from zoo.data.tokenizers import tokenizer_from_state
    from zoo.data.tokens import open_shards, read_manifest
    from zoo.training.data import TextData, TokenData, TokenSplit

    cls = text_source(data, split)
    try:
        if issubclass(cls, TextData):
            reader = cls.__new__(cls)  # only its read_text: no tokenizer is fitted, nothing else is read
            reader.cfg = data
            train, val = split_text(reader.read_text(), data.get("val_fraction", 0.1))
            text = val if split == "val" else train
            ids = np.array(encode(text), dtype=np.int64)
            return TokenSplit([ids]), len(text.encode("utf-8")) / len(ids), len(text) / len(ids)
        if issubclass(cls, TokenData):
            path = data.get("path")
            if not isinstance(path, str) or not path:
                raise EvalError(f"data.path: the directory {command('prepare')} wrote (data=tokens data.path=<dir>)")
            manifest = read_manifest(path)
            if tokenizer_state is None or tokenizer_from_state(manifest["tokenizer"]).state_dict() != tokenizer_state:
                raise EvalError(f"data.path: '{path}' was tokenized with another tokenizer than the model's; "
                                "evaluate it on text (data=text_file data.path=...) instead")
            s = manifest["splits"][split]
            # the end-of-text id after each document counts as one byte and one character, as a newline would
            return (TokenSplit(open_shards(path, manifest, split)), (s["bytes"] + s["documents"]) / s["tokens"],
                    (s["characters"] + s["documents"]) / s["tokens"])
    except DataError as e:
        raise EvalError(str(e)) from None
    raise AssertionError(cls)  # text_source admits no other class


def text_source(data: dict, split: str) -> type:
    """The data's class, if it is running text (a text or a prepared corpus) and has `split`."""
    from zoo.training.data import DATA, TextData, TokenData

    kind = data.get("kind")
    if kind not in DATA:
        raise EvalError(f"data.kind: unknown '{kind}'; valid: {', '.join(DATA.names())}")
    cls = DATA.get(kind)
    if not issubclass(cls, (TextData, TokenData)):
        raise EvalError(f"data.kind: '{kind}' is not running text (a seq2seq task has no perplexity); valid: "
                        f"{', '.join(n for n in DATA.names() if issubclass(DATA.get(n), (TextData, TokenData)))}")
    if split not in SPLITS:
        raise EvalError(f"--split: data.kind={kind} has no '{split}' split; valid: {', '.join(SPLITS)}")
    return cls


# ----------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------

def evaluate(source: str, overrides: list[str] | None = None, split: str = "val", max_windows: int | None = None,
             progress: bool = True) -> dict:
    """Mean next-token loss, perplexity and bits per byte (and character) of `source` on the data's windows."""
    import torch
    import torch.nn.functional as F
    from tqdm import tqdm

    from zoo.generate import position_limit
    from zoo.training.data import VAL_SEED, generator

    overrides = list(overrides or [])
    if max_windows is not None and max_windows < 1:
        raise EvalError(f"--max-windows: must be a positive integer, got {max_windows}")
    if not source.startswith(HF_PREFIX) and not Path(source).is_file():
        raise EvalError(f"checkpoint: no such file '{source}'")
    data = data_config(overrides, None) if source.startswith(HF_PREFIX) else None  # bad overrides before loading
    model, encode, tokenizer_state, run_cfg = load_model(source)
    if not model.next_token_lm:
        raise EvalError(f"model: {type(model).__name__} ({model.cfg.name}) is not a next-token LM: its loss is "
                        "not a loss per next token, so it has no perplexity")
    if data is None:
        data = data_config(overrides, run_cfg)
    text_source(data, split)
    context = data["context"]  # data.context=N wins; else a checkpoint's training context, an hf: model's whole one
    if not any(o.lstrip("+~").startswith("data.context=") for o in overrides):
        context = run_cfg["data"]["context"] if run_cfg is not None else model.cfg.max_seq_len
    limit = position_limit(model)
    if not isinstance(context, int) or context < 1 or (limit is not None and context > limit):
        raise EvalError(f"data.context: {context} is past this model's learned positions (max_seq_len={limit}); "
                        f"valid: 1..{limit}")
    tokens, bytes_per_token, chars_per_token = split_tokens(data, split, encode, tokenizer_state)
    if not tokens.fits(context):
        raise EvalError(f"data: the {split} split has {len(tokens)} tokens, too short for one window of "
                        f"data.context={context} + 1")
    batch = data.get("batch_size", 12)
    n_windows = max_windows if max_windows is not None else data.get("eval_batches", 20) * batch
    g = generator(VAL_SEED, "val" if split == "val" else f"eval-{split}", 0)  # val: training's own windows
    total, n_tokens = 0.0, 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    with torch.no_grad(), tqdm(total=n_windows, desc="windows", unit="win", file=sys.stderr,
                               disable=not progress) as bar:
        done = 0
        while done < n_windows:
            w = tokens.windows(g, batch, context)[:n_windows - done].to(device)
            logits = model(w[:, :-1])
            total += F.cross_entropy(logits.flatten(0, 1).double(), w[:, 1:].flatten(), reduction="sum").item()
            n_tokens += w[:, 1:].numel()
            done += w.shape[0]
            bar.update(w.shape[0])
    loss = total / n_tokens
    return {"model": source, "lineage": model.cfg.name, "data": data.get("path") or data.get("dataset") or
            "embedded corpus", "split": split, "windows": n_windows, "context": context, "tokens": n_tokens,
            "loss": loss, "perplexity": math.exp(loss), "bytes": n_tokens * bytes_per_token,
            "bits_per_byte": loss / (bytes_per_token * math.log(2)),
            "bits_per_char": loss / (chars_per_token * math.log(2))}


def format_result(r: dict) -> str:
    return "\n".join([
        f"{r['model']} ({r['lineage']}) on {r['data']}, {r['split']} split: {r['windows']} windows of {r['context']} "
        "tokens", "",
        "| tokens | loss (nats/token) | perplexity | bits per byte | bits per char |",
        "|---|---|---|---|---|",
        f"| {r['tokens']} | {r['loss']:.4f} | {r['perplexity']:.3f} | {r['bits_per_byte']:.4f} | "
        f"{r['bits_per_char']:.4f} |"])


def main(argv: list[str] | None = None) -> int:
    collect_once_at_exit()
    p = OneLineParser("eval", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a zoo checkpoint (.ckpt) or hf:<Hugging Face name or local directory>")
    p.add_argument("overrides", nargs="*", help="data overrides, as for train.py (data=text_file data.path=my.txt)")
    p.add_argument("--split", default="val", help=f"which split's windows ({', '.join(SPLITS)}; default val)")
    p.add_argument("--max-windows", type=int, default=None, metavar="N", help="evaluate only the first N windows")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    # a missing file or extra before torch loads: a typo answers at once
    hf = args.model.startswith(HF_PREFIX)
    if error := (needs("transformers", "hf", "hf:<name>") if hf and missing_module("transformers") else
                 None if hf else checkpoint_file_error(args.model)):
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    try:
        result = evaluate(args.model, args.overrides, args.split, args.max_windows)
    except (EvalError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(result, indent=1) if args.json else format_result(result))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
