"""A prepared corpus (written by `zoo.prepare`): flat token shards and the manifest.json that describes them.

    <dir>/manifest.json          source, tokenizer state, vocab size, dtype, token counts, sha256 checksums
    <dir>/train_000000.bin ...   token ids of the training documents, each followed by the end-of-text id
    <dir>/val_000000.bin ...     the same for the validation documents
    <dir>/.zoo-prepare.lock      held while zoo-prepare writes the directory

A shard is a bare little-endian array (uint16 when the vocabulary has fewer than 65,536 ids, else uint32),
so `np.memmap` reads any part of it without loading the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from zoo.data.corpus import DataError

FORMAT = "zoo-tokens/1"
MANIFEST = "manifest.json"
SPLITS = ("train", "val")


def dtype_for(vocab_size: int) -> str:
    """The smallest unsigned integer type that holds every id."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def shard_name(split: str, index: int) -> str:
    return f"{split}_{index:06d}.bin"


def read_manifest(path: str | Path, key: str = "data.path") -> dict[str, Any]:
    """The manifest of a finished prepared corpus; one-line errors naming `key` for anything else."""
    root = Path(path).expanduser()
    file = root / MANIFEST
    if not root.is_dir():
        raise DataError(f"{key}: no prepared corpus at '{root}' (not a directory); make one with "
                        f"zoo-prepare <text files> --out {root}")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{key}: '{root}' has no {MANIFEST}; make a prepared corpus with "
                        f"zoo-prepare <text files> --out {root}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{key}: cannot read '{file}': {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{key}: '{file}' is not a zoo-prepare manifest ({FORMAT})")
    if not manifest.get("complete"):
        raise DataError(f"{key}: '{root}' is only partly prepared; rerun the zoo-prepare command to finish it")
    return manifest


def open_shards(path: str | Path, manifest: dict[str, Any], split: str, key: str = "data.path") -> list[np.memmap]:
    """Memory maps of a split's non-empty shards, in order; sizes checked against the manifest (cheap),
    checksums not (`zoo-prepare` verifies those when it reruns)."""
    root, dtype = Path(path).expanduser(), np.dtype(manifest["dtype"])
    maps = []
    for shard in manifest["shards"]:
        entry = shard[split]
        if not entry["tokens"]:
            continue
        file = root / entry["file"]
        expected = entry["tokens"] * dtype.itemsize
        if not file.is_file() or file.stat().st_size != expected:
            raise DataError(f"{key}: shard '{file}' is missing or not {expected} bytes; rerun zoo-prepare to "
                            "repair the corpus")
        maps.append(np.memmap(file, dtype=dtype, mode="r"))
    return maps
