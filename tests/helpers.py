"""Helpers the tests import (fixtures stay in the conftest.py files, which pytest loads by itself)."""

import itertools
import os
import signal
from pathlib import Path

from hydra import compose, initialize_config_dir

CONF = str(Path(__file__).resolve().parents[1] / "conf")

# Tests compare numbers across runs and against bounds: they train in float32 on every machine, whatever
# trainer.precision=auto would pick here (a test of auto sets it again, later in its overrides).
FLOAT32 = ["trainer.precision=32-true"]
# Tiny and quick: a few steps of a one-layer model, evaluated twice.
TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "trainer.max_steps=4",
        "trainer.val_check_interval=2", "trainer.log_every_n_steps=1", "data.eval_batches=2", "data.batch_size=4",
        "data.context=16", *FLOAT32]
TINY_TASK = [o for o in TINY if not o.startswith(("data.eval_batches", "data.context"))] + [
    "data.n_train=200", "data.n_val=16", "data.n_test=16", "data.eval_examples=16"]


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=overrides)


def tiny_cfg(name: str = "decoder_only", **over) -> dict:
    """A model config small enough that a forward and backward take milliseconds."""
    cfg = dict(name=name, vocab_size=37, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


def run(model, tokens, **kw):
    """Forward any lineage on `tokens` (the encoder_decoder gets them as source and target)."""
    if model.cfg.name == "encoder_decoder":
        return model(tokens, tokens, **kw)
    return model(tokens, **kw)


def make(registry, name: str, d_model: int = 32, n_heads: int = 4, max_seq_len: int = 64, bias: bool = True,
         cross: bool = False, **options):
    """One component alone, built as the stack builds it: registry.get(name)(ctx, opts)."""
    from zoo.component import Context, build
    from zoo.spec import Part

    return build(registry, Part(name, registry.options(name)(**options)),
                 Context(d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, bias=bias, cross=cross))


# ---- Cases from the registries: a part registered tomorrow is under every property test with no test edited.

def cases(kind: str) -> list[dict]:
    """Every registered component of a kind with each of its example option sets, as config nodes:
    cases("attention") -> [{"name": "gqa", "n_kv_heads": 2}, {"name": "mha"}, {"name": "mha", "window": 3}, ...].
    kind "norm" gives norm types ({"type": ...}), "placement" norm placements ({"placement": ...})."""
    from zoo.registry import REGISTRIES

    registry = REGISTRIES["residual" if kind == "placement" else kind]
    key = {"norm": "type", "placement": "placement"}.get(kind, "name")
    return [{key: name, **example} for name in registry.names() for example in registry.examples(name)]


def case_id(case) -> str:
    """A short test id: {"name": "mha", "window": 3} -> "mha(window=3)"; a model config -> its parts joined by '-'."""
    if "vocab_size" in case:  # a whole tiny model config
        norm = case.get("norm", {})
        parts = [case["name"], case.get("attention"), case.get("position"), norm.get("placement"), norm.get("type"),
                 case.get("ffn"), None if case.get("bias", True) else "nobias"]
        return "-".join(case_id(p) if isinstance(p, dict) else str(p) for p in parts if p)
    head, *rest = case.items()
    return str(head[1]) + (f"({', '.join(f'{k}={v}' for k, v in rest)})" if rest else "")


KINDS = ("attention", "position", "placement", "norm", "ffn")


def lineages(need: str | None = None) -> list[str]:
    """Registered lineages, or those whose model class says `need` (e.g. "generates")."""
    from zoo.registry import MODEL

    return [n for n in MODEL.names() if need is None or getattr(MODEL.get(n), need)]


def model_cfg(row: dict, **over) -> dict:
    """A tiny model config from a row of cases: {"name": lineage, "attention": {...}, "placement": {...}, ...}."""
    cfg = tiny_cfg(row["name"], **over)
    for kind, value in row.items():
        if kind in ("placement", "norm"):
            cfg["norm"] = {**cfg.get("norm", {}), **value}
        elif kind != "name":
            cfg[kind] = value
    return cfg


def model_cases(names: list[str], kinds: tuple[str, ...] = KINDS, **over) -> list[dict]:
    """Tiny model configs, for each lineage in names, varying the given kinds ("bias" too) over a pairwise
    covering design of their registered cases (with two kinds that is their full product). So every value of
    every kind meets every value of every other kind under every lineage, but for the pairs a part declares it
    refuses (`refused`); the rest keep tiny_cfg's defaults."""
    factors = {k: [True, False] if k == "bias" else cases(k) for k in kinds}
    return [model_cfg(row, **over) for name in names for row in covering({"name": [name], **factors})]


FACTOR_KINDS = {"name": "model", "placement": "residual"}  # a covering factor's registry kind, where not its name


def part_of(factor: str, value) -> tuple | None:
    """(registry kind, name, options instance, registered entry) of a covering factor's value: a case of cases(),
    or a lineage's name; None where the factor is no part (bias)."""
    from zoo.registry import REGISTRIES

    kind = FACTOR_KINDS.get(factor, factor)
    if kind not in REGISTRIES or kind == "optim":
        return None
    registry = REGISTRIES[kind]
    key = {"norm": "type", "residual": "placement"}.get(kind, "name")
    node = {key: value} if isinstance(value, str) else value
    name = node[key]
    return kind, name, registry.options(name)(**{k: v for k, v in node.items() if k != key}), registry.get(name)


def refused(a: tuple[str, object], b: tuple[str, object]) -> str | None:
    """Why two factor values, (factor, value) each, cannot be in one model, as either part declares it (its
    `refuses`, read by zoo.component.refusal as the build reads it); None: they can."""
    from zoo.component import refusal

    pa, pb = part_of(*a), part_of(*b)
    if pa is None or pb is None:
        return None
    found = refusal(pa[3], pb[0], pb[1], pb[2]) or refusal(pb[3], pa[0], pa[1], pa[2])
    return found[1] if found else None


def covering(factors: dict[str, list], strength: int = 2) -> list[dict]:
    """A covering design: rows choosing one value per factor such that, for any `strength` factors, every
    combination of their values appears in at least one row (strength 2: every value of every factor meets
    every value of every other factor). Greedy and deterministic. Far fewer rows than the full product
    (about the product of the `strength` largest factors, not of all); and unlike a random sample it
    reaches every such combination, so a part that breaks only next to another is caught.
    A pair of values that a part declares it refuses (`refused`: nGPT's placement and MLA) is in no row, nor any
    combination holding it; every other combination is (tests/test_refusals.py checks the refused pairs)."""
    names = list(factors)
    bad = {frozenset(((n, i), (m, j))) for n, m in itertools.combinations(names, 2)
           for i, j in itertools.product(range(len(factors[n])), range(len(factors[m])))
           if refused((n, factors[n][i]), (m, factors[m][j]))}

    def fits(combo) -> bool:  # no refused pair among a combination's ((factor, value index), ...)
        return not any(frozenset(p) in bad for p in itertools.combinations(combo, 2))

    def tuples(row: dict) -> set:  # the ((factor, value index), ...) combinations a (partial) row covers
        chosen = [n for n in names if n in row]
        return {tuple((n, row[n]) for n in c) for c in itertools.combinations(chosen, strength)}

    uncovered = {combo for c in itertools.combinations(names, strength)
                 for idx in itertools.product(*(range(len(factors[n])) for n in c))
                 if fits(combo := tuple(zip(c, idx, strict=True)))}
    rows = []
    while uncovered:
        row = dict(min(uncovered))  # a combination no row has yet; fill the other factors to cover the most new
        for n in names:
            if n not in row:
                allowed = [k for k in range(len(factors[n])) if not any(frozenset(((n, k), (m, row[m]))) in bad
                                                                        for m in row)]
                if not allowed:
                    raise ValueError(f"covering: no value of {n} fits beside {row} (each is refused by one of them)")
                row[n] = max(allowed, key=lambda k: len(tuples({**row, n: k}) & uncovered))
        rows.append(row)
        uncovered -= tuples(row)
    return [{n: factors[n][row[n]] for n in names} for row in rows]


def save_pretrained_tokenizer(directory: Path, vocab_size: int = 400) -> Path:
    """A small byte-level BPE saved with save_pretrained, the way a downloaded GPT-2 tokenizer sits on disk
    (its own end-of-text token, <|endoftext|>, first); trained here, nothing downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from zoo.data import load_default_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([load_default_corpus()[:50_000]], trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(str(directory))
    return directory


def write_corpus(directory: Path, n_files: int = 4, paragraphs: int = 60) -> list[Path]:
    """Text files of Shakespeare paragraphs (blank-line separated), a few hundred documents in all."""
    from zoo.data import load_default_corpus

    paras = [p for p in load_default_corpus().split("\n\n") if p.strip()][200:200 + n_files * paragraphs]
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(n_files):
        path = directory / f"part{i}.txt"
        path.write_text("\n\n".join(paras[i * paragraphs:(i + 1) * paragraphs]) + "\n")
        files.append(path)
    return files


def interrupt_at_batch(monkeypatch, data_class: type, n: int = 4) -> None:
    """Send the run SIGINT as it draws its n-th training batch from `data_class` (which it handles: it finishes
    the step, writes last.ckpt and stops); `monkeypatch.undo()` restores the data class."""
    real, drawn = data_class.train_batch, []

    def interrupting(self, g):
        drawn.append(1)
        if len(drawn) == n:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, g)

    monkeypatch.setattr(data_class, "train_batch", interrupting)
