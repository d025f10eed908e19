"""Synthetic seq2seq tasks: determinism, target correctness, length splits, errors."""

from __future__ import annotations

import pytest

from zoo.data import (
    TASK_ALPHABET,
    TASKS,
    CharTokenizer,
    DataError,
    make_task,
    max_source_len,
    max_target_len,
    task_splits,
)

ALL = sorted(TASKS)


def _length(name: str, src: str) -> int:
    """Recompute an example's length: operand digits for addition, else source digits."""
    if name == "addition":
        a, b = src.split("+")
        assert len(a) == len(b)
        return len(a)
    return len(src)


def _check_target(name: str, src: str, tgt: str) -> None:
    """Independent reference implementation of every task."""
    if name == "copy":
        assert tgt == src
    elif name == "reverse":
        assert tgt == "".join(reversed(src))
    elif name == "sort":
        assert list(tgt) == sorted(src, key=int)
    elif name == "addition":
        a, b = src.split("+")
        assert int(tgt) == int(a) + int(b)
        for num in (a, b, tgt):
            assert num == "0" or not num.startswith("0")  # no leading zeros
    else:
        raise AssertionError(f"no reference for {name}")


def test_registry_and_alphabet():
    assert ALL == ["addition", "copy", "reverse", "sort"]
    assert TASK_ALPHABET == "0123456789+"


@pytest.mark.parametrize("name", ALL)
def test_targets_are_correct(name):
    pairs = make_task(name, 300, 1, 10, seed=3)
    assert len(pairs) == 300
    for src, tgt in pairs:
        assert isinstance(src, str) and isinstance(tgt, str)
        assert set(src + tgt) <= set(TASK_ALPHABET)
        assert "+" not in tgt
        assert 1 <= _length(name, src) <= 10
        _check_target(name, src, tgt)


@pytest.mark.parametrize("name", ALL)
def test_deterministic_from_seed(name):
    assert make_task(name, 50, 2, 8, seed=7) == make_task(name, 50, 2, 8, seed=7)
    assert make_task(name, 50, 2, 8, seed=7) != make_task(name, 50, 2, 8, seed=8)
    assert task_splits(name, 20, 10, 10, seed=1) == task_splits(name, 20, 10, 10, seed=1)
    assert task_splits(name, 20, 10, 10, seed=1) != task_splits(name, 20, 10, 10, seed=2)


@pytest.mark.parametrize("name", ALL)
def test_lengths_cover_the_range(name):
    lengths = {_length(name, s) for s, _ in make_task(name, 400, 3, 6, seed=0)}
    assert lengths == {3, 4, 5, 6}


@pytest.mark.parametrize("name", ALL)
def test_splits_test_is_longer(name):
    splits = task_splits(name, 200, 50, 50, seed=0)
    assert {k: len(v) for k, v in splits.items()} == {"train": 200, "val": 50, "test": 50}
    train_lens = [_length(name, s) for s, _ in splits["train"]]
    val_lens = [_length(name, s) for s, _ in splits["val"]]
    test_lens = [_length(name, s) for s, _ in splits["test"]]
    assert min(train_lens) >= 4 and max(train_lens) <= 12
    assert min(val_lens) >= 4 and max(val_lens) <= 12
    assert min(test_lens) > max(train_lens)
    assert 13 <= min(test_lens) and max(test_lens) <= 16
    for split in splits.values():
        for src, tgt in split:
            _check_target(name, src, tgt)


def test_val_does_not_repeat_train_sources():
    splits = task_splits("copy", 500, 200, 10, seed=0)
    train_sources = {s for s, _ in splits["train"]}
    assert not train_sources & {s for s, _ in splits["val"]}
    # Even a tiny space (1-digit copy: 10 sources) terminates, allowing repeats once exhausted.
    small = task_splits("copy", 20, 5, 1, train_len=(1, 1), test_len=(2, 2))
    assert len(small["val"]) == 5


def test_custom_split_lengths():
    splits = task_splits("addition", 10, 5, 5, train_len=(1, 3), test_len=(5, 6), seed=4)
    assert all(1 <= _length("addition", s) <= 3 for s, _ in splits["train"])
    assert all(5 <= _length("addition", s) <= 6 for s, _ in splits["test"])


@pytest.mark.parametrize("name", ALL)
def test_max_lengths_bound_examples(name):
    pairs = make_task(name, 500, 1, 7, seed=0)
    assert max(len(t) for _, t in pairs) <= max_target_len(name, 7)
    assert max(len(s) for s, _ in pairs) <= max_source_len(name, 7)
    expected = 8 if name == "addition" else 7
    assert max_target_len(name, 7) == expected
    assert max_source_len(name, 7) == (15 if name == "addition" else 7)


def test_addition_carry_reaches_max_target_len():
    pairs = make_task("addition", 200, 3, 3, seed=0)
    assert max(len(t) for _, t in pairs) == max_target_len("addition", 3) == 4


def test_char_tokenizer_over_alphabet_covers_tasks():
    tok = CharTokenizer().fit(TASK_ALPHABET)
    assert tok.vocab_size == tok.n_special + len(TASK_ALPHABET)
    for name in ALL:
        for src, tgt in make_task(name, 50, 1, 16, seed=0):
            assert tok.decode(tok.encode(src + tgt)) == src + tgt


def test_unknown_task_lists_names():
    with pytest.raises(DataError) as err:
        make_task("mult", 5, 1, 3, seed=0)
    assert str(err.value) == "task: unknown 'mult'; valid: addition, copy, reverse, sort"
    with pytest.raises(DataError, match="valid: addition, copy, reverse, sort"):
        task_splits("mult", 5, 1, 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": 0, "min_len": 1, "max_len": 3}, "n must be >= 1"),
        ({"n": 5, "min_len": 0, "max_len": 3}, "min_len must be >= 1"),
        ({"n": 5, "min_len": 4, "max_len": 3}, "max_len must be >= min_len"),
    ],
)
def test_make_task_validation(kwargs, match):
    with pytest.raises(DataError, match=match):
        make_task("copy", seed=0, **kwargs)


def test_splits_validation():
    with pytest.raises(DataError, match="test_len must be longer"):
        task_splits("copy", 10, 5, 5, train_len=(4, 12), test_len=(12, 16))
    with pytest.raises(DataError, match="n_train must be >= 1"):
        task_splits("copy", 0, 5, 5)
    with pytest.raises(DataError, match="train_len max_len must be >= min_len"):
        task_splits("copy", 10, 5, 5, train_len=(5, 4))
