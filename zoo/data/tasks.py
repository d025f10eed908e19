"""Synthetic sequence-to-sequence tasks, generated deterministically from a seed.

Each example is a ``(source, target)`` pair of strings over `TASK_ALPHABET` ("0123456789+"), so a
``char`` tokenizer fit on that alphabet covers every task. The "length" of an example is the
number of source digits, except for ``addition`` where it is the number of digits per operand.

`task_splits` holds the test split at strictly longer lengths than train/val, so test accuracy
measures length generalisation (the classic weakness of absolute position embeddings).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from zoo.data.corpus import DataError

TASK_ALPHABET = "0123456789+"
DIGITS = "0123456789"
DEFAULT_TRAIN_LEN = (4, 12)
DEFAULT_TEST_LEN = (13, 16)

Pair = tuple[str, str]


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(DIGITS) for _ in range(n))


def _number(rng: random.Random, n: int) -> int:
    """A number with exactly n digits (no leading zero; 0-9 when n == 1)."""
    return rng.randint(0, 9) if n == 1 else rng.randint(10 ** (n - 1), 10**n - 1)


def _copy(rng: random.Random, n: int) -> Pair:
    s = _digits(rng, n)
    return s, s


def _reverse(rng: random.Random, n: int) -> Pair:
    s = _digits(rng, n)
    return s, s[::-1]


def _sort(rng: random.Random, n: int) -> Pair:
    s = _digits(rng, n)
    return s, "".join(sorted(s))


def _addition(rng: random.Random, n: int) -> Pair:
    a, b = _number(rng, n), _number(rng, n)
    return f"{a}+{b}", str(a + b)


@dataclass(frozen=True)
class Task:
    """A task: how to draw one example of a given length, and how long sources/targets can get."""

    name: str
    description: str
    sample: Callable[[random.Random, int], Pair]
    source_len: Callable[[int], int]  # longest source for a given max length
    target_len: Callable[[int], int]  # longest target for a given max length


TASKS: dict[str, Task] = {
    "addition": Task(
        "addition",
        "source 'a+b' with n-digit operands; target the decimal sum",
        _addition,
        lambda n: 2 * n + 1,
        lambda n: n + 1,
    ),
    "copy": Task("copy", "target = source digits", _copy, lambda n: n, lambda n: n),
    "reverse": Task("reverse", "target = source digits reversed", _reverse, lambda n: n, lambda n: n),
    "sort": Task("sort", "target = source digits in ascending order", _sort, lambda n: n, lambda n: n),
}


def get_task(name: str) -> Task:
    """Look a task up by name; one-line error listing the valid names."""
    if name not in TASKS:
        raise DataError(f"task: unknown '{name}'; valid: {', '.join(sorted(TASKS))}")
    return TASKS[name]


def _check_lengths(min_len: int, max_len: int, what: str = "") -> None:
    if min_len < 1:
        raise DataError(f"task: {what}min_len must be >= 1, got {min_len}")
    if max_len < min_len:
        raise DataError(f"task: {what}max_len must be >= min_len ({min_len}), got {max_len}")


def _generate(
    task: Task, n: int, min_len: int, max_len: int, rng: random.Random, avoid: set[str] | None = None
) -> list[Pair]:
    """Draw n examples with lengths uniform in [min_len, max_len], skipping sources in ``avoid``.

    Avoidance is best effort: after many rejections in a row (a small space that ``avoid`` nearly
    covers), repeats are allowed rather than looping forever.
    """
    out: list[Pair] = []
    rejected = 0
    while len(out) < n:
        pair = task.sample(rng, rng.randint(min_len, max_len))
        if avoid and pair[0] in avoid and rejected < 1000 + 10 * n:
            rejected += 1
            continue
        out.append(pair)
    return out


def _rng(name: str, seed: int, stream: str) -> random.Random:
    # `random` hashes string seeds with SHA-512 (not hash()), so streams are stable across runs
    # regardless of PYTHONHASHSEED, and independent between tasks and splits sharing one seed.
    return random.Random(f"zoo.tasks/{name}/{seed}/{stream}")


def make_task(name: str, n: int, min_len: int, max_len: int, seed: int = 0) -> list[Pair]:
    """``n`` (source, target) pairs of task ``name``; same arguments -> same list."""
    task = get_task(name)
    if n < 1:
        raise DataError(f"task: n must be >= 1, got {n}")
    _check_lengths(min_len, max_len)
    return _generate(task, n, min_len, max_len, _rng(name, seed, "all"))


def task_splits(
    name: str,
    n_train: int,
    n_val: int,
    n_test: int,
    train_len: tuple[int, int] = DEFAULT_TRAIN_LEN,
    test_len: tuple[int, int] = DEFAULT_TEST_LEN,
    seed: int = 0,
) -> dict[str, list[Pair]]:
    """Train/val/test splits: val in-distribution (train lengths, own RNG stream, sources not in
    train where the space allows), test at strictly longer lengths for length generalisation."""
    task = get_task(name)
    if n_train < 1:
        raise DataError(f"task: n_train must be >= 1, got {n_train}")
    if n_val < 0 or n_test < 0:
        raise DataError(f"task: n_val and n_test must be >= 0, got {n_val} and {n_test}")
    (tr_lo, tr_hi), (te_lo, te_hi) = train_len, test_len
    _check_lengths(tr_lo, tr_hi, "train_len ")
    _check_lengths(te_lo, te_hi, "test_len ")
    if te_lo <= tr_hi:
        raise DataError(f"task: test_len must be longer than train_len (test min {te_lo} <= train max {tr_hi})")
    train = _generate(task, n_train, tr_lo, tr_hi, _rng(name, seed, "train"))
    seen = {src for src, _ in train}
    val = _generate(task, n_val, tr_lo, tr_hi, _rng(name, seed, "val"), avoid=seen)
    test = _generate(task, n_test, te_lo, te_hi, _rng(name, seed, "test"))
    return {"train": train, "val": val, "test": test}


def max_source_len(name: str, max_len: int) -> int:
    """Longest source string for lengths up to ``max_len`` (addition: two operands and '+')."""
    return get_task(name).source_len(max_len)


def max_target_len(name: str, max_len: int) -> int:
    """Longest target string for lengths up to ``max_len`` (addition: max_len + 1 for the carry)."""
    return get_task(name).target_len(max_len)


def sequence_len(name: str, max_len: int) -> int:
    """Longest model input for lengths up to ``max_len``: source, separator, target and end token."""
    return max_source_len(name, max_len) + max_target_len(name, max_len) + 2
