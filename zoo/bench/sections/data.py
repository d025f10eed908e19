"""The data section: `zoo-prepare` throughput against the tokenizer's own batch encode, and data=tokens batches per
second against a training step at the GPT-2 small shape."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

import zoo
from zoo.bench.contenders import zoo_config
from zoo.bench.markdown import ms, num, ratio, table
from zoo.bench.registry import section
from zoo.bench.session import Session, Variant, make_train_run
from zoo.bench.settings import SHAPES, Settings, Shape
from zoo.bench.timing import time_call
from zoo.data import load_default_corpus
from zoo.data.tokenizers import tokenizer_from_state
from zoo.prepare import documents, prepare
from zoo.training.objectives import OBJECTIVE

GPT2_SMALL = SHAPES["gpt2_small"]
# A GPU step of that shape for scale, computed (no GPU here): bf16 at 40% of an H100's dense peak, the issue's
# MFU target. The loader must produce a batch in a tenth of it.
GPU_FLOPS, GPU_LABEL = 0.4 * 989e12, "H100 bf16 at 40% MFU (989 TFLOP/s peak)"


def _prepare_round(src: Path, out: Path, spec: str, vocab: int, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    return prepare([str(src)], out, spec, vocab_size=vocab, bpe_sample_mb=5.0, sample_by="paragraph",
                   val_fraction=0.01, shard_mb=4.0, workers=workers, progress=False)


@section("data")
def section_data(sess: Session) -> str:
    """zoo-prepare against the tokenizer alone; data=tokens batches against a training step."""
    from zoo.training.data import build_data, generator  # lazy: Lightning (start-up 10 s) only for this section

    s = sess.settings
    text = load_default_corpus()[:300_000] if s.quick else load_default_corpus() * 4
    rounds = 1 if s.quick else 3
    cores = os.cpu_count() or 1
    counts = (1,) if s.quick or cores == 1 else (1, cores)  # quick: no process start-up, a smoke run
    copies = "" if s.quick else " four times over"
    out = ["## Data: zoo-prepare and data=tokens", "",
           f"`zoo-prepare` on the embedded corpus{copies} ({len(text.encode()) / 1e6:.1f} MB, one document per "
           "paragraph), in this process (`--workers 1`) and with one worker process per core, against the same "
           "tokenizer encoding the same documents by itself in this process: byte-level BPE (`bpe`, Hugging Face "
           "`tokenizers`, whose batch encode uses every core) and `char` (Python, one process). Prepare time is the "
           "encode phase: reading, splitting, encoding, writing the shards with checksums, starting the workers; "
           "the tokenizer's fitting (BPE training on 5 MB, the char alphabet scan) is given apart. Median of "
           f"{rounds} rounds, alternated.", ""]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "corpus.txt"
        src.write_text(text)
        for spec, vocab in (("bpe", 512 if s.quick else 8192), ("char", 0)):
            prep, base, fit = {n: [] for n in counts}, [], []
            for _ in range(rounds):
                for n in counts:
                    r = _prepare_round(src, Path(tmp) / spec, spec, vocab, n)
                    prep[n].append(r["seconds"])
                    fit.append(r["fit_seconds"])
                m = r["manifest"]
                tok = tokenizer_from_state(m["tokenizer"])
                docs = list(documents(m["plan"]["source"]))
                base.append(time_call(lambda tok=tok, docs=docs: tok.encode_batch(docs)))
            size = sum(m["splits"][k]["bytes"] for k in ("train", "val"))
            tokens = sum(m["splits"][k]["tokens"] for k in ("train", "val"))
            b = statistics.median(base)
            for n in counts:
                p = statistics.median(prep[n])
                rows.append([spec, m["vocab_size"], m["dtype"], num(tokens), n, f"{size / p / 1e6:.2f}",
                             num(tokens / p), f"{size / b / 1e6:.2f}", num(tokens / b), ratio(p / b),
                             f"{statistics.median(fit):.1f}"])
        out += [table(["tokenizer", "vocab", "dtype", "tokens", "workers", "prepare MB/s", "prepare tokens/s",
                       "tokenizer MB/s", "tokenizer tokens/s", "prepare time / tokenizer time", "fit s"], rows), ""]

        shape = GPT2_SMALL if not s.quick else replace(GPT2_SMALL, n_layers=1, n_heads=2, d_model=64, vocab=512)
        loader_rows = []
        d = build_data({"kind": "tokens", "path": str(Path(tmp) / "bpe"), "context": shape.context,
                        "batch_size": shape.batch, "eval_batches": 1}, 0, 1)
        step_s = _gpt2_step_seconds(shape, s)
        gpu_s = zoo.flops_per_token(zoo_config(shape, "gpt2"), shape.context)["train"] * shape.tokens / GPU_FLOPS
        for lineage in ("decoder_only", "encoder_only", "encoder_decoder"):
            d.objective = OBJECTIVE.get(lineage)(shape.vocab)
            draws = range(20 if s.quick else 200)
            times = [time_call(lambda i=i: d.train_batch(generator(0, "train", i))) for i in draws]
            t = statistics.median(times)
            loader_rows.append([lineage, ms(t), num(1 / t), ratio(step_s / t), ratio(gpu_s / t)])
    out += [f"data=tokens at the GPT-2 small shape ({shape.describe()}): one training batch read from the "
            "memory-mapped uint16 shards of the bpe corpus above and made into the lineage's batch (`train_batch`, "
            f"what the training loop waits for), median of {len(times)}, one thread. The step it feeds: zoo's GPT-2 "
            "small training step (forward, backward, AdamW; float32, eager) measured on this CPU at batch 1 and "
            f"multiplied by the batch, {step_s:.1f} s (batch {shape.batch} does not fit beside the other jobs on "
            f"this machine); and, for the fastest step, one computed for a GPU, {GPU_LABEL}: {gpu_s * 1e3:.1f} ms. "
            "The last two columns are step time over batch time: the loader keeps up when it is at least 10x.", "",
            table(["objective", "batch ms", "batches/s", f"CPU step ({step_s:.0f} s) / batch",
                   f"GPU step ({gpu_s * 1e3:.0f} ms) / batch"], loader_rows), ""]
    return "\n".join(out)


def _gpt2_step_seconds(shape: Shape, s: Settings) -> float:
    """A training step of the shape at batch 1, times the batch (the fastest of two after a warm-up)."""
    run = make_train_run(replace(shape, batch=1), Variant("zoo", "gpt2"), s)
    run.step()
    return shape.batch * min(time_call(run.step) for _ in range(1 if s.quick else 2))
