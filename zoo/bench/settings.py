"""The shapes timed and the settings of a run: what `python -m zoo.bench`'s flags set."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PEERS = ("zoo", "hf", "xt", "nanogpt")  # the contenders timed, one file each in contenders/ (its BUILDERS)


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    context: int
    n_layers: int
    n_heads: int
    d_model: int
    vocab: int = 65
    n_kv_heads: int = 2  # the Llama-style models' key/value heads

    @property
    def tokens(self) -> int:
        return self.batch * self.context

    def describe(self) -> str:
        return (f"batch {self.batch} x context {self.context}, {self.n_layers} layers, {self.n_heads} heads, "
                f"d_model {self.d_model}, vocab {self.vocab}")


SHAPES = {
    "tiny": Shape("tiny", batch=2, context=16, n_layers=2, n_heads=4, d_model=32),  # tests only
    "small": Shape("small", batch=12, context=64, n_layers=4, n_heads=4, d_model=128),  # nanoGPT's CPU recipe
    "large": Shape("large", batch=8, context=256, n_layers=6, n_heads=6, d_model=384),
    # experiment=gpt2_small: GPT-2 small's micro-batch (nanoGPT's batch 12) with its vocabulary
    "gpt2_small": Shape("gpt2_small", batch=12, context=1024, n_layers=12, n_heads=12, d_model=768, vocab=50257),
}


@dataclass
class Settings:
    shapes: tuple[str, ...] = ("small", "large")
    peers: tuple[str, ...] = PEERS
    warmup: int = 3
    min_rounds: int = 7
    max_rounds: int = 60
    target_s: float = 3.0  # timed seconds per contender and group, within [min_rounds, max_rounds]
    gen_shape: str = "large"
    gen_contexts: tuple[int, ...] = (64, 128, 256, 512, 1024)
    gen_new_tokens: int = 16
    gen_rounds: int = 7
    kv_context: int = 1024
    matmul_n: int = 2048
    matmul_repeats: int = 10
    memory_steps: int = 3
    overhead_steps: int = 200
    precision_steps: int = 150
    text: Path | None = None  # the ttt section's corpus: a text file (nanoGPT's tinyshakespeare for its figures)
    ttt_pairs: int = 3
    ttt_target: float | None = None  # None: nanoGPT's own final val loss on the file (median of its rounds)
    ttt_margin: float = 0.0  # zoo's contenders are timed to the target less this; nanoGPT to the target
    ttt_steps: int | None = None  # None: the recipe's 2000; a smoke run shortens both sides
    ttt_runs: tuple[str, ...] | None = None  # zoo's contenders (keys of sections.ttt.TTT_RUNS); None: all of them
    convert_llama: str = "1b"  # a key of CONVERT_LLAMAS
    attention_lengths: tuple[int, ...] = (64, 128, 192, 256, 512, 768, 1024)  # key lengths of the choices section
    train_args: tuple[str, ...] = ()
    nanogpt: Path | None = None
    threads: int | None = None  # torch.set_num_threads; None leaves torch's default
    quick: bool = False
    device: str = "cpu"  # cuda: models, batches and the matmul peak on the GPU (the mfu section)
    peak_tflops: float | None = None  # a datasheet's dense bf16 peak: the mfu section adds MFU against it

    @classmethod
    def quick_run(cls, **over) -> Settings:
        """Few steps everywhere: a smoke run, not a measurement."""
        base = dict(warmup=1, min_rounds=3, max_rounds=3, target_s=0.0, gen_contexts=(64, 128, 256),
                    gen_new_tokens=4, gen_rounds=2, kv_context=256, matmul_n=1024, matmul_repeats=3,
                    memory_steps=1, overhead_steps=20, precision_steps=4, ttt_pairs=1, ttt_steps=20,
                    ttt_target=10.0, convert_llama="tiny", attention_lengths=(8, 16),
                    quick=True)  # a smoke run cannot reach a real loss target
        return cls(**{**base, **over})
