"""Look at a model before (or after) training it: parameters, FLOPs, memory, and attention maps.

    python -m zoo.inspect                                   # the default config (conf/config.yaml)
    python -m zoo.inspect model.d_model=256 ffn=swiglu      # any Hydra overrides, as for train.py
    python -m zoo.inspect --vs ffn=swiglu                   # A = defaults, B = A with ffn=swiglu
    python -m zoo.inspect experiment=llama_style --vs attention=mha
    python -m zoo.inspect --attention run/checkpoints/last.ckpt --text "To be, or not" --out attn.png
    python -m zoo.inspect --loss-by-position run/checkpoints/last.ckpt --length 128   # does it extrapolate?

Nothing is trained or built: the counts come from `zoo.build.count_params` and `flops_per_token`, for the
config composed from conf/ with the overrides (zoo.cli.common.compose). The vocabulary is the data's
tokenizer's: 102 for the embedded Shakespeare corpus with the char tokenizer, the task alphabet for synthetic
tasks, 276 for bytes, data.vocab_size for bpe, or whatever model.vocab_size=N says. A null model.max_seq_len
becomes the data's context, as in training.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

from zoo.cli.common import EXIT_ERROR, EXIT_OK, OneLineParser, compose
from zoo.component import ConfigError
from zoo.io import atomic_write

DEFAULT_CHAR_VOCAB = 102  # the char tokenizer fitted on the embedded corpus: 20 specials + 82 characters
COMPONENTS = (("embedding", "embeddings"), ("position", "positions"), ("attention", "attention"), ("ffn", "FFN"),
              ("norm", "norms"), ("head", "head"))


class InspectError(ValueError):
    """A bad override, config or checkpoint, reported as one line."""


# ----------------------------------------------------------------------------------------------
# Config -> counts
# ----------------------------------------------------------------------------------------------

def merge_overrides(base: list[str], extra: list[str]) -> list[str]:
    """base with extra applied on top: an override of the same key replaces the earlier one."""
    def key(o: str) -> str:
        return o.partition("=")[0].lstrip("+~")

    replaced = {key(o) for o in extra}
    return [o for o in base if key(o) not in replaced] + list(extra)


def data_context(data: dict) -> int:
    """The longest sequence training would feed the model (sizes a null max_seq_len)."""
    if data.get("kind") == "task":
        from zoo.data.tasks import sequence_len

        return sequence_len(data["task"], data["test_len"][1])
    return data["context"]


def data_vocab(data: dict) -> tuple[int, str]:
    """(vocab size, where it came from) of the data's tokenizer, without loading data where a cheaper answer
    exists."""
    from zoo.data.tokenizers import N_SPECIAL, build_tokenizer

    kind, name = data.get("kind"), data.get("tokenizer", "char")
    if kind == "task":
        from zoo.data.tasks import TASK_ALPHABET

        return build_tokenizer("char").fit(TASK_ALPHABET).vocab_size, f"{data['task']} task alphabet"
    if name == "byte":
        return N_SPECIAL + 256, "byte tokenizer"
    if name == "bpe":
        return data.get("vocab_size", 1024), "bpe target data.vocab_size"
    if kind == "text" and data.get("path") is None:
        return DEFAULT_CHAR_VOCAB, "char tokenizer on the embedded corpus"
    if kind == "text" and data.get("path") not in (None, "???"):
        from zoo.data.corpus import read_text_file

        return build_tokenizer("char").fit(read_text_file(data["path"])).vocab_size, f"char on {data['path']}"
    raise InspectError("model.vocab_size: cannot tell the vocabulary of this data without loading it; "
                       "pass model.vocab_size=N")


def inspect_config(overrides: list[str]) -> dict:
    """Composed config, resolved model config and its counts: params, FLOPs per token, weight bytes."""
    from zoo.build import ConfigError, count_params, flops_per_token, resolve_config
    from zoo.data.corpus import DataError
    from zoo.training.validate import check_data

    plain = compose(overrides)
    model, data = dict(plain["model"]), plain["data"]
    try:
        check_data(data)  # the sizes that count the model (task lengths, vocab_size), named as in training
        for key in ("context", "batch_size"):
            if key in data and (not isinstance(data[key], int) or isinstance(data[key], bool) or data[key] <= 0):
                raise ConfigError(f"data.{key}: must be a positive integer, got {data[key]!r}")
        if data.get("tokenizer", "char") not in ("char", "byte", "bpe"):
            raise ConfigError(f"data.tokenizer: unknown {data['tokenizer']!r}; valid: bpe, byte, char")
        if model.get("vocab_size"):
            source = "model.vocab_size"
        else:
            model["vocab_size"], source = data_vocab(data)
        context = data_context(data)
        if model.get("max_seq_len") is None:
            model["max_seq_len"] = context
        model = resolve_config(model).as_dict()
        params = count_params(model)
        flops = flops_per_token(model, context)
    except (ConfigError, DataError, KeyError) as e:
        raise InspectError(str(e.args[0]) if e.args else str(e)) from None
    return {"config": plain, "model": model, "context": context, "vocab_source": source, "params": params,
            "flops": flops, "bytes": {"float32": 4 * params["total"], "16-bit": 2 * params["total"]}}


def describe(model: dict) -> str:
    from zoo.registry import MODEL

    ffn = model["ffn"]
    d_ff = f" d_ff {ffn['d_ff']}" if ffn.get("d_ff") else ""
    att = model["attention"]
    kv = f" ({att['n_kv_heads']} kv heads)" if att.get("n_kv_heads") else ""
    window = f", window {att['window']}" if att.get("window") else ""
    layers = f"{model['n_layers']} layers"
    if MODEL.get(model["name"]).needs_source:  # an encoder and a decoder
        layers = f"{model['n_layers']}+{model.get('n_decoder_layers') or model['n_layers']} layers"
    return (f"{model['name']}: d_model {model['d_model']}, {layers}, {model['n_heads']} heads; "
            f"{att['name']}{kv}{window} attention, {model['position']['name']} positions, "
            f"{model['norm']['placement']}-{model['norm']['type']}, {ffn['name']}{d_ff} FFN; "
            f"bias {model['bias']}, tied embeddings {model['tie_embeddings']}")


def _human(x: float, unit: str = "") -> str:
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}{unit}"
    return f"{x:.0f}{unit}"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def non_embedding(params: dict) -> int:
    """Parameters in the blocks: attention, FFN and norms (embeddings and the output head left out)."""
    return params["attention"] + params["ffn"] + params["norm"]


def ffn_share(params: dict) -> float:
    """FFN / (attention + FFN): 2/3 for MHA with a 4x GELU FFN and no biases (8 d^2 of 12 d^2 per layer)."""
    both = params["attention"] + params["ffn"]
    return params["ffn"] / both if both else math.nan


def format_single(info: dict) -> str:
    p, total, blocks = info["params"], info["params"]["total"], non_embedding(info["params"])
    lines = [describe(info["model"]),
             f"vocab {info['model']['vocab_size']} ({info['vocab_source']}), context {info['context']}, "
             f"max_seq_len {info['model']['max_seq_len']}", "",
             f"{'component':<16}{'params':>14}{'% of total':>12}{'% non-emb':>12}"]
    for key, name in COMPONENTS:
        in_blocks = key in ("attention", "ffn", "norm")
        share_blocks = f"{100 * p[key] / blocks:.1f}%" if in_blocks and blocks else "-"
        lines.append(f"{name:<16}{p[key]:>14,}{100 * p[key] / total:>11.1f}%{share_blocks:>12}")
    lines.append(f"{'total':<16}{total:>14,}{100.0:>11.1f}%")
    if p["active"] != total:  # sparse parts (ffn=moe): what one token uses
        lines.append(f"{'active':<16}{p['active']:>14,}{100 * p['active'] / total:>11.1f}%")
    lines += [
              f"{'non-embedding':<16}{blocks:>14,}{100 * blocks / total:>11.1f}%{'100.0%':>12}",
              f"FFN share of attention + FFN: {100 * ffn_share(p):.1f}% "
              "(2/3 for a 4x FFN beside MHA self-attention, no biases)", "",
              f"FLOPs per token at context {info['context']}: forward {info['flops']['forward']:,} "
              f"({_human(info['flops']['forward'])}), train {info['flops']['train']:,} "
              f"({_human(info['flops']['train'])}; 3x forward)",
              f"weights: float32 {info['bytes']['float32']:,} bytes ({_mib(info['bytes']['float32'])}, 4 B/param); "
              f"16-bit {info['bytes']['16-bit']:,} bytes ({_mib(info['bytes']['16-bit'])}, 2 B/param)"]
    return "\n".join(lines)


def config_changes(a: dict, b: dict) -> list[str]:
    """'key: A -> B' for every setting that differs (the resolved model config and the rest of the run)."""
    from zoo.build import flatten_config

    fa = flatten_config({**a["config"], "model": a["model"]})
    fb = flatten_config({**b["config"], "model": b["model"]})
    return [f"{k}: {fa.get(k, '(unset)')} -> {fb.get(k, '(unset)')}" for k in dict.fromkeys([*fa, *fb])
            if fa.get(k, "(unset)") != fb.get(k, "(unset)")]


def _delta(a: int, b: int) -> str:
    d = b - a
    pct = f" ({100 * d / a:+.1f}%)" if a else ""
    return f"{d:+,}{pct}" if d else "0"


def format_vs(a: dict, b: dict, a_over: list[str], b_over: list[str]) -> str:
    rows = [(name, a["params"][key], b["params"][key]) for key, name in COMPONENTS]
    rows += [("total params", a["params"]["total"], b["params"]["total"]),
             *([("active params", a["params"]["active"], b["params"]["active"])]
               if a["params"]["active"] != a["params"]["total"] or b["params"]["active"] != b["params"]["total"]
               else []),
             ("non-embedding", non_embedding(a["params"]), non_embedding(b["params"])),
             ("FLOPs/token fwd", a["flops"]["forward"], b["flops"]["forward"]),
             ("FLOPs/token train", a["flops"]["train"], b["flops"]["train"]),
             ("float32 bytes", a["bytes"]["float32"], b["bytes"]["float32"]),
             ("16-bit bytes", a["bytes"]["16-bit"], b["bytes"]["16-bit"])]
    changes = config_changes(a, b)
    lines = [f"A: {' '.join(a_over) or '(defaults)'}", f"   {describe(a['model'])}",
             f"B: {' '.join(b_over) or '(defaults)'}", f"   {describe(b['model'])}",
             "changes: " + ("; ".join(changes) if changes else "none"), "",
             f"{'':<20}{'A':>16}{'B':>16}{'B-A':>24}"]
    for name, va, vb in rows:
        lines.append(f"{name:<20}{va:>16,}{vb:>16,}{_delta(va, vb):>24}")
    lines.append(f"{'FFN share att+FFN':<20}{100 * ffn_share(a['params']):>15.1f}%"
                 f"{100 * ffn_share(b['params']):>15.1f}%"
                 f"{100 * (ffn_share(b['params']) - ffn_share(a['params'])):>+22.1f}pp")
    lines.append(f"context: A {a['context']}, B {b['context']}; memory is weights only (4 B/param float32, "
                 "2 B/param 16-bit)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Attention maps
# ----------------------------------------------------------------------------------------------

# decoder.blocks.3.attn.f (a sequential placement; .branch under fixup, whose weights start apart) or
# decoder.blocks.3.parallel.f.attn (parallel); a last .f under model.shift_tokens (the shift wraps the attention)
_NAME = re.compile(r"^(encoder|decoder)\.blocks\.(\d+)\."
                   r"(?:(attn|cross)\.(?:f|branch)|parallel\.f\.(attn|cross))(?:\.f)?$")


def _token_label(s: str) -> str:
    return s.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "␣") or "∅"


def ordered_maps(maps: dict) -> list[tuple[str, object]]:
    """(row label, (H, Tq, Tk) weights) ordered encoder self, decoder self, decoder cross, by layer."""
    rows = []
    for name, w in maps.items():
        m = _NAME.match(name)
        if m is None:
            rows.append(((9, 0, name), name, w))
            continue
        stack, layer, kind = m.group(1), int(m.group(2)), m.group(3) or m.group(4)
        order = {("encoder", "attn"): 0, ("decoder", "attn"): 1, ("decoder", "cross"): 2}[(stack, kind)]
        label = f"{stack} {'cross' if kind == 'cross' else 'self'} L{layer}"
        rows.append(((order, layer, name), label, w))
    return [(label, w[0]) for _, label, w in sorted(rows, key=lambda r: r[0])]


def attention_figure(checkpoint: str | Path, text: str, out: str | Path, max_labels: int = 32) -> Path:
    """Write a PNG grid of a checkpoint's attention maps on `text`: rows = layers, columns = heads."""
    import torch
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from zoo.layers.attention import attention_maps
    from zoo.training.checkpoint import CheckpointError, load_checkpoint

    try:
        model, tok, cfg = load_checkpoint(checkpoint)
    except CheckpointError as e:
        raise InspectError(str(e)) from None
    ids = tok.encode(text, errors="replace")
    if not ids:
        raise InspectError("--text: encodes to no tokens; give some text")
    limit = cfg["model"].get("max_seq_len") or len(ids)
    truncated = len(ids) > limit
    ids = ids[:limit]
    tokens = torch.tensor([ids])
    inputs = (tokens, tokens) if model.needs_source else (tokens,)
    rows = ordered_maps(attention_maps(model, *inputs))
    if not rows:
        raise InspectError("checkpoint: the model has no attention layers to show")
    n_rows, n_cols = len(rows), max(w.shape[0] for _, w in rows)
    labels = [_token_label(tok.decode([i])) for i in ids] if len(ids) <= max_labels else None
    rotation = 90 if labels and max(len(s) for s in labels) > 2 else 0
    cell = 2.4 if labels is None else max(2.4, 0.16 * len(ids) + 0.8)
    fig = Figure(figsize=(min(1.2 + cell * n_cols, 60), min(0.8 + cell * n_rows, 80)), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    for r, (label, w) in enumerate(rows):
        for h in range(n_cols):
            ax = axes[r][h]
            if h >= w.shape[0]:
                ax.axis("off")
                continue
            ax.imshow(w[h].float().numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto",
                      interpolation="nearest")
            ax.set_title(f"{label} · head {h}", fontsize=8)
            if labels is not None:
                ax.set_xticks(range(len(labels)))
                ax.set_yticks(range(len(labels)))
                ax.set_xticklabels(labels if r == n_rows - 1 else [], fontsize=6, rotation=rotation)
                ax.set_yticklabels(labels if h == 0 else [], fontsize=6)
            else:
                ax.tick_params(labelsize=6)
            if h == 0:
                ax.set_ylabel("query", fontsize=7)
            if r == n_rows - 1:
                ax.set_xlabel("key", fontsize=7)
    note = f" (first {limit} tokens)" if truncated else ""
    fig.suptitle(f"attention of {cfg['model']['name']} on {len(ids)} tokens{note}\nrows = layers, columns = heads; "
                 "weight 0 (dark) to 1 (yellow)", fontsize=9)
    fig.tight_layout()
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, lambda f: fig.savefig(f, format="png"), mode="wb")
    except OSError as e:
        raise InspectError(f"--out: cannot write '{out}' ({e.strerror or type(e).__name__})") from None
    return out


def loss_by_position(checkpoint: str | Path, length: int, buckets: int = 8) -> dict:
    """Mean next-token loss of a decoder-only checkpoint at each position of `length`-token validation
    windows, the same windows as training's val_loss_long with data.long_context=length. Returns
    {"context": the training context, "length", "windows", "rows": [(first, last, mean loss), ...]}."""
    import torch
    import torch.nn.functional as F

    from zoo.data.corpus import DataError
    from zoo.training.checkpoint import CheckpointError, load_checkpoint
    from zoo.training.data import build_data
    from zoo.training.objectives import OBJECTIVE

    if not isinstance(length, int) or length < 2:
        raise InspectError(f"--length: must be an integer >= 2, got {length!r}")
    try:
        model, _, cfg = load_checkpoint(checkpoint)
    except CheckpointError as e:
        raise InspectError(str(e)) from None
    lineage, data_cfg = cfg["model"]["name"], dict(cfg["data"])
    if not model.next_token_lm or data_cfg.get("kind") not in ("text", "hf"):
        raise InspectError(f"--loss-by-position: needs a decoder_only model trained on text; this checkpoint is "
                           f"{lineage} on data.kind={data_cfg.get('kind')}")
    from zoo.generate import position_limit

    limit = position_limit(model)
    if limit is not None and length > limit:
        raise InspectError(f"--length: {length} is past the learned positions' max_seq_len; valid: 2..{limit}")
    try:
        data = build_data({**data_cfg, "long_context": length}, cfg.get("seed", 0), 1)
    except DataError as e:
        raise InspectError(str(e)) from None
    data.objective = OBJECTIVE.get(lineage)(cfg["model"]["vocab_size"])
    total = torch.zeros(length, dtype=torch.float64)
    n = 0
    with torch.no_grad():
        for batch in data.long_val_batches:
            logits = model(batch["input"])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), batch["target"].flatten(), reduction="none")
            total += loss.view(batch["target"].shape).double().sum(0)
            n += batch["target"].shape[0]
    mean = total / max(n, 1)
    edges = sorted({round(i * length / buckets) for i in range(buckets + 1)})
    context = data_cfg["context"]
    if context < length and context not in edges:  # a bucket never straddles the training context
        edges = sorted(edges + [context])
    rows = [(a, b - 1, float(mean[a:b].mean())) for a, b in zip(edges, edges[1:], strict=False) if b > a]
    return {"context": context, "length": length, "windows": n, "rows": rows}


def format_loss_by_position(result: dict) -> str:
    context = result["context"]
    lines = [f"loss by position: {result['windows']} validation windows of {result['length']} tokens; "
             f"trained with context {context} (positions 0..{context - 1})", "",
             "| positions | mean loss | |", "|---|---|---|"]
    for first, last, loss in result["rows"]:
        where = "inside the training context" if last < context else "beyond the training context"
        lines.append(f"| {first}-{last} | {loss:.4f} | {where} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = OneLineParser("inspect", description=__doc__.split("\n\n")[0],
                                epilog="B (--vs) is A's overrides with the --vs overrides applied on top.")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for train.py (ffn=swiglu model.d_model=256)")
    p.add_argument("--vs", nargs="+", default=None, metavar="OVERRIDE", help="a second config to compare with")
    p.add_argument("--attention", metavar="CHECKPOINT", default=None, help="plot a checkpoint's attention maps")
    p.add_argument("--text", default=None, help="the text to run through the checkpoint (with --attention)")
    p.add_argument("--out", default="attn.png", help="PNG to write (with --attention; default attn.png)")
    p.add_argument("--loss-by-position", metavar="CHECKPOINT", default=None,
                   help="mean validation loss per position bucket, inside and beyond the training context")
    p.add_argument("--length", type=int, default=None, help="window length for --loss-by-position "
                   "(default: twice the training context)")
    args = p.parse_args(argv)
    try:
        if args.loss_by_position is not None:
            if args.overrides or args.vs or args.attention:
                raise InspectError("--loss-by-position takes no config overrides, --vs or --attention")
            length = args.length
            if length is None:
                from zoo.training.checkpoint import CheckpointError, read_checkpoint

                try:
                    length = 2 * read_checkpoint(args.loss_by_position)["hyper_parameters"]["cfg"]["data"]["context"]
                except (CheckpointError, KeyError, TypeError):
                    length = 0  # load_checkpoint below says what is wrong with the file
            print(format_loss_by_position(loss_by_position(args.loss_by_position, length or 2)))
            return EXIT_OK
        if args.length is not None:
            raise InspectError("--length goes with --loss-by-position CHECKPOINT")
        if args.attention is not None:
            if args.text is None:
                raise InspectError("--attention needs --text \"some text\"")
            if args.overrides or args.vs:
                raise InspectError("--attention takes no config overrides (the checkpoint holds its config)")
            out = attention_figure(args.attention, args.text, args.out)
            print(f"wrote {out}")
            return EXIT_OK
        if args.text is not None:
            raise InspectError("--text goes with --attention CHECKPOINT")
        a = inspect_config(args.overrides)
        if args.vs is None:
            print(format_single(a))
        else:
            b_over = merge_overrides(args.overrides, args.vs)
            print(format_vs(a, inspect_config(b_over), args.overrides, b_over))
    except (InspectError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
