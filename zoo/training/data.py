"""Lightning DataModules: text corpora (embedded, a file, a Hugging Face dataset, a prepared corpus of token
shards) and seq2seq tasks.

Training batches come from a `StepLoader`: batch i is drawn from a generator seeded by the run's
seed and i, so the data order is a function of the step alone. A resumed run continues exactly
where the interrupted one stopped, and every variant in a sweep sees the same batches.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

from zoo.commands import command, needs
from zoo.config.data import DataOptions, HFOptions, TaskOptions, TextOptions, TokensOptions, WindowOptions, data_options
from zoo.data import corpus
from zoo.data.corpus import DataError, load_default_corpus, read_text_file, split_text
from zoo.data.tasks import TASK_ALPHABET, get_task, sequence_len, task_splits
from zoo.data.tokenizers import Tokenizer, build_tokenizer, cached_bpe, tokenizer_from_state
from zoo.data.tokens import check_verify, open_shards, read_manifest
from zoo.io import cache_dir
from zoo.net import bound_network
from zoo.registry import Registry
from zoo.training.objectives import Objective

DATA = Registry("data")  # keyed by cfg.data.kind
# Validation windows (and their masking) do not depend on the run's seed: every run of a sweep, every
# seed included, is scored on the same tokens, so seed-to-seed spread is training noise alone.
VAL_SEED = 0
Batch = dict[str, torch.Tensor]  # what an objective makes of windows or pairs (Objective.text_batch, task_batch)


def generator(seed: int, stream: str, i: int) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}/{stream}/{i}".encode()))


class StepLoader:
    """Training batches in order: batch i is `make(generator seeded by (seed, i))`.

    Stateful: Lightning stores `state_dict()` in checkpoints, so a resumed run continues at the next
    batch. With several processes, process r of w takes batches i * w + r."""

    def __init__(self, make: Callable[[torch.Generator], Batch], seed: int, length: int, rank: int = 0,
                 world: int = 1):
        self.make, self.seed, self.length, self.rank, self.world = make, seed, length, rank, world
        self.start, self._yielded = 0, 0

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Batch]:
        start, self.start = self.start, 0
        for i in range(start, self.length):
            self._yielded = i + 1
            yield self.make(generator(self.seed, "train", i * self.world + self.rank))

    def state_dict(self) -> dict[str, int]:
        return {"next": self._yielded}  # saved after the step that used batch _yielded - 1

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["next"]


class TokenSplit:
    """One split's token ids, in memory (a text's) or in memory-mapped shards (a prepared corpus's).

    A window never crosses from one part into the next; its start is uniform over all parts' starts, so a
    single part draws exactly what one tensor would: `randint(0, len - length - 1)`."""

    def __init__(self, parts: Sequence[np.ndarray]):  # arrays, or np.memmap shards
        self.parts = parts
        self.len = sum(len(p) for p in parts)

    def __len__(self) -> int:
        return self.len

    def fits(self, length: int) -> bool:
        """Whether one window of `length + 1` tokens fits in some part."""
        return any(len(p) > length + 1 for p in self.parts)

    def windows(self, g: torch.Generator, batch: int, length: int) -> torch.Tensor:
        """(batch, length + 1) ids: random windows, drawn from `g` alone."""
        starts = np.cumsum([0] + [max(0, len(p) - length - 1) for p in self.parts])
        draws = torch.randint(0, int(starts[-1]), (batch,), generator=g).numpy()
        which = np.searchsorted(starts, draws, side="right") - 1
        rows = [self.parts[k][s:s + length + 1] for k, s in zip(which, draws - starts[which], strict=True)]
        return torch.from_numpy(np.stack(rows).astype(np.int64))


def data_fingerprint(source: str, content: bytes) -> dict[str, str]:
    """What a run trained on, recorded in summary.json and each checkpoint: where it came from, in words, and the
    sha256 of its content. A sweep continued in its directory, and a resume, compare it (zoo.training.run_dir)."""
    return {"source": source, "sha256": hashlib.sha256(content).hexdigest()}


class ZooData(L.LightningDataModule):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """Shared by every data kind: `objective` turns raw examples into a lineage's batches."""

    tokenizer: Tokenizer
    fingerprint: dict[str, str]  # data_fingerprint(): set by each kind once it has read its data
    is_task = False

    def __init__(self, cfg: DataOptions, seed: int, steps: int):
        super().__init__()
        self.cfg, self.seed, self.steps = cfg, seed, steps
        self.batch_size = _positive("batch_size", cfg.batch_size)
        if isinstance(cfg, WindowOptions):
            _positive("context", cfg.context)
            if cfg.long_context is not None:  # optional: null turns it off
                _positive("long_context", cfg.long_context)
        self.objective: Objective | None = None  # set by the training run once the model is known

    def _objective(self) -> Objective:
        assert self.objective is not None, "the training run sets data.objective before it asks for batches"
        return self.objective

    def required_len(self) -> int:
        """The longest sequence the model will see (sizes learned positions)."""
        raise NotImplementedError

    def train_batch(self, g: torch.Generator) -> Batch:
        raise NotImplementedError

    @property
    def val_batches(self) -> list[Batch]:
        raise NotImplementedError

    @property
    def long_val_batches(self) -> list[Batch]:
        """Text data with data.long_context: validation at a longer length; none by default."""
        return []

    def train_dataloader(self) -> StepLoader:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        return StepLoader(self.train_batch, self.seed, self.steps, rank, world)

    def val_dataloader(self) -> DataLoader:
        # Its own generator: creating the iterator draws a seed, which must not move the global
        # random state (dropout), or a run resumed after an evaluation would differ from one that was not.
        return DataLoader(self.val_batches, batch_size=None, shuffle=False, generator=torch.Generator())


class WindowData(ZooData):
    """Text data of any source: random training windows of `context + 1` tokens from `train_tokens`, fixed
    validation windows from `val_tokens`; every lineage's objective turns windows into its batches."""

    train_tokens: TokenSplit
    val_tokens: TokenSplit
    tokens_per_char: float

    def _make_val_windows(self, cfg: WindowOptions) -> None:
        assert cfg.context is not None  # ZooData.__init__ refused one that is not a positive integer
        self.context = cfg.context
        for split, tokens in (("train", self.train_tokens), ("validation", self.val_tokens)):
            if not tokens.fits(self.context):
                raise DataError(f"data: the {split} split has {len(tokens)} tokens, too short for one window of "
                                f"data.context={self.context} + 1; use more text or a smaller data.context")
        g = generator(VAL_SEED, "val", 0)
        self.val_windows = [self._windows(self.val_tokens, g) for _ in range(cfg.eval_batches)]
        self.long_context = cfg.long_context  # also evaluated at this length: extrapolation
        self.long_val_windows: list[torch.Tensor] = []
        if self.long_context is not None:
            if not self.val_tokens.fits(self.long_context):
                raise DataError(f"data.long_context: {self.long_context} is not shorter than the validation split "
                                f"({len(self.val_tokens)} tokens)")
            g = generator(VAL_SEED, "val-long", 0)
            self.long_val_windows = [self._windows(self.val_tokens, g, self.long_context)
                                     for _ in range(cfg.eval_batches)]

    def required_len(self) -> int:
        return max(self.context, self.long_context or 0)

    def _windows(self, tokens: TokenSplit, g: torch.Generator, context: int | None = None) -> torch.Tensor:
        return tokens.windows(g, self.batch_size, context or self.context)

    def train_batch(self, g: torch.Generator) -> Batch:
        return self._objective().text_batch(self._windows(self.train_tokens, g), g)

    @property
    def val_batches(self) -> list[Batch]:
        g = generator(VAL_SEED, "val-objective", 0)
        return [self._objective().text_batch(w, g) for w in self.val_windows]

    @property
    def long_val_batches(self) -> list[Batch]:
        g = generator(VAL_SEED, "val-long-objective", 0)
        return [self._objective().text_batch(w, g) for w in self.long_val_windows]


@DATA.register("text")
class TextData(WindowData):
    """A text split 90/10 into train and validation, tokenized in memory (data.tokenizer)."""

    cfg: TextOptions
    def __init__(self, cfg: TextOptions, seed: int, steps: int):
        super().__init__(cfg, seed, steps)
        text = self.read_text()
        self.fingerprint = data_fingerprint(self.source(), text.encode("utf-8", "surrogatepass"))
        train, val = split_text(text, cfg.val_fraction)
        name = cfg.tokenizer
        if name == "bpe":
            self.tokenizer = cached_bpe(train, self._bpe_cache_path(), cfg.vocab_size)
        else:  # char fits the whole text (as nanoGPT does), so validation has no unseen characters
            self.tokenizer = build_tokenizer(name).fit(text)
        self.train_tokens = TokenSplit([self.tokenizer.encode_array(train)])
        self.val_tokens = TokenSplit([self.tokenizer.encode_array(val, errors="replace")])
        self.tokens_per_char = len(self.val_tokens) / len(val)
        self._make_val_windows(cfg)

    def read_text(self) -> str:
        path = self.cfg.path
        return load_default_corpus() if path is None else read_text_file(path)

    def source(self) -> str:
        path = self.cfg.path
        return "the embedded corpus" if path is None else f"data.path '{path}'"

    def _bpe_cache_path(self) -> Path:
        path = self.cfg.path
        if path is None:
            return cache_dir() / "shakespeare.bpe.json"
        return Path(path).with_suffix(Path(path).suffix + ".bpe.json")  # cached next to the data

@DATA.register("hf")
class HFTextData(TextData):
    """A Hugging Face dataset by name (or a local data files builder such as 'text'), joined into one text."""

    cfg: HFOptions  # build_data gives data.kind=hf its options
    def read_text(self) -> str:
        try:
            import datasets
        except ImportError:
            raise DataError(needs("datasets", "hf", "data=hf")) from None
        bound_network()  # the hub and datasets' retries: ZOO_NET_TIMEOUT_S, not forever
        kw = {k: v for k, v in (self.cfg.load_kwargs or {}).items()}
        name, split = self.cfg.dataset, self.cfg.split
        info = datasets.load_dataset_builder(name, **kw).info.splits or {}  # sizes hub datasets declare
        self._refuse_if_big(getattr(info.get(split), "num_bytes", 0) or 0)  # before downloading anything
        ds = datasets.load_dataset(name, split=split, **kw)
        self._refuse_if_big(ds.data.nbytes)  # local files declare no size: the table, memory-mapped, not read
        column = self.cfg.text_column
        if column not in ds.column_names:
            raise DataError(f"data.text_column: '{column}' not in the dataset; valid: {', '.join(ds.column_names)}")
        text = "\n".join(ds[column])
        if not text.strip():
            raise DataError(f"data.dataset: '{self.cfg.dataset}' has no text in column '{column}'")
        return text

    def source(self) -> str:
        return f"data.dataset '{self.cfg.dataset}'"

    def _refuse_if_big(self, size: int) -> None:
        if size > corpus.MAX_TEXT_BYTES:
            files = (self.cfg.load_kwargs or {}).get("data_files")
            args = f"--dataset {self.cfg.dataset}" + (f" --data-files {files}" if isinstance(files, str) else "")
            raise DataError(corpus.too_big(f"data.dataset: '{self.cfg.dataset}'", size, args))

    def _bpe_cache_path(self) -> Path:
        assert self.cfg.dataset is not None  # read_text has loaded it
        return cache_dir() / f"{self.cfg.dataset.replace('/', '_')}.bpe.json"


@DATA.register("tokens")
class TokenData(WindowData):
    """A corpus prepared once by `zoo prepare`: windows read from memory-mapped shards, so memory does not grow
    with the corpus; the tokenizer is rebuilt from the manifest (for the sample and bits per character)."""

    def __init__(self, cfg: TokensOptions, seed: int, steps: int):
        super().__init__(cfg, seed, steps)
        path = cfg.path
        if not isinstance(path, str) or not path:
            raise DataError(f"data.path: the directory {command('prepare')} wrote (data=tokens data.path=<dir>)")
        verify = cfg.verify
        check_verify(verify)
        manifest = read_manifest(path)
        # the manifest names each shard's sha256 (checked by open_shards): its hash stands for the corpus
        self.fingerprint = data_fingerprint(f"data.path '{path}' (its manifest.json)",
                                       json.dumps(manifest, sort_keys=True).encode())
        self.tokenizer = tokenizer_from_state(manifest["tokenizer"])
        if self.tokenizer.vocab_size != manifest["vocab_size"]:
            raise DataError(f"data.path: '{path}' records vocab {manifest['vocab_size']} but its tokenizer has "
                            f"{self.tokenizer.vocab_size}; prepare it again")
        self.train_tokens = TokenSplit(open_shards(path, manifest, "train", verify=verify))
        self.val_tokens = TokenSplit(open_shards(path, manifest, "val", verify=verify))
        val = manifest["splits"]["val"]
        # the end-of-text id after each document counts as one character, as a newline between them would
        self.tokens_per_char = val["tokens"] / (val["characters"] + val["documents"])
        self._make_val_windows(cfg)


@DATA.register("task")
class TaskData(ZooData):
    """A synthetic seq2seq task; validation is in-distribution, test has longer inputs."""

    cfg: TaskOptions
    is_task = True

    def __init__(self, cfg: TaskOptions, seed: int, steps: int):
        super().__init__(cfg, seed, steps)
        name = str(cfg.task)  # a missing one (None) is refused there as unknown, naming the valid tasks
        self.task = get_task(name)
        self.tokenizer = build_tokenizer("char").fit(TASK_ALPHABET)
        # every task preset (conf/data/) sets these; zoo.config.checks.check_data refuses bad ones before a run
        assert cfg.n_train is not None and cfg.n_val is not None and cfg.n_test is not None
        assert cfg.train_len is not None and cfg.test_len is not None
        (train_lo, train_hi), (test_lo, test_hi) = cfg.train_len, cfg.test_len
        splits = task_splits(name, cfg.n_train, cfg.n_val, cfg.n_test,
                             (train_lo, train_hi), (test_lo, test_hi), seed=cfg.seed)
        encode = self.tokenizer.encode
        self.splits = {k: [(encode(s), encode(t)) for s, t in v] for k, v in splits.items()}
        # the examples the task's settings generate: a change of the generator is a change of the data too
        self.fingerprint = data_fingerprint(f"data.task '{cfg.task}'", json.dumps(self.splits).encode())
        self.tokens_per_char = 1.0

    def required_len(self) -> int:
        assert self.cfg.test_len is not None  # __init__ made the test split from it
        return sequence_len(self.task.name, self.cfg.test_len[1])

    def train_batch(self, g: torch.Generator) -> Batch:
        pairs = self.splits["train"]
        idx = torch.randint(0, len(pairs), (self.batch_size,), generator=g).tolist()
        return self._objective().task_batch([pairs[i] for i in idx])

    @property
    def val_batches(self) -> list[Batch]:
        pairs = self.splits["val"]
        return [self._objective().task_batch(pairs[i:i + self.batch_size])
                for i in range(0, len(pairs), self.batch_size)]


def build_data(cfg: DataOptions | Mapping[str, Any], seed: int, steps: int) -> ZooData:
    """The data module of cfg's kind: cfg is the run plan's typed data section, or a plain one (a stored config's,
    a tool's), read typed first (zoo.config.data.data_options)."""
    options = cfg if isinstance(cfg, DataOptions) else data_options(cfg)
    if options.kind not in DATA:
        raise DataError(f"data.kind: unknown '{options.kind}'; valid: {', '.join(DATA.names())}")
    data: ZooData = DATA.get(options.kind)(options, seed, steps)
    return data


def _positive(key: str, value: object) -> int:
    """A size that must be a positive integer (data.batch_size, data.context, ...), or a one-line error naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise DataError(f"data.{key}: must be a positive integer, got {value!r}")
    return value


def bits_per_char(loss: float, tokens_per_char: float) -> float:
    return loss * tokens_per_char / math.log(2)
