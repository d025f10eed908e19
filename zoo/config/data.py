"""The data section, typed: one options dataclass per data kind (`data.kind`: text, hf, tokens, task), each field
with the default the data module uses when a preset leaves it out (conf/data/ sets most). Values are not checked
here: zoo.config.checks and the data modules (zoo.training.data) refuse a bad one in one line, naming its key."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class DataOptions:
    """What every kind takes: the kind, and the examples (or windows) per batch."""

    kind: str
    batch_size: int | None = None  # required (conf/data/ sets it)


@dataclass(frozen=True, kw_only=True)
class WindowOptions(DataOptions):
    """Text cut into windows of `context` tokens (text, hf, tokens)."""

    context: int | None = None  # tokens per training window; required
    eval_batches: int = 20  # fixed validation windows, the same for every run and seed
    long_context: int | None = None  # also report val_loss_long on windows this long; null: not


@dataclass(frozen=True, kw_only=True)
class TextOptions(WindowOptions):
    """data=shakespeare, data=text_file: a UTF-8 text, tokenized as the run starts."""

    path: str | None = None  # null: the embedded corpus
    tokenizer: str = "char"  # char, byte or bpe
    vocab_size: int = 1024  # bpe only
    val_fraction: float = 0.1  # the text's last part is validation


@dataclass(frozen=True, kw_only=True)
class HFOptions(TextOptions):
    """data=hf: a Hugging Face dataset's text column."""

    dataset: str | None = None  # required
    split: str = "train"
    text_column: str = "text"
    load_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TokensOptions(WindowOptions):
    """data=tokens: a corpus `zoo prepare` tokenized into shards."""

    path: str | None = None  # required: the directory zoo prepare wrote
    verify: str = "once"  # check the shards' sha256 and ids: once, always, never


@dataclass(frozen=True, kw_only=True)
class TaskOptions(DataOptions):
    """data=copy, reverse, sort, addition: a synthetic seq2seq task."""

    task: str | None = None  # required
    n_train: int | None = None
    n_val: int | None = None
    n_test: int | None = None
    train_len: list[int] | None = None  # digits per example: [min, max]
    test_len: list[int] | None = None  # longer than training: length generalisation
    eval_examples: int = 256  # examples decoded for exact match at each evaluation
    seed: int = 0  # the task's data, independent of the run's seed


# data.kind -> its options (zoo.training.data registers a data module under each of these names)
DATA_KINDS: dict[str, type[DataOptions]] = {"text": TextOptions, "hf": HFOptions, "tokens": TokensOptions,
                                            "task": TaskOptions}


def data_options(node: Mapping[str, Any]) -> DataOptions:
    """A data section (plain, as composed or stored) -> its kind's options. Keys the kind does not read are left
    out, as the data modules always left them; a kind zoo does not know keeps the kind alone (zoo.training.data
    refuses it, naming the valid kinds)."""
    kind = node.get("kind")
    cls = DATA_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return DataOptions(kind=str(kind))
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in node.items() if k in names})
