"""What verifying a prepared corpus costs (zoo.data.tokens.open_shards, data.verify): a corpus of random token ids
written with zoo's own shard writer, then its shards opened with each policy, cold (its pages dropped from the
page cache) and warm. Deletes the corpus at the end.

    python scripts/bench_shard_verify.py --tokens 500e6 --out /tmp/verify-bench
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def make_corpus(out: Path, tokens: int, shard_tokens: int, vocab: int) -> None:
    from zoo.data.tokens import FORMAT, MANIFEST, dtype_for, write_shard
    from zoo.io import atomic_write_json

    rng, dtype, shards, left = np.random.default_rng(0), dtype_for(vocab), [], tokens
    for index in range(-(-tokens // shard_tokens)):
        n = min(shard_tokens, left)
        left -= n
        ids = rng.integers(0, vocab, n, dtype=dtype)
        train = {"tokens": n, "documents": 1, "characters": n, "bytes": n, **write_shard(out, "train", index, ids)}
        val = {"tokens": 0, "documents": 0, "characters": 0, "bytes": 0, "file": None, "sha256": None}
        if index == 0:  # one small validation shard
            v = rng.integers(0, vocab, 4096, dtype=dtype)
            val = {"tokens": 4096, "documents": 1, "characters": 4096, "bytes": 4096, **write_shard(out, "val", 0, v)}
        shards.append({"index": index, "text_sha256": "", "train": train, "val": val})
    splits = {s: {k: sum(r[s][k] for r in shards) for k in ("tokens", "documents", "characters", "bytes")}
              for s in ("train", "val")}
    atomic_write_json(out / MANIFEST, {"format": FORMAT, "complete": True, "plan": {}, "tokenizer": {"name": "none"},
                                       "vocab_size": vocab, "dtype": dtype, "eot_id": 2, "splits": splits,
                                       "shards": shards})


def drop_from_page_cache(out: Path) -> None:
    """Only this corpus's pages (posix_fadvise), so the next read comes from the disk."""
    for p in out.glob("*.bin"):
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def timed(label: str, fn, size: int) -> None:
    t = time.perf_counter()
    fn()
    s = time.perf_counter() - t
    print(f"{label:<44} {s:8.3f} s  {size / s / 1e6:9.0f} MB/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=float, default=500e6)
    p.add_argument("--shard-tokens", type=float, default=32e6, help="tokens per shard (64 MB of uint16)")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--out", default=None, help="a new directory (default: a temp directory)")
    a = p.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="verify-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ["ZOO_CACHE"] = str(out / "cache")  # a record of this corpus alone, deleted with it
    from zoo.data.tokens import open_shards, read_manifest

    try:
        t = time.perf_counter()
        make_corpus(out, int(a.tokens), int(a.shard_tokens), a.vocab)
        m = read_manifest(out)
        size = sum(f.stat().st_size for f in out.glob("*.bin"))
        print(f"corpus: {int(a.tokens):,} tokens, {len(m['shards'])} shards, {size / 1e9:.2f} GB, written in "
              f"{time.perf_counter() - t:.1f} s")
        block = os.urandom(1 << 24)
        timed("sha256 alone (hashlib, 16 MB blocks in memory)", lambda: [hashlib.sha256(block).digest()
                                                                          for _ in range(32)], 32 << 24)

        def open_all(verify: str) -> None:
            for split in ("train", "val"):
                open_shards(out, m, split, verify=verify)

        drop_from_page_cache(out)
        timed("verify=always, cold (from disk)", lambda: open_all("always"), size)
        timed("verify=always, warm (page cache)", lambda: open_all("always"), size)
        drop_from_page_cache(out)
        timed("verify=once, first open (cold; records)", lambda: open_all("once"), size)
        timed("verify=once, repeated open (stat only)", lambda: open_all("once"), size)
        timed("verify=never (sizes only)", lambda: open_all("never"), size)
    finally:
        shutil.rmtree(out)


if __name__ == "__main__":
    main()
