"""`python -m zoo.bench`: zoo's speed and memory against peer implementations, written to Markdown.

Sections (pick with `--only train,compile,...`; default: all):

- train     training step (forward + backward + AdamW step) of zoo's GPT-2-style and Llama-style models
            against Hugging Face `GPT2LMHeadModel` / `LlamaForCausalLM`, x-transformers and (with
            `--nanogpt PATH`) nanoGPT, all of the same shape, random weights, dropout 0;
- compile   zoo with torch.compile, bf16 autocast and both, as ratios to zoo float32 eager (and
            nanoGPT float32 / bf16 / compile+bf16 when given);
- generate  per-token decoding latency with and without the KV cache at growing contexts;
- kv        KV-cache bytes of MHA, GQA, MQA and MLA, checked against each attention's cache_bytes_per_token
            (2 * n_kv * hd * bytes for MHA/GQA/MQA; (kv_rank + rope_dim) * bytes for MLA's latent);
- norm      LayerNorm against RMSNorm, one layer forward + backward;
- mfu       achieved FLOP/s of zoo's training steps over a matrix-multiply peak measured in the same run;
            with `--device cuda` (the only section that runs there) on a GPU, at any shape, e.g.
            `--shapes gpt2_small`, adding bf16 + torch.compile, the way trainer=gpu compile=true trains;
- profile   where zoo's training step spends its time (torch.profiler, operators in groups), float32 and bf16,
            and bf16 compiled;
- memory    peak RSS growth of three training steps, one subprocess per contender;
- overhead  `train.py` against a bare PyTorch loop (skipped while train.py does not exist);
- precision a short train.py run at the large shape in float32 and bf16-mixed: validation loss and speed;
- ttt       time to a target validation loss: zoo's train.py against nanoGPT's own train.py on the same text file
            (`--text PATH`, e.g. tinyshakespeare) and the same recipe, back to back, from process start;
- choices   the rows behind zoo.hardware's rules on this CPU kind: low-precision attention on the fused kernel
            against the written-out form (whole models and attention alone by key length), the written-out
            form's softmax under torch.compile (zoo's kernel against inductor's fusion), and AdamW's
            for-loop, foreach and fused kernels (fp32 parameters), each against what the rule picks here;
- data      `zoo-prepare` throughput against the tokenizer's own batch encode (byte-level BPE and char), and
            data=tokens batches per second at the GPT-2 small shape against a training step at that shape.
- convert   peak memory and time of `zoo.convert.from_pretrained` on a random ~1B-parameter Llama saved in
            bf16 safetensors (straight onto the meta device), against transformers' from_pretrained + convert.

Timing: every contender is warmed up, then the contenders of a group run round-robin (A B C A B C ...,
the starting contender rotating each round), so slow drifts of a shared, noisy machine hit all of them
alike. Tables give the median and the interquartile range (q3 - q1); ratios are of medians measured in
the same group. Peers are imported lazily; a missing one is reported as "not installed".

torch's intra-op thread count is left at its default unless `--threads N` is given. On a small machine
shared with other jobs, the default (one thread per core) slows down many-fold whenever another process
runs, while `--threads 1` barely does; each section records the load average so a disturbed run shows.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo.generate import generate
from zoo.io import atomic_write_text
from zoo.layers.ffn import default_d_ff

SECTIONS = ("train", "compile", "generate", "kv", "norm", "mfu", "profile", "memory", "overhead", "precision", "ttt",
            "choices", "data", "convert")
# Sections of timings: their figures belong to the kind of processor they ran on, so each kind keeps its own copy,
# the heading naming it ("## Training step (AMX)"), and a run on one kind replaces only that kind's copy. The others
# count bytes (kv, memory, convert), which do not depend on it.
PER_KIND = frozenset(SECTIONS) - {"kv", "memory", "convert"}
PEERS = ("zoo", "hf", "xt", "nanogpt")
ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------
# Shapes, settings, statistics


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
    ttt_target: float = 1.886  # the val loss nanoGPT's Shakespeare-char CPU recipe ends at (its README: ~1.88)
    ttt_steps: int | None = None  # None: the recipe's 2000; a smoke run shortens both sides
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


@dataclass
class Stats:
    times: list[float]  # seconds

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def iqr(self) -> float:
        if len(self.times) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times, n=4, method="inclusive")
        return q3 - q1


def time_call(fn: Callable[[], object]) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def _sync() -> None:
    """Wait for the GPU's queued work, so a time covers it (nothing to do where CUDA was never used)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def interleave(fns: dict[str, Callable[[], object]], s: Settings) -> dict[str, Stats]:
    """Warm each function up, then run them round-robin; per-call times in seconds. The number of rounds
    gives the slowest function about s.target_s seconds, within [s.min_rounds, s.max_rounds]."""
    est = {}
    for name, fn in fns.items():
        for _ in range(max(1, s.warmup)):
            est[name] = time_call(fn)
    rounds = s.min_rounds
    if s.target_s > 0 and est:
        rounds = min(s.max_rounds, max(s.min_rounds, math.ceil(s.target_s / max(max(est.values()), 1e-6))))
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(time_call(fns[name]))
    return {n: Stats(t) for n, t in times.items()}


# ----------------------------------------------------------------------------------------------
# Contenders: one function per implementation that builds a model of a shape and returns its loss


def zoo_config(shape: Shape, family: str, max_seq_len: int | None = None) -> dict:
    base = dict(name="decoder_only", vocab_size=shape.vocab, d_model=shape.d_model, n_layers=shape.n_layers,
                n_heads=shape.n_heads, max_seq_len=max_seq_len or shape.context, dropout=0.0)
    if family == "gpt2":  # learned positions, pre-LN LayerNorm, GELU, MHA, biases, tied head
        return base
    return {**base, "bias": False, "tie_embeddings": False,  # Llama: RoPE, pre-RMSNorm, SwiGLU, GQA
            "attention": {"name": "gqa", "n_kv_heads": shape.n_kv_heads}, "position": {"name": "rope"},
            "norm": {"type": "rmsnorm"}, "ffn": {"name": "swiglu"}}


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, the same for every contender (nanoGPT computes this very call)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class NotInstalled(RuntimeError):
    pass


def _require(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise NotInstalled(f"not installed ({module})") from e


def zoo_model(cfg: dict) -> nn.Module:
    """zoo's model as train.py runs it: built, then zoo.kernels' pass with its default policy (auto)."""
    from zoo.kernels import apply_kernels

    model = zoo.build_model(cfg)
    apply_kernels(model, "auto")
    return model


def build_zoo(shape: Shape, family: str, s: Settings):
    model = zoo_model(zoo_config(shape, family))
    return model, lambda m, x, y: lm_loss(m(x), y)


def build_hf(shape: Shape, family: str, s: Settings):
    tf = _require("transformers")
    common = dict(vocab_size=shape.vocab, use_cache=False, attn_implementation="sdpa", bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = tf.GPT2Config(n_positions=shape.context, n_embd=shape.d_model, n_layer=shape.n_layers,
                            n_head=shape.n_heads, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=True, **common)
        model = tf.GPT2LMHeadModel(cfg)
    else:
        d_ff = default_d_ff(shape.d_model, gated=True)
        cfg = tf.LlamaConfig(hidden_size=shape.d_model, intermediate_size=d_ff, num_hidden_layers=shape.n_layers,
                             num_attention_heads=shape.n_heads, num_key_value_heads=shape.n_kv_heads,
                             max_position_embeddings=shape.context, rms_norm_eps=1e-5, attention_bias=False,
                             mlp_bias=False, attention_dropout=0.0, tie_word_embeddings=False, **common)
        model = tf.LlamaForCausalLM(cfg)
    return model, lambda m, x, y: lm_loss(m(input_ids=x).logits, y)


def build_xt(shape: Shape, family: str, s: Settings):
    xt = _require("x_transformers")
    torch.manual_seed(0)
    head_dim = shape.d_model // shape.n_heads
    if family == "gpt2":  # x-transformers has no biases in attention and LayerNorm: a few params fewer
        layers = xt.Decoder(dim=shape.d_model, depth=shape.n_layers, heads=shape.n_heads, attn_dim_head=head_dim,
                            attn_flash=True, ff_mult=4)
        model = xt.TransformerWrapper(num_tokens=shape.vocab, max_seq_len=shape.context, attn_layers=layers,
                                      tie_embedding=True)
    else:
        d_ff = default_d_ff(shape.d_model, gated=True)
        layers = xt.Decoder(dim=shape.d_model, depth=shape.n_layers, heads=shape.n_heads, attn_dim_head=head_dim,
                            attn_flash=True, rotary_pos_emb=True, use_rmsnorm=True, ff_glu=True, ff_swish=True,
                            ff_no_bias=True, attn_kv_heads=shape.n_kv_heads, ff_mult=(d_ff + 0.5) / shape.d_model)
        model = xt.TransformerWrapper(num_tokens=shape.vocab, max_seq_len=shape.context, attn_layers=layers,
                                      use_abs_pos_emb=False, tie_embedding=False)
    return model, lambda m, x, y: lm_loss(m(x), y)


def load_nanogpt(path: Path):
    """nanoGPT's model.py imported from a checkout at run time (nothing of it lives in zoo)."""
    path = Path(path).expanduser().resolve()
    file = path / "model.py"
    if not file.is_file():
        raise NotInstalled(f"no model.py in {path}")
    name = "zoo_bench_nanogpt_model"
    if name not in sys.modules:
        sys.path.insert(0, str(path))
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def build_nanogpt(shape: Shape, family: str, s: Settings):
    if s.nanogpt is None:
        raise NotInstalled("not given (--nanogpt PATH)")
    if family != "gpt2":
        raise NotInstalled("GPT-2 style only")
    ng = load_nanogpt(s.nanogpt)
    cfg = ng.GPTConfig(block_size=shape.context, vocab_size=shape.vocab, n_layer=shape.n_layers,
                       n_head=shape.n_heads, n_embd=shape.d_model, dropout=0.0, bias=True)
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        model = ng.GPT(cfg)
    return model, lambda m, x, y: m(x, y)[1]  # its loss is lm_loss's call on the full logits


BUILDERS = {"zoo": build_zoo, "hf": build_hf, "xt": build_xt, "nanogpt": build_nanogpt}
LABELS = {"zoo": "zoo", "hf": "HF transformers", "xt": "x-transformers", "nanogpt": "nanoGPT"}
FAMILY_LABELS = {"gpt2": "GPT-2 style", "llama": "Llama style"}


@dataclass(frozen=True)
class Variant:
    peer: str
    family: str
    bf16: bool = False
    compile: bool = False

    @property
    def key(self) -> str:
        return "-".join([self.peer, self.family, *(["compile"] if self.compile else []),
                         *(["bf16"] if self.bf16 else [])])

    @property
    def mode(self) -> str:
        return {(False, False): "fp32 eager", (False, True): "bf16 eager", (True, False): "fp32 compile",
                (True, True): "bf16 compile"}[(self.compile, self.bf16)]

    @classmethod
    def parse(cls, key: str) -> Variant:
        parts = key.split("-")
        return cls(parts[0], parts[1], bf16="bf16" in parts[2:], compile="compile" in parts[2:])


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def batch(shape: Shape, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, shape.vocab, (shape.batch, shape.context + 1), generator=g)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


@dataclass
class TrainRun:
    variant: Variant
    params: int
    step: Callable[[], float]


def make_train_run(shape: Shape, v: Variant, s: Settings) -> TrainRun:
    """A model, AdamW and one fixed batch; `step()` runs forward + backward + optimizer step."""
    model, loss_of = BUILDERS[v.peer](shape, v.family, s)
    model.to(s.device).train()
    params = n_params(model)
    from zoo.hardware import adamw_implementation

    # AdamW as train.py takes it with optim.fused=null, for every contender: fused on a GPU, and on CPU in bf16
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, **adamw_implementation(
        None, torch.device(s.device), "bf16-mixed" if v.bf16 else "32-true"))
    run_model = torch.compile(model) if v.compile else model
    x, y = (t.to(s.device) for t in batch(shape))
    amp = (lambda: torch.autocast(torch.device(s.device).type, dtype=torch.bfloat16)) if v.bf16 \
        else contextlib.nullcontext

    def step() -> float:
        with amp():
            loss = loss_of(run_model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return TrainRun(v, params, step)


@dataclass
class Session:
    """Settings plus the measurements taken so far, so later sections can reuse earlier ones."""

    settings: Settings
    train: dict[tuple[str, str], Stats] = field(default_factory=dict)  # (shape, variant key) -> Stats
    params: dict[tuple[str, str], int] = field(default_factory=dict)
    compile_s: dict[tuple[str, str], float] = field(default_factory=dict)
    missing: dict[tuple[str, str], str] = field(default_factory=dict)  # why a contender did not run
    peak: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})  # bf16 -> FLOP/s samples
    mfu: list[dict] = field(default_factory=list)  # the mfu section's rows as numbers (scripts/gpu_check.py)

    def sample_peak(self, repeats: int = 3) -> None:
        """Matmul FLOP/s now, float32 and bf16. Taken around every timed group, so the run-wide best is
        the machine's peak even if another process was using the cores during part of the run."""
        n, device = self.settings.matmul_n, self.settings.device
        self.peak[False].append(matmul_peak(torch.float32, n, repeats, device))
        self.peak[True].append(matmul_peak(torch.bfloat16, n, repeats, device))


def measure_group(sess: Session, shape: Shape, variants: Sequence[Variant]) -> None:
    """Build every variant that can be built, then time them interleaved; results go into sess."""
    runs: dict[str, TrainRun] = {}
    for v in variants:
        if v.peer not in sess.settings.peers:
            sess.missing[(shape.name, v.key)] = "not selected (--peers)"
            continue
        try:
            runs[v.key] = make_train_run(shape, v, sess.settings)
            sess.params[(shape.name, v.key)] = runs[v.key].params
        except NotInstalled as e:
            sess.missing[(shape.name, v.key)] = str(e)
    first: dict[str, float] = {}
    ok: dict[str, Callable[[], object]] = {}
    for key, run in runs.items():  # a compile that fails is reported, not fatal
        try:
            first[key] = time_call(run.step)
            ok[key] = run.step
        except Exception as e:
            sess.missing[(shape.name, key)] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    sess.sample_peak()
    stats = interleave(ok, sess.settings)
    sess.sample_peak()
    for key, st in stats.items():
        sess.train[(shape.name, key)] = st
        if Variant.parse(key).compile:
            sess.compile_s[(shape.name, key)] = max(0.0, first[key] - st.median)


# ----------------------------------------------------------------------------------------------
# Markdown helpers


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def num(x: float) -> str:
    """A positive number with about three significant digits, never in scientific notation."""
    if x == 0:
        return "0"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}" if x >= 1e-3 else f"{x:.6f}"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def ms(seconds: float) -> str:
    return num(seconds * 1e3)


# ----------------------------------------------------------------------------------------------
# Sections


def section_train(sess: Session) -> str:
    s = sess.settings
    out = ["## Training step", "",
           "Forward + backward + AdamW step (lr 1e-4, weight decay 0.1, PyTorch's default implementation) on one "
           "fixed batch of random tokens, float32, eager. Loss: next-token cross-entropy over the full logits. "
           "`time / zoo` is the contender's median over zoo's median of the same family (above 1: zoo is faster); "
           "`min ms` is the fastest step, the one least disturbed by other processes. "
           "Peers are built from configs with random weights; HF GPT-2 uses exact GELU (`activation_function="
           "'gelu'`) like zoo and nanoGPT; HF uses `attn_implementation='sdpa'`, x-transformers `attn_flash=True`.",
           ""]
    for shape_name in s.shapes:
        shape = SHAPES[shape_name]
        variants = [Variant(p, f) for f in ("gpt2", "llama") for p in PEERS if not (p == "nanogpt" and f == "llama")]
        measure_group(sess, shape, variants)
        rows = []
        for v in variants:
            k = (shape.name, v.key)
            if k not in sess.train:
                if v.peer == "nanogpt" and s.nanogpt is None:
                    continue
                rows.append([FAMILY_LABELS[v.family], LABELS[v.peer], "-", "-", "-", "-", "-", "-",
                             sess.missing.get(k, "-")])
                continue
            st, base = sess.train[k], sess.train.get((shape.name, Variant("zoo", v.family).key))
            rows.append([FAMILY_LABELS[v.family], LABELS[v.peer], sess.params[k], ms(st.median), ms(st.iqr),
                         ms(min(st.times)), num(shape.tokens / st.median),
                         ratio(st.median / base.median) if base else "-"])
            rows[-1].append(f"{len(st.times)} steps")
        out += [f"### {shape.name}: {shape.describe()}", "",
                table(["family", "contender", "params", "median ms", "IQR ms", "min ms", "tokens/s", "time / zoo",
                       "notes"], rows), ""]
    return "\n".join(out)


@contextlib.contextmanager
def cold_compile_caches():
    """Compile from scratch, as a first run would: a fresh Inductor cache directory, and the FX-graph and
    AOTAutograd caches off (otherwise a second benchmark run reports the time of a cache hit)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    flags = [(inductor_config, "fx_graph_cache"), (functorch_config, "enable_autograd_cache")]
    old_flags = [(mod, name, getattr(mod, name)) for mod, name in flags if hasattr(mod, name)]
    old_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="zoo-bench-inductor-") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
        for mod, name, _ in old_flags:
            setattr(mod, name, False)
        try:
            yield
        finally:
            for mod, name, value in old_flags:
                setattr(mod, name, value)
            if old_dir is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old_dir


def section_compile(sess: Session) -> str:
    with cold_compile_caches():
        return _section_compile(sess)


def _section_compile(sess: Session) -> str:
    s = sess.settings
    out = ["## torch.compile and bf16 autocast", "",
           "zoo's training step with `torch.compile(model)` (default mode), with "
           "`torch.autocast('cpu', dtype=torch.bfloat16)`, and with both, and AdamW as train.py takes it (bf16 rows: "
           "torch's fused kernel, for every contender); `speedup` is zoo float32 eager's median "
           "over the row's median (above 1: faster). Compile time = first step (which compiles forward and "
           "backward) minus the steady median, with empty compile caches at the start of the section (later "
           "variants reuse kernels compiled for earlier ones, as in one training process); it is not in the "
           "timings. nanoGPT rows also give `time / zoo`, against zoo's GPT-2-style model in the same mode.", ""]
    for shape_name in s.shapes:
        shape = SHAPES[shape_name]
        torch._dynamo.reset()
        for family in ("gpt2", "llama"):
            variants = [Variant("zoo", family, bf16=b, compile=c) for c in (False, True) for b in (False, True)]
            if family == "gpt2" and s.nanogpt is not None:
                variants += [Variant("nanogpt", "gpt2"), Variant("nanogpt", "gpt2", bf16=True),
                             Variant("nanogpt", "gpt2", bf16=True, compile=True)]
            measure_group(sess, shape, variants)
            base = sess.train.get((shape.name, Variant("zoo", family).key))
            rows = []
            for v in variants:
                k = (shape.name, v.key)
                if k not in sess.train:
                    rows.append([LABELS[v.peer], v.mode, "-", "-", "-", "-", "-", "-", "-", sess.missing.get(k, "-")])
                    continue
                st = sess.train[k]
                same = sess.train.get((shape.name, replace(v, peer="zoo").key))
                rows.append([LABELS[v.peer], v.mode, ms(st.median), ms(st.iqr), ms(min(st.times)),
                             num(shape.tokens / st.median),
                             ratio(base.median / st.median) if base else "-",
                             ratio(st.median / same.median) if same and v.peer != "zoo" else "-",
                             num(sess.compile_s[k]) if k in sess.compile_s else "-", ""])
            out += [f"### {shape.name}, {FAMILY_LABELS[family]}: {shape.describe()}", "",
                    table(["contender", "mode", "median ms", "IQR ms", "min ms", "tokens/s",
                           "speedup vs zoo fp32 eager", "time / zoo", "compile s", "notes"], rows), ""]
    return "\n".join(out)


def generation_model(s: Settings, attention: str = "gqa") -> tuple[nn.Module, dict]:
    """A Llama-style zoo model (RoPE: any length) of the generation shape, in eval mode."""
    shape = SHAPES[s.gen_shape]
    cfg = zoo_config(shape, "llama")
    if attention != "gqa":
        cfg["attention"] = {"name": attention}
    model = zoo_model(cfg).eval()
    return model, cfg


class StepTimer:
    """Per-step times of a `generate` call that runs unchanged: a hook stamps the start of every pass through
    the decoder stack; step i lasts from pass i's start to pass i + 1's (the last one to generate's return),
    so the head, sampling and bookkeeping of each token are in it. Step 0 is the prefill."""

    def __init__(self, stack: nn.Module):
        self.starts: list[float] = []
        stack.register_forward_pre_hook(self._stamp)

    def _stamp(self, module, args) -> None:
        self.starts.append(time.perf_counter())

    def steps(self, fn: Callable[[], object]) -> list[float]:
        self.starts.clear()
        fn()
        marks = [*self.starts, time.perf_counter()]
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]


def section_generate(sess: Session) -> str:
    s = sess.settings
    model, cfg = generation_model(s)
    timer = StepTimer(model.decoder)
    g = torch.Generator().manual_seed(0)
    n = s.gen_new_tokens
    results = {}
    for ctx in s.gen_contexts:
        prompt = torch.randint(0, cfg["vocab_size"], (1, ctx), generator=g)
        runs: dict[bool, list[tuple[float, list[float]]]] = {True: [], False: []}  # (prefill, steps) per call

        def run(cache: bool, p: torch.Tensor = prompt, out: dict = runs) -> None:
            steps = timer.steps(lambda: generate(model, p, n + 1, use_cache=cache))
            out[cache].append((steps[0], steps[1:]))

        interleave({"cache": partial(run, True), "no cache": partial(run, False)},
                   replace(s, warmup=1, min_rounds=s.gen_rounds, max_rounds=s.gen_rounds, target_s=0))
        timed = {c: runs[c][-s.gen_rounds:] for c in (True, False)}  # warm-up calls dropped
        per = {c: Stats([statistics.mean(steps) for _, steps in timed[c]]) for c in (True, False)}
        best = {c: min(min(steps) for _, steps in timed[c]) for c in (True, False)}
        results[ctx] = (per[True], per[False], Stats([pre for pre, _ in timed[True]]), best)
    rows = [[ctx, ms(c.median), ms(c.iqr), ms(nc.median), ms(nc.iqr), ratio(nc.median / c.median),
             ms(best[True]), ms(best[False]), ratio(best[False] / best[True]), ms(pre.median)]
            for ctx, (c, nc, pre, best) in results.items()]
    shape = SHAPES[s.gen_shape]
    out = ["## Generation", "",
           f"Greedy decoding with `zoo.generate.generate` of 1 + {n} tokens, batch 1, float32, Llama-style zoo "
           f"model ({shape.n_layers} layers, {shape.n_heads} heads, d_model {shape.d_model}, GQA n_kv_heads "
           f"{shape.n_kv_heads}, RoPE). Prompt length = context. A hook on the decoder stack splits each call into "
           f"steps (start of one pass to the start of the next): the first is the prefill and its first token "
           f"(last column, with the cache), the other {n} are decoding steps, whose mean is the "
           f"per-token latency of a call; the table gives its median (and IQR) over {s.gen_rounds} interleaved "
           "rounds, and `best` the fastest single step (the least disturbed by other processes).", "",
           table(["context", "with cache ms/token", "IQR", "without cache ms/token", "IQR", "cache speedup",
                  "best with", "best without", "best speedup", "prefill ms"], rows), ""]
    key = 512 if 512 in results else max(results)
    c, nc, _, best = results[key]
    out += [f"KV-cache speedup at context {key}: **{ratio(nc.median / c.median)}** "
            f"({ms(nc.median)} ms -> {ms(c.median)} ms per token; fastest steps: "
            f"{ratio(best[False] / best[True])}).", ""]
    return "\n".join(out)


KV_VARIANTS = ("mha", "gqa", "mqa", "mla")  # mla with its defaults: kv_rank 4 x head size, rope_dim half of it


def kv_bytes(s: Settings, attention: str, context: int, batch_size: int = 1) -> dict:
    """Prefill `context` tokens into a fresh cache; nbytes() summed over layers, and the formula."""
    model, cfg = generation_model(s, attention)
    prompt = torch.zeros(batch_size, context, dtype=torch.long)
    cache = model.new_cache()
    with torch.no_grad():
        model(prompt, cache=cache)
    measured = sum(c.nbytes() for layer in cache for c in layer)
    elem = next(model.parameters()).element_size()
    layers = [block.attn.f for block in model.decoder.blocks]  # each attention reports its own cache size
    per_token = sum(a.cache_bytes_per_token(elem) for a in layers)
    return dict(attention=attention, n_kv=layers[0].n_kv_heads, layers=len(layers), head_dim=layers[0].head_dim,
                kv_rank=getattr(layers[0], "kv_rank", None), rope_dim=getattr(layers[0], "rope_dim", None),
                context=context, batch=batch_size, bytes_per_elem=elem, bytes_per_token=per_token,
                measured=measured, formula=batch_size * context * per_token)


def decode_latency(s: Settings, batch_size: int) -> dict[str, Stats]:
    """Per-token decoding time with the KV cache after a prompt of s.kv_context tokens, for the KV_VARIANTS
    models of the generation shape, interleaved. Every call's decoding steps are averaged into one sample."""
    g = torch.Generator().manual_seed(0)
    samples: dict[str, list[float]] = {}
    fns = {}
    for attention in KV_VARIANTS:
        model, cfg = generation_model(s, attention)
        timer, out = StepTimer(model.decoder), samples.setdefault(attention, [])
        prompt = torch.randint(0, cfg["vocab_size"], (batch_size, s.kv_context), generator=g)

        def run(m=model, t=timer, p=prompt, o=out) -> None:
            o.append(statistics.mean(t.steps(lambda: generate(m, p, s.gen_new_tokens + 1))[1:]))

        fns[attention] = run
    interleave(fns, replace(s, warmup=1, min_rounds=s.gen_rounds, max_rounds=s.gen_rounds, target_s=0))
    return {a: Stats(v[-s.gen_rounds:]) for a, v in samples.items()}  # warm-up calls dropped


def section_kv(sess: Session) -> str:
    s = sess.settings
    rows, res = [], [kv_bytes(s, a, s.kv_context) for a in KV_VARIANTS]
    for r in res:
        rows.append([r["attention"], r["n_kv"], r["layers"], r["head_dim"], r["bytes_per_token"] // r["layers"],
                     r["context"], r["measured"], num(r["measured"] / 2**20), r["formula"],
                     "yes" if r["measured"] == r["formula"] else "**NO**", ratio(r["measured"] / res[0]["measured"])])
    latent = "; ".join(f"{r['attention']}: kv_rank {r['kv_rank']}, rope_dim {r['rope_dim']}"
                       for r in res if r["kv_rank"] is not None)
    batch = 8
    lat = decode_latency(s, batch)
    lat_rows = [[a, ms(st.median), ms(st.iqr), ratio(lat["mha"].median / st.median)] for a, st in lat.items()]
    return "\n".join(["## KV-cache size", "",
                      f"`KVCache.nbytes()` summed over layers after a prefill of {s.kv_context} tokens (batch 1, "
                      "float32), against layers * batch * T * the bytes per token and layer each attention reports "
                      "(`cache_bytes_per_token`): 2 * n_kv * head_dim * 4 for mha, gqa and mqa; (kv_rank + rope_dim) "
                      f"* 4 for mla, whose cache holds one latent and one rotary key per token ({latent}; its n_kv "
                      "and head_dim are those of the keys and values it makes from the latent, one per query head).",
                      "",
                      table(["attention", "n_kv", "layers", "head_dim", "bytes/token/layer", "T", "bytes", "MiB",
                             "formula", "match", "vs mha"], rows), "",
                      f"Decoding with the cache after a {s.kv_context}-token prompt, batch {batch}: mean time per "
                      f"token of {s.gen_new_tokens} greedy steps, median over {s.gen_rounds} interleaved calls "
                      f"(models of the generation shape with {', '.join(KV_VARIANTS)}; the parameter counts differ by "
                      "the key/value projections; mla decodes with its up-projections absorbed, attending over the "
                      "cached latents: its scores and sums run over kv_rank + rope_dim and kv_rank numbers per head "
                      "instead of head_dim, more FLOPs per token for a smaller cache).", "",
                      table(["attention", "ms/token", "IQR", "mha / this"], lat_rows), ""])


# Where a training step's time goes: torch.profiler's self CPU time per operator, in groups. Checked in order: the
# first pattern that an operator's name contains decides its group.
# compiled: a graph's own time is the C++ kernels inductor wrote for it (elementwise work, casts, norms and softmaxes
# it fused); profile_groups sums a model's graphs, each named by a hash, under this one name
COMPILED_GRAPHS = "inductor's kernels (compiled graphs)"
PROFILE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("inductor's kernels", (COMPILED_GRAPHS,)),
    ("attention", ("attention", "softmax", "masked_fill", "tril", "triu", "baddbmm")),
    ("norm", ("norm", "rsqrt", "var_mean")),
    ("optimizer", ("adam", "_foreach", "lerp", "sqrt", "addcdiv", "addcmul", "zero_")),
    ("matmul", ("mm", "linear", "matmul", "addmm", "bmm")),
    ("casts and copies", ("_to_copy", "copy_", "to", "clone", "contiguous", "empty_like", "cat")),
    ("loss", ("cross_entropy", "nll_loss", "log_softmax")),
    ("activation and elementwise", ("gelu", "silu", "relu", "mul", "add", "div", "sub", "neg", "tanh", "where",
                                   "sum", "mean", "pow", "embedding", "dropout", "sigmoid", "exp")),
)


def profile_groups(step: Callable[[], object], steps: int) -> tuple[dict[str, float], list[tuple[str, float]], float]:
    """Shares of self CPU time by group, the top operators, and the profiled step time (profiling adds overhead)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - t0) / steps
    ops: dict[str, float] = {}
    for e in prof.key_averages():
        key = COMPILED_GRAPHS if "CompiledFxGraph" in e.key else e.key
        ops[key] = ops.get(key, 0.0) + e.self_cpu_time_total
    ops = [(k, t) for k, t in ops.items() if t > 0]
    total = sum(t for _, t in ops) or 1.0
    shares: dict[str, float] = {name: 0.0 for name, _ in PROFILE_GROUPS} | {"other": 0.0}
    for key, t in ops:
        name = key.removeprefix("aten::").lower()
        group = next((g for g, pats in PROFILE_GROUPS if any(p in name for p in pats)), "other")
        shares[group] += t / total
    top = sorted(((k, t / total) for k, t in ops), key=lambda kt: -kt[1])[:6]
    return shares, top, wall


def section_profile(sess: Session) -> str:
    """Each family's training step in float32 and bf16 (eager) and bf16 compiled, profiled: the share of each
    group of operators."""
    s = sess.settings
    groups = [name for name, _ in PROFILE_GROUPS] + ["other"]
    rows, tops = [], []
    for shape_name in s.shapes:
        shape = SHAPES[shape_name]
        for family in ("gpt2", "llama"):
            for bf16, compiled in ((False, False), (True, False), (True, True)):
                v = Variant("zoo", family, bf16=bf16, compile=compiled)
                run = make_train_run(shape, v, s)
                for _ in range(s.warmup):
                    run.step()
                shares, top, wall = profile_groups(run.step, 1 if s.quick else 5)
                rows.append([shape.name, FAMILY_LABELS[family], v.mode, ms(wall),
                             *(f"{100 * shares[g]:.0f}%" for g in groups)])
                tops.append(f"- {shape.name}, {FAMILY_LABELS[family]}, {v.mode}: " + ", ".join(
                    f"`{k.removeprefix('aten::')}` {100 * t:.0f}%" for k, t in top))
                del run
                gc.collect()
    return "\n".join([
        "## Where the step time goes", "",
        "zoo's training step (forward, backward, AdamW; the train section's models and batches) under "
        "`torch.profiler`, 5 steps after warm-up: each operator's self CPU time, summed by group, as a share of "
        "all operators' time. Groups by the operator's name (`zoo.bench.PROFILE_GROUPS`): `inductor's kernels` "
        "is a compiled graph's own C++ kernels (the elementwise work, casts, norms and softmaxes it fused), "
        "`attention` the fused sdpa kernels or the explicit path's softmax and masking, `matmul` every other "
        "matrix product (projections, FFN, head), `casts and copies` autocast's conversions and layout copies. "
        "The profiler adds overhead per operator, so `profiled ms` is above the train section's step time.", "",
        table(["shape", "family", "mode", "profiled ms", *groups], rows), "",
        "Top operators by self CPU time:", "", *tops, ""])


NORM_REPS = 50  # forward + backward passes per timed call: one pass is well under a millisecond


def _norm_step(norm: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor) -> None:
    for _ in range(NORM_REPS):
        norm(x).backward(grad)


RMS_IMPLEMENTATION = {  # zoo's float32 CPU RMSNorm, by the kernel zoo.kernels applied to it here
    "rmsnorm_cpp": "its own torch op (kernel `rmsnorm_cpp`, `zoo/kernels/rmsnorm.cpp`: one fused kernel forward, "
                   "one backward)",
    "rmsnorm_cpu": "the kernel `rmsnorm_cpu`, where zoo/kernels/rmsnorm.cpp cannot be built (torch ops forward, "
                   "LayerNorm's backward kernel plus a correction)"}


def section_norm(sess: Session) -> str:
    """zoo's LayerNorm and RMSNorm alone, forward + backward on (batch x context, d_model) activations of each
    shape, interleaved: the speed half of Zhang and Sennrich's finding, without the rest of the model around it."""
    from zoo.component import Context
    from zoo.kernels import apply_kernels
    from zoo.registry import NORM

    s, rows = sess.settings, []
    for shape_name in s.shapes:
        shape = SHAPES[shape_name]
        x = torch.randn(shape.batch * shape.context, shape.d_model, requires_grad=True)
        grad = torch.randn_like(x)
        ctx = Context(d_model=shape.d_model, n_heads=shape.n_heads, max_seq_len=shape.context)
        norms = {name: NORM.get(name)(ctx, NORM.options(name)()) for name in ("layernorm", "rmsnorm")}
        rms_kernel = apply_kernels(norms["rmsnorm"], "auto")
        fns = {name: partial(_norm_step, norm, x, grad) for name, norm in norms.items()}
        fns["composite"] = partial(_norm_step, partial(F.rms_norm, normalized_shape=(shape.d_model,),
                                                       weight=nn.Parameter(torch.ones(shape.d_model)), eps=1e-5),
                                   x, grad)
        stats = interleave(fns, replace(s, target_s=s.target_s / 4))
        ln, rms, comp = (stats[k].median / NORM_REPS for k in ("layernorm", "rmsnorm", "composite"))
        rows.append([shape_name, f"{shape.batch * shape.context} x {shape.d_model}", ms(ln), ms(rms), ratio(ln / rms),
                     ms(comp), ratio(ln / comp)])
    return "\n".join(["## LayerNorm against RMSNorm", "",
                      f"One norm layer, forward + backward, float32, interleaved, {NORM_REPS} passes per timed "
                      "call, ms per pass; `LN / RMS` above 1 means RMSNorm is faster. zoo's RMSNorm on CPU is "
                      f"{RMS_IMPLEMENTATION.get(next(iter(rms_kernel), ''), 'its formula (no kernel applied)')}; "
                      "`composite` is `F.rms_norm`, which torch differentiates op by op on CPU.",
                      "", table(["shape", "activations", "LayerNorm ms", "RMSNorm ms", "LN / RMS", "composite ms",
                                 "LN / composite"], rows), ""])


def matmul_peak(dtype: torch.dtype, n: int, repeats: int, device: str = "cpu") -> float:
    """Best FLOP/s of an n x n matrix product over `repeats` tries."""
    a, b = torch.randn(n, n).to(device, dtype), torch.randn(n, n).to(device, dtype)
    torch.mm(a, b)
    best = min(time_call(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * n**3 / best


def section_mfu(sess: Session) -> str:
    s = sess.settings
    sess.sample_peak(s.matmul_repeats)
    rows, cuda = [], torch.device(s.device).type == "cuda"
    for shape_name in s.shapes:
        shape = SHAPES[shape_name]
        for family in ("gpt2", "llama"):
            # on a GPU also bf16 with torch.compile: how trainer=gpu compile=true trains
            wanted = [Variant("zoo", family), Variant("zoo", family, bf16=True)] + \
                [Variant("zoo", family, bf16=True, compile=True)] * cuda
            todo = [v for v in wanted if (shape.name, v.key) not in sess.train]
            if todo:
                measure_group(sess, shape, todo)
            measured = [Variant.parse(k) for (sh, k) in sess.train
                        if sh == shape.name and k.startswith(f"zoo-{family}")]
            flops = zoo.flops_per_token(zoo_config(shape, family), shape.context)["train"] * shape.tokens
            peak = {b: max(sess.peak[b]) for b in (False, True)}
            for v in sorted(measured, key=lambda v: (v.compile, v.bf16)):
                st = sess.train[(shape.name, v.key)]
                achieved = flops / st.median
                sheet = achieved / (s.peak_tflops * 1e12) if s.peak_tflops and v.bf16 else None
                sess.mfu.append({"shape": shape.name, "family": family, "mode": v.mode, "step_s": st.median,
                                 "tokens_per_s": shape.tokens / st.median, "achieved": achieved,
                                 "mfu": achieved / peak[v.bf16], "mfu_datasheet": sheet})
                rows.append([shape.name, FAMILY_LABELS[family], v.mode, num(flops / 1e9), ms(st.median),
                             num(achieved / 1e9), num(peak[v.bf16] / 1e9), f"{100 * achieved / peak[v.bf16]:.1f}%"]
                            + ([f"{100 * sheet:.1f}%" if sheet is not None else "-"] if s.peak_tflops else []))
    peak = {b: max(sess.peak[b]) for b in (False, True)}
    where = "the cores"
    if cuda:
        where = "the GPU"
        rows_note = (f"On {torch.cuda.get_device_name(torch.device(s.device))}: float32 rows use TF32 matmuls "
                     "(trainer=gpu's tf32=true), AdamW is fused; bf16 compile is `torch.compile` of the model under "
                     "bf16 autocast, compile time excluded. ")
    else:
        rows_note = ""
    sheet_note = f"The last column is over a datasheet's dense bf16 peak, {num(s.peak_tflops)} TFLOP/s. " \
        if s.peak_tflops else ""
    return "\n".join([
        "## Model FLOP utilisation", "",
        rows_note + sheet_note +
        f"Achieved = `zoo.flops_per_token(cfg, context)['train']` x tokens per step / median step time. Peak = the "
        f"fastest {s.matmul_n}x{s.matmul_n} matrix product of this run (sampled before and after every timed group, "
        f"{len(sess.peak[False])} samples): **{num(peak[False] / 1e9)} GFLOP/s float32**, "
        f"**{num(peak[True] / 1e9)} GFLOP/s bf16** (median sample {num(statistics.median(sess.peak[False]) / 1e9)} "
        f"and {num(statistics.median(sess.peak[True]) / 1e9)}). bf16 rows are over the bf16 peak. The FLOP count "
        f"ignores the causal mask (it counts the full T x T scores). A step timed while other processes used {where} "
        "has a lower MFU than the machine allows.", "",
        table(["shape", "family", "mode", "GFLOP/step", "median ms", "achieved GFLOP/s", "peak GFLOP/s", "MFU"]
              + (["MFU of datasheet"] if s.peak_tflops else []), rows),
        ""])


# --- peak memory: one subprocess per contender ------------------------------------------------


def _child_env() -> dict[str, str]:
    """The environment for `python -m zoo.bench` children: zoo importable from any working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_probe(args: Sequence[str], s: Settings, timeout: int) -> dict | str:
    """`python -m zoo.bench <args>` in a fresh process (its memory is its own): the JSON it prints last, or why
    it failed, in one line."""
    cmd = [sys.executable, "-m", "zoo.bench", *args, *(["--threads", str(s.threads)] if s.threads else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=_child_env())
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not line:
        return (proc.stderr.strip().splitlines() or ["?"])[-1][:120]
    return json.loads(line[-1])


def _status_kib(field_name: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field_name}:\s+(\d+)", text, re.M).group(1))


def memory_probe(shape_name: str, key: str, s: Settings) -> dict:
    """Run in a fresh process: RSS growth (peak minus before) over a few training steps."""
    run = make_train_run(SHAPES[shape_name], Variant.parse(key), s)
    gc.collect()
    before = _status_kib("VmRSS")
    try:  # "5" resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
        Path("/proc/self/clear_refs").write_text("5")
        method = "VmHWM after reset"
    except OSError:
        method = "VmHWM (not reset: includes the imports' peak)"
    for _ in range(s.memory_steps):
        run.step()
    peak = _status_kib("VmHWM")
    return dict(before_mib=before / 1024, peak_mib=peak / 1024, delta_mib=max(0, peak - before) / 1024,
                method=method, params=run.params)


def section_memory(sess: Session) -> str:
    s = sess.settings
    rows, methods = [], set()
    if not Path("/proc/self/status").exists():
        return "## Peak memory\n\nskipped: needs Linux /proc to read the resident set size.\n"
    for shape_name in s.shapes:
        variants = [Variant("zoo", "gpt2"), Variant("zoo", "gpt2", bf16=True), Variant("hf", "gpt2"),
                    Variant("xt", "gpt2"), Variant("nanogpt", "gpt2"), Variant("zoo", "llama"),
                    Variant("zoo", "llama", bf16=True), Variant("hf", "llama"), Variant("xt", "llama")]
        for v in variants:
            if v.peer not in s.peers or (v.peer == "nanogpt" and s.nanogpt is None):
                continue
            r = run_probe(["--memory-probe", f"{shape_name}:{v.key}", "--memory-steps", str(s.memory_steps),
                           *(["--nanogpt", str(s.nanogpt)] if s.nanogpt is not None else [])], s, timeout=600)
            if isinstance(r, str):
                rows.append([shape_name, FAMILY_LABELS[v.family], LABELS[v.peer], v.mode, "-", "-", "-", r])
                continue
            methods.add(r["method"])
            rows.append([shape_name, FAMILY_LABELS[v.family], LABELS[v.peer], v.mode, r["params"],
                         num(r["before_mib"]), num(r["delta_mib"]), ""])
    return "\n".join([
        "## Peak memory", "",
        f"Each contender runs in its own process: build model, AdamW and batch, read the resident set size "
        f"(RSS), reset the kernel's peak-RSS counter, run {s.memory_steps} training steps, read the peak. "
        "`peak growth` therefore holds activations, gradients, AdamW state and allocator slack; `RSS before` "
        f"holds the interpreter, imported libraries and weights. Method: {', '.join(sorted(methods)) or '-'}.", "",
        table(["shape", "family", "contender", "mode", "params", "RSS before MiB", "peak growth MiB", "notes"], rows),
        ""])


# --- train.py overhead (isolated: the lead defines train.py's summary.json) ---------------------

OVERHEAD_SHAPE = "small"  # assumed to be what `experiment=nanogpt_cpu` trains; adjust with train.py


def bare_loop(steps: int, spawned_at: float, spec: dict | None = None) -> dict:
    """A plain PyTorch loop (runs in a subprocess): zoo model, AdamW, random windows of the Shakespeare characters.

    spec: {"model": zoo model config, "batch": B, "context": T}; train.py's summary.json supplies them, and the
    default is the small GPT-2-style shape. time_to_first_step_s counts from the parent's spawn time, so
    interpreter start and imports are in it."""
    from zoo.data import load_default_corpus

    spec = spec or {}
    small = SHAPES[OVERHEAD_SHAPE]
    cfg = spec.get("model") or zoo_config(small, "gpt2")
    batch_size, context = spec.get("batch") or small.batch, spec.get("context") or small.context
    codes = torch.from_numpy(np.frombuffer(load_default_corpus().encode("utf-32-le"), dtype=np.uint32).astype(np.int64))
    _, data = torch.unique(codes, return_inverse=True)  # character ids in code-point order
    data = data % cfg["vocab_size"]
    model = zoo_model(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(0)
    t_first, t0 = 0.0, 0.0
    for i in range(steps):
        idx = torch.randint(0, len(data) - context - 1, (batch_size,), generator=g).tolist()
        x = torch.stack([data[j: j + context] for j in idx])
        y = torch.stack([data[j + 1: j + 1 + context] for j in idx])
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i == 0:
            t_first, t0 = time.time(), time.perf_counter()
    rest = time.perf_counter() - t0
    sps = (steps - 1) / rest if steps > 1 else float("nan")
    return dict(time_to_first_step_s=t_first - spawned_at, steps_per_second=sps,
                tokens_per_second=sps * batch_size * context, steps=steps, loss=loss.item())


def _find_summary(stdout: str, root: Path, started: float) -> Path | None:
    """summary.json in a directory train.py printed, else the newest one written since it started."""
    for token in reversed(re.findall(r"[\w./\\:~-]+", stdout)):
        p = (root / token).expanduser() if not Path(token).is_absolute() else Path(token)
        for cand in (p, p / "summary.json"):
            if cand.name == "summary.json" and cand.is_file():
                return cand
    found = [p for d in ("outputs", "runs", "multirun", "logs") for p in (root / d).glob("**/summary.json")
             if p.stat().st_mtime >= started]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def run_train_py(cmd: list[str], root: Path) -> tuple[dict, Path, float, str] | str:
    """Run train.py; (summary, its path, process wall seconds, load average before -> after), or why it failed."""
    started, load_before = time.time(), _load(short=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=3600)
    wall, load = time.time() - started, f"{load_before} -> {_load(short=True)}"
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
        return f"failed: `{shlex.join(cmd[1:])}` exited {proc.returncode}: {err}\n"
    summary_path = _find_summary(proc.stdout + "\n" + proc.stderr, root, started)
    if summary_path is None:
        return "failed: no summary.json found in train.py's output or run directories\n"
    return json.loads(summary_path.read_text()), summary_path, wall, load


def bench_train_overhead(s: Settings, root: Path = ROOT) -> str:
    """train.py against a bare loop over the same zoo model; time to first step. Skipped without train.py.

    Runs `python train.py experiment=nanogpt_cpu trainer.max_steps=N [--train-args ...]` in `root` and
    reads `summary.json` (keys tokens_per_second, wall_time_s, time_to_first_step_s) from the run
    directory it prints; then `python -m zoo.bench --bare-loop N`, the same model in a plain loop."""
    head = "## train.py overhead\n\n"
    train_py = root / "train.py"
    if not train_py.is_file():
        msg = "skipped: train.py not found"
        print(msg)
        return head + msg + "\n"
    n = s.overhead_steps
    # float32, as the bare loop: this section measures train.py's overhead, not precision (auto may pick bf16)
    cmd = [sys.executable, str(train_py), "experiment=nanogpt_cpu", f"trainer.max_steps={n}",
           "trainer.precision=32-true", *s.train_args]
    run = run_train_py(cmd, root)
    if isinstance(run, str):
        return head + run
    summary, summary_path, wall, train_load = run
    data = summary.get("data") or {}
    spec = {"model": summary.get("model"), "batch": data.get("batch_size"), "context": data.get("context")}
    bare_cmd = [sys.executable, "-m", "zoo.bench", "--bare-loop", str(n), "--bare-spec", json.dumps(spec),
                "--spawned-at", repr(time.time()), *(["--threads", str(s.threads)] if s.threads else [])]
    load_before = _load(short=True)
    bp = subprocess.run(bare_cmd, capture_output=True, text=True, cwd=root, timeout=3600, env=_child_env())
    bare_load = f"{load_before} -> {_load(short=True)}"
    lines = [ln for ln in bp.stdout.splitlines() if ln.startswith("{")]
    if bp.returncode != 0 or not lines:
        return head + f"failed: bare loop: {(bp.stderr.strip().splitlines() or ['?'])[-1][:200]}\n"
    bare = json.loads(lines[-1])

    def get(d: dict, k: str) -> str:
        v = d.get(k)
        return num(v) if isinstance(v, (int, float)) and v > 0 else "-"

    tps = summary.get("tokens_per_second")
    rows = [["train.py", get(summary, "tokens_per_second"), get(summary, "time_to_first_step_s"),
             get(summary, "wall_time_s"), num(wall), train_load],
            ["bare PyTorch loop", num(bare["tokens_per_second"]), num(bare["time_to_first_step_s"]), "-", "-",
             bare_load]]
    rel = ratio(tps / bare["tokens_per_second"]) if isinstance(tps, (int, float)) and tps > 0 else "-"
    return head + "\n".join([
        f"`{shlex.join(['python', 'train.py', *cmd[2:]])}` (summary: `{summary_path.relative_to(root)}`) against "
        "a bare loop (`zoo.bench.bare_loop`: the same zoo model config, batch and context as the summary's, "
        f"AdamW, random windows of the Shakespeare characters), {n} steps each. The bare loop's time to first "
        "step counts from process spawn; train.py's figures are its own summary's (its own definitions of "
        "throughput and time to first step, which may exclude start-up or include evaluation). The two runs are "
        "sequential, not interleaved: compare their load averages before trusting the ratio.", "",
        table(["run", "tokens/s", "time to first step s", "wall s (summary)", "wall s (process)", "load average"],
              rows), "",
        f"train.py throughput / bare loop: **{rel}**", ""])


def section_overhead(sess: Session) -> str:
    return bench_train_overhead(sess.settings)


def section_precision(sess: Session, root: Path = ROOT) -> str:
    """A short train.py run at the large shape in float32 and in bf16-mixed: loss and speed."""
    s, shape = sess.settings, SHAPES["large"]
    head = "## bf16-mixed training against float32\n\n"
    if not (root / "train.py").is_file():
        return head + "skipped: train.py not found\n"
    args = [f"model.n_layers={shape.n_layers}", f"model.n_heads={shape.n_heads}", f"model.d_model={shape.d_model}",
            f"data.context={shape.context}", f"data.batch_size={shape.batch}", f"trainer.max_steps={s.precision_steps}",
            f"trainer.val_check_interval={s.precision_steps}", "optim.warmup_steps=20", "logger=none",
            "sample.max_new_tokens=0"]
    rows, loss, tps = [], {}, {}
    for precision in ("32-true", "bf16-mixed"):
        cmd = [sys.executable, str(root / "train.py"), "experiment=nanogpt_cpu", *args,
               f"trainer.precision={precision}", *s.train_args]
        run = run_train_py(cmd, root)
        if isinstance(run, str):
            return head + run
        summary, _, wall, load = run
        loss[precision], tps[precision] = summary["final"]["val_loss"], summary["tokens_per_second"]
        rows.append([precision, f"{loss[precision]:.4f}", num(tps[precision]), num(wall), load])
    rel = (loss["bf16-mixed"] - loss["32-true"]) / loss["32-true"]
    return head + "\n".join([
        f"`python train.py experiment=nanogpt_cpu {shlex.join(args)} trainer.precision=<precision>` at the large shape "
        f"({shape.describe()}), {s.precision_steps} steps each, the two runs one after the other.", "",
        table(["precision", "final val_loss", "tokens/s", "wall s (process)", "load average"], rows), "",
        f"bf16-mixed val_loss relative to float32: **{rel:+.2%}**; throughput "
        f"**{ratio(tps['bf16-mixed'] / tps['32-true'])}**", ""])


# --- the rows behind zoo.hardware's rules ------------------------------------------------------


@contextlib.contextmanager
def attention_path(fused_from: int | None, softmax_kernel: bool = True):
    """Low-precision attention training on the fused kernel from key length `fused_from` (0: always, None:
    never), the written-out form's softmax on zoo's kernel where it builds (compiled or not) or in torch ops,
    whatever zoo.kernels' rules chose for this CPU (the models have zoo.kernels' pass applied)."""
    import zoo.kernels.attention as attention

    names = ("FUSED_BACKWARD_FROM", "FUSED_BACKWARD_FROM_SOFTMAX_KERNEL", "COMPILED_SOFTMAX_FROM",
             "softmax_kernel_applies")
    old = [getattr(attention, n) for n in names]
    attention.FUSED_BACKWARD_FROM = attention.FUSED_BACKWARD_FROM_SOFTMAX_KERNEL = fused_from
    attention.COMPILED_SOFTMAX_FROM = 0  # compiled too: the softmax asked for at every length
    if not softmax_kernel:
        attention.softmax_kernel_applies = lambda scores, mask: False
    try:
        yield
    finally:
        for n, v in zip(names, old, strict=True):
            setattr(attention, n, v)


def _bf16_forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, fused_from: int | None,
                           softmax_kernel: bool = True) -> None:
    with attention_path(fused_from, softmax_kernel), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lm_loss(model(x), y)
    with attention_path(fused_from, softmax_kernel):
        loss.backward()
    model.zero_grad(set_to_none=True)


def _written_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """zoo's written-out causal attention (AttentionBase._written_out), standing alone, its softmax on
    attention_softmax_cpp where attention_path lets it run."""
    from zoo.kernels import attention
    from zoo.layers.attention import attention_weights

    scores = q @ k.transpose(-2, -1)
    if attention.softmax_kernel_applies(scores, None):
        return attention.attention_softmax(scores, 1 / math.sqrt(q.shape[-1]), True) @ v
    return attention_weights(q, k, None, True) @ v


def _attention_step(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor,
                    softmax_kernel: bool = True) -> None:
    with attention_path(None, softmax_kernel):
        fn(q, k, v).backward(grad)


def _compiled_softmax_rows(s: Settings, n_heads: int, head_dim: int) -> list[str]:
    """Causal attention alone under torch.compile, written out, with zoo's softmax kernel and with inductor's fusion
    of the torch ops, by key length: the rows behind zoo.kernels.attention.COMPILED_SOFTMAX_KERNEL_FROM."""
    from zoo.kernels import attention

    rule = attention.COMPILED_SOFTMAX_FROM
    said = "never" if rule is None else f"from key length {rule}"
    rows, wrong = [], 0
    for t in s.attention_lengths:
        torch._dynamo.reset()  # one length's two graphs at a time: dynamo's cache holds only a few
        q, k, v = (torch.randn(1, n_heads, t, head_dim, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        grad = torch.randn(1, n_heads, t, head_dim, dtype=torch.bfloat16)
        compiled = torch.compile(_written_out, dynamic=False, fullgraph=True)  # the path patched: a graph each
        med = {n: st.median for n, st in interleave(
            {"zoo's softmax": partial(_attention_step, compiled, q, k, v, grad, True),
             "inductor's": partial(_attention_step, compiled, q, k, v, grad, False)}, s).items()}
        verdict = _verdict(rule, t, med["zoo's softmax"], med["inductor's"], ("zoo's softmax", "inductor's"))
        wrong += "slower" in verdict
        rows.append([t, ms(med["zoo's softmax"]), ms(med["inductor's"]),
                     ratio(med["inductor's"] / med["zoo's softmax"]), verdict])
    torch._dynamo.reset()
    picks = ("the faster softmax, or one within 5% of it, at every length." if not wrong else
             f"**a softmax more than 5% slower at {wrong} length(s)**: revisit "
             "zoo.kernels.attention.COMPILED_SOFTMAX_KERNEL_FROM.")
    return [f"The same attention written out under torch.compile, where inductor fuses the torch ops' softmax into "
            "one pass each way itself, against zoo's softmax kernel in the compiled graph; `inductor's / zoo's` "
            "above 1: zoo's kernel is faster. The rule (zoo.kernels.attention.COMPILED_SOFTMAX_KERNEL_FROM): zoo's "
            f"kernel {said}, then the fused attention kernel by the table above, from its own length.", "",
            table(["key length", "zoo's softmax ms", "inductor's ms", "inductor's / zoo's", "rule picks"], rows), "",
            f"Compiled, the rule ({said}) picks {picks}", ""]


def _kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _adamw_step(opt: torch.optim.Optimizer) -> None:
    opt.step()


ADAMW_KERNELS = {"for-loop (torch's CPU default)": {"foreach": False}, "foreach": {"foreach": True},
                 "fused": {"fused": True}}


def _adamw_runs(shape: Shape, steps: int) -> tuple[dict[str, torch.optim.Optimizer], dict[str, bool]]:
    """One GPT-2-style model's fp32 parameters with fixed random gradients per kernel; whether each kernel's
    parameters after `steps` steps equal the default for-loop's to the bit."""
    opts, params = {}, {}
    for name, kw in ADAMW_KERNELS.items():
        model = zoo.build_model(zoo_config(shape, "gpt2"))
        g = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g) * 1e-2
        opts[name] = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, **kw)
        for _ in range(steps):
            opts[name].step()
        params[name] = [p.detach().clone() for p in model.parameters()]
    default = params[next(iter(ADAMW_KERNELS))]
    same = {n: all(torch.equal(a, b) for a, b in zip(default, ps, strict=True)) for n, ps in params.items()}
    return opts, same


def _verdict(rule: int | None, t: int, kernel: float, written: float,
             names: tuple[str, str] = ("kernel", "written-out")) -> str:
    """What the rule (from key length `rule`: the first path, else the second) picks at key length t and how it
    fares: within 5% of the faster path counts as a tie."""
    picked, mine, other = (names[0], kernel, written) if rule is not None and t >= rule else (names[1], written, kernel)
    return picked + (" (faster)" if mine <= other else " (within 5%)" if mine <= 1.05 * other else " (**slower**)")


# The written-out form's two softmaxes, each with its rule (zoo.kernels.attention): label -> (softmax kernel?, table)
SOFTMAXES = {"zoo's softmax": (True, "FUSED_FROM_SOFTMAX_KERNEL"), "torch ops": (False, "FUSED_FROM")}


def section_choices(sess: Session) -> str:
    from zoo import hardware
    from zoo.kernels import KERNELS, attention

    s, kind = sess.settings, hardware.cpu_kind()
    forms = {label: v for label, v in SOFTMAXES.items() if not v[0] or KERNELS.get("attention_softmax_cpp").load()}
    rules = {label: attention.FUSED_BACKWARD_FROM_SOFTMAX_KERNEL if sk else attention.FUSED_BACKWARD_FROM
             for label, (sk, _) in forms.items()}
    said = {label: "never" if r is None else f"from key length {r}" for label, r in rules.items()}
    auto = hardware.precision_choice({"accelerator": "cpu", "precision": "auto"})
    out = ["## Hardware choices", "",
           f"The rows behind `zoo.hardware`'s rules on this CPU kind (`cpu_kind()` = `{kind}`). Each CPU kind keeps "
           "its own section (the heading names it), so the kinds stand side by side. `trainer.precision=auto` "
           f"picks **{auto['used']}** here ({auto['reason']}); its speed against float32 is in the compile and "
           "precision sections.", "",
           "**Attention in bf16 training.** zoo's models under `torch.autocast('cpu', dtype=torch.bfloat16)`, "
           "forward + backward (no optimizer step), with attention on the fused kernel "
           "(`F.scaled_dot_product_attention`) and on the written-out form (`attention.backend=math`'s), its softmax "
           "on zoo's kernel (attention_softmax_cpp, where it builds) and in torch ops (without a C++ compiler, with "
           "`kernels=none`, under torch.compile on short rows: the table after these), interleaved; "
           "`kernel / written-out` above 1: the written-out form is faster. The rules here: the kernel "
           + "; ".join(f"{said[label]} against the written-out form with {label}" for label in forms)
           + (" (zoo's softmax kernel did not build here: no rows for it)" if len(forms) < len(SOFTMAXES) else "")
           + ".", ""]

    def cells(times: dict[str, float], t: int) -> tuple[list, list]:
        k = times["kernel"]
        return ([c for label in forms for c in (ms(times[label]), ratio(k / times[label]))],
                [_verdict(rules[label], t, k, times[label]) for label in forms])

    rows = []
    for shape_name in s.shapes:
        shape = SHAPES[shape_name]
        x, y = batch(shape)
        for family in ("gpt2", "llama"):
            model = zoo_model(zoo_config(shape, family)).train()
            fns = {"kernel": partial(_bf16_forward_backward, model, x, y, 0),
                   **{label: partial(_bf16_forward_backward, model, x, y, None, sk)
                      for label, (sk, _) in forms.items()}}
            st = interleave(fns, s)
            times, verdicts = cells({n: v.median for n, v in st.items()}, shape.context)
            rows.append([shape_name, FAMILY_LABELS[family], shape.context, ms(st["kernel"].median), *times, *verdicts])
    heads = [h for label in forms for h in (f"written-out ms ({label})", f"kernel / written-out ({label})")]
    picks = [f"rule picks ({label})" for label in forms]
    out += [table(["shape", "family", "context", "kernel ms", *heads, *picks], rows), ""]
    n_heads, head_dim = 48, 64
    rows, faster_from, wrong = [], dict.fromkeys(forms), dict.fromkeys(forms, 0)
    for t in s.attention_lengths:
        q, k, v = (torch.randn(1, n_heads, t, head_dim, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        grad = torch.randn(1, n_heads, t, head_dim, dtype=torch.bfloat16)
        st = interleave({"kernel": partial(_attention_step, _kernel, q, k, v, grad),
                         **{label: partial(_attention_step, _written_out, q, k, v, grad, sk)
                            for label, (sk, _) in forms.items()}}, s)
        med = {n: v.median for n, v in st.items()}
        for label in forms:  # the shortest length from which the kernel wins, against each form
            faster_from[label] = (faster_from[label] or t) if med["kernel"] < med[label] else None
        times, verdicts = cells(med, t)
        for label, verdict in zip(forms, verdicts, strict=True):
            wrong[label] += "slower" in verdict
        rows.append([t, ms(med["kernel"]), *times, *verdicts])
    out += [f"Causal attention alone, bf16, {n_heads} heads (batch x heads) of size {head_dim}, forward + backward "
            "by key length (the rules' variable):", "",
            table(["key length", "kernel ms", *heads, *picks], rows), ""]
    for label, (_, table_name) in forms.items():
        f = faster_from[label]
        out += [f"Against the written-out form with {label}, the kernel is faster "
                f"{'from key length ' + str(f) if f else 'at no length'} measured here; the rule ({said[label]}) picks "
                + ("the faster path, or one within 5% of it, at every length." if not wrong[label] else
                   f"**a path more than 5% slower at {wrong[label]} length(s)**: revisit "
                   f"zoo.kernels.attention.{table_name}."),
                ""]
    if "zoo's softmax" in forms:
        out += _compiled_softmax_rows(s, n_heads, head_dim)
    rows = []
    steps = 3
    for shape_name in s.shapes:
        shape = SHAPES[shape_name]
        opts, same = _adamw_runs(shape, steps)
        st = interleave({n: partial(_adamw_step, o) for n, o in opts.items()}, replace(s, target_s=s.target_s / 2))
        base = st[next(iter(ADAMW_KERNELS))].median
        n_params = sum(p.numel() for g in next(iter(opts.values())).param_groups for p in g["params"])
        for name in ADAMW_KERNELS:
            rows.append([shape_name, n_params, name, ms(st[name].median), ms(st[name].iqr),
                         ratio(base / st[name].median), "yes" if same[name] else "no"])
    picks = ", ".join(f"{p}: {'fused' if hardware.fused_adamw_on_cpu(p) else 'for-loop'}"
                      for p in ("32-true", "bf16-mixed"))
    out += ["**AdamW's step** on a GPT-2-style model's float32 parameters (weight decay 0.1, fixed random "
            f"gradients), interleaved; `equal to for-loop` compares the parameters after {steps} steps bit for bit. "
            f"The rule (`zoo.hardware.fused_adamw_on_cpu`, with optim.fused=null): {picks}: float32 runs keep "
            "torch's default so their results do not change.", "",
            table(["shape", "params", "kernel", "median ms", "IQR ms", "speedup vs for-loop", "equal to for-loop"],
                  rows), ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# Time to target: process start until the validation loss first reaches a target, zoo against nanoGPT

# nanoGPT README's Shakespeare-char recipe for a CPU, as written there (its config file plus these flags).
NANOGPT_CPU_ARGS = ("--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
                    "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
                    "--lr_decay_iters=2000", "--dropout=0.0")
# zoo's contenders: label -> train.py overrides (the same recipe: conf/experiment/nanogpt_cpu.yaml).
TTT_RUNS: dict[str, tuple[str, ...]] = {
    "zoo, defaults": ("experiment=nanogpt_cpu",),
    "zoo, float32": ("experiment=nanogpt_cpu", "trainer.precision=32-true"),
    "zoo, fast preset": ("experiment=nanogpt_cpu_fast",),  # RoPE, SwiGLU, lr 2e-3, 800 steps
    # the same compiled: its first round compiles into an empty cache, later rounds reuse it (TTT_COLD)
    "zoo, fast preset, compiled": ("experiment=nanogpt_cpu_fast", "compile=true"),
}
_NANOGPT_EVAL = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)")


@dataclass
class TargetRun:
    """One process: its evaluations as (step, val_loss, seconds since spawn), its wall time, eval share."""
    evals: list[tuple[int, float, float]]
    wall: float
    eval_share: float | None = None  # of the wall time; None where the program does not say

    def time_to(self, target: float) -> float | None:
        return next((t for _, v, t in self.evals if v <= target), None)


def _nanogpt_workdir(checkout: Path, text: Path, work: Path) -> Path:
    """A directory nanoGPT's train.py can run in: its shakespeare_char data made from `text` by its own
    prepare.py (given input.txt, it downloads nothing), and its configurator.py, which it reads from the cwd."""
    data = work / "data" / "shakespeare_char"
    data.mkdir(parents=True, exist_ok=True)
    shutil.copy(text, data / "input.txt")
    shutil.copy(checkout / "data" / "shakespeare_char" / "prepare.py", data / "prepare.py")
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True, timeout=600)
    shutil.copy(checkout / "configurator.py", work / "configurator.py")
    return work


def run_nanogpt_to_target(checkout: Path, work: Path, steps: int | None) -> TargetRun | str:
    """nanoGPT's train.py with the CPU recipe; each `step N: ... val loss X` line timed as it arrives."""
    extra = () if steps is None else (f"--max_iters={steps}", f"--lr_decay_iters={steps}",
                                      f"--eval_interval={max(1, steps // 2)}", "--warmup_iters=2")
    cmd = [sys.executable, str(checkout / "train.py"), str(checkout / "config" / "train_shakespeare_char.py"),
           *NANOGPT_CPU_ARGS, *extra]
    evals, spawned = [], time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    tail = []
    for line in proc.stdout:
        if m := _NANOGPT_EVAL.match(line):
            evals.append((int(m.group(1)), float(m.group(2)), time.perf_counter() - spawned))
        tail = (tail + [line.strip()])[-3:]
    code, wall = proc.wait(), time.perf_counter() - spawned
    if code != 0 or not evals:
        return f"nanoGPT's train.py exited {code} with {len(evals)} evaluations: {' | '.join(tail)[:300]}"
    return TargetRun(evals, wall)


def run_zoo_to_target(args: Sequence[str], text: Path, run_dir: Path, steps: int | None, root: Path = ROOT,
                      extra: Sequence[str] = ()) -> TargetRun | str:
    """zoo's train.py on `text`; each evaluation's time from summary.json's history, put on the spawn's clock
    through the summary's own write time (its mtime, taken right after its wall_time_s)."""
    short = () if steps is None else (f"trainer.max_steps={steps}", f"trainer.val_check_interval={max(1, steps // 2)}",
                                      "optim.warmup_steps=2")
    cmd = [sys.executable, str(root / "train.py"), *args, "data=text_file", f"data.path={text}",
           f"hydra.run.dir={run_dir}", *short, *extra]
    spawned_at = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=3600)
    wall = time.time() - spawned_at
    path = run_dir / "summary.json"
    if proc.returncode != 0 or not path.is_file():
        err = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
        return f"`{shlex.join(cmd[1:])}` exited {proc.returncode}: {err}"
    summary = json.loads(path.read_text())
    started = path.stat().st_mtime - summary["wall_time_s"] - spawned_at  # the run's clock, from the spawn
    evals = [(h["step"], h["val_loss"], started + h["wall_time_s"]) for h in summary["history"] if "val_loss" in h]
    return TargetRun(evals, wall, summary["eval_time_s"] / wall)


def section_ttt(sess: Session, root: Path = ROOT) -> str:
    """Wall time from process start to the first evaluation at or below the target, zoo against nanoGPT,
    the contenders one after another in rotating order, `ttt_pairs` rounds."""
    s = sess.settings
    head = "## Time to target: zoo against nanoGPT\n\n"
    if s.nanogpt is None or s.text is None:
        return head + "skipped: needs `--nanogpt <karpathy/nanoGPT checkout>` and `--text <text file>`\n"
    if not s.text.is_file():
        return head + f"skipped: --text {s.text}: no such file\n"
    target = s.ttt_target
    names = ["nanoGPT", *TTT_RUNS]
    runs: dict[str, list[TargetRun]] = {n: [] for n in names}
    failures: list[str] = []
    # torch.compile's on-disk cache starts empty: a compiled contender's first round pays the whole compile
    with tempfile.TemporaryDirectory(prefix="zoo-ttt-") as tmp, \
            mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor")}):
        work = _nanogpt_workdir(s.nanogpt, s.text, Path(tmp) / "nanogpt")
        for r in range(s.ttt_pairs):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if name == "nanoGPT":
                    run = run_nanogpt_to_target(s.nanogpt, work, s.ttt_steps)
                else:
                    run = run_zoo_to_target(TTT_RUNS[name], s.text, Path(tmp) / f"zoo-{r}-{names.index(name)}",
                                            s.ttt_steps, root, s.train_args)
                said = run if isinstance(run, str) else f"{run.time_to(target)} s to {target}, wall {run.wall:.1f} s"
                print(f"[zoo.bench] ttt round {r + 1}/{s.ttt_pairs} {name}: {said}", flush=True)
                if isinstance(run, str):
                    failures.append(f"{name}: {run}")
                else:
                    runs[name].append(run)

    def med(values: list[float | None]) -> float | None:
        return None if not values or None in values else statistics.median(values)

    base = med([run.time_to(target) for run in runs["nanoGPT"]])
    base_wall = med([run.wall for run in runs["nanoGPT"]])

    def walls(name: str) -> list[str]:
        wall = med([run.wall for run in runs[name]])
        return ["-", "-"] if wall is None else [f"{wall:.1f}", ratio(wall / base_wall) if base_wall else "-"]

    rows = []
    for name in names:
        times = [run.time_to(target) for run in runs[name]]
        t = med(times)
        finals = [run.evals[-1][1] for run in runs[name]]
        shares = [run.eval_share for run in runs[name] if run.eval_share is not None]
        rows.append([name, ", ".join("not reached" if x is None else f"{x:.1f}" for x in times) or "-",
                     "-" if t is None else f"{t:.1f}", "-" if t is None or not base else ratio(t / base),
                     f"{statistics.median(finals):.4f}" if finals else "-", *walls(name),
                     f"{statistics.median(shares):.1%}" if shares else "-"])
    zoo_cmds = "; ".join(f"{name}: `{shlex.join(args)}`" for name, args in TTT_RUNS.items())
    return head + "\n".join([
        f"Wall time from process start until the validation loss first reaches **{target}**, for nanoGPT's own "
        f"`train.py` with its Shakespeare-char CPU recipe (`train.py config/train_shakespeare_char.py "
        f"{shlex.join(NANOGPT_CPU_ARGS)}`, data made by its own prepare.py from `{s.text.name}`) and for zoo's "
        f"`train.py` with `data=text_file data.path=<the file>` and ({zoo_cmds}): the same 4-layer model, batch "
        "and context on the same file (the last 10% is validation for both; nanoGPT estimates the loss on 20 "
        "random batches of it, zoo on 20 fixed windows), nanoGPT's schedule "
        "(2000 steps, evaluating every 250) but for the fast preset's own (800 steps, evaluating every 100; its "
        "learning rate and warm-up are what zoo's Optuna search picked: command and result in "
        "conf/experiment/nanogpt_cpu_fast.yaml). "
        "torch.compile's on-disk cache (`TORCHINDUCTOR_CACHE_DIR`) is empty at the section's start, so a compiled "
        "contender's first round includes compiling from scratch and its later rounds reuse the cache, as a "
        "user's later runs on the same machine do. "
        f"{s.ttt_pairs} rounds, the contenders one after another in rotating order, torch's default threads. A time "
        "is that of the first evaluation at or below the target; `wall vs nanoGPT` compares whole processes, "
        "target reached or not; `eval share` is zoo's time in validation passes over its process wall time."
        + (f" Steps shortened to {s.ttt_steps} for a smoke run." if s.ttt_steps else ""), "",
        table(["contender", "time to target s (each round)", "median s", "vs nanoGPT", "final val_loss",
               "process wall s", "wall vs nanoGPT", "eval share"], rows), "",
        *([f"Failed: {'; '.join(failures)}", ""] if failures else [])])


# ----------------------------------------------------------------------------------------------
# Report and CLI

GPT2_SMALL = SHAPES["gpt2_small"]
# A GPU step of that shape for scale, computed (no GPU here): bf16 at 40% of an H100's dense peak, the issue's
# MFU target. The loader must produce a batch in a tenth of it.
GPU_FLOPS, GPU_LABEL = 0.4 * 989e12, "H100 bf16 at 40% MFU (989 TFLOP/s peak)"


def _prepare_round(src: Path, out: Path, spec: str, vocab: int, workers: int) -> dict:
    from zoo.prepare import prepare

    shutil.rmtree(out, ignore_errors=True)
    return prepare([str(src)], out, spec, vocab_size=vocab, bpe_sample_mb=5.0, sample_by="paragraph",
                   val_fraction=0.01, shard_mb=4.0, workers=workers, progress=False)


def section_data(sess: Session) -> str:
    """zoo-prepare against the tokenizer alone; data=tokens batches against a training step."""
    from zoo.data import load_default_corpus
    from zoo.data.tokenizers import tokenizer_from_state
    from zoo.prepare import documents
    from zoo.training.data import build_data, generator
    from zoo.training.objectives import OBJECTIVE

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


# --- conversion: safetensors straight onto the meta device, one subprocess per path -------------

CONVERT_LLAMAS = {  # LlamaConfig fields; "1b" is TinyLlama-1.1B's shape
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000),
    "small": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4, vocab_size=16000),  # tests only: big enough that the ratio means something
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),  # tests only
}
CONVERT_PATHS = {"direct": "zoo.convert.from_pretrained(dir): safetensors read onto a meta skeleton",
                 "transformers": "LlamaForCausalLM.from_pretrained(dir), then zoo.convert.convert"}


def random_llama(shape: str) -> nn.Module:
    """A Llama of CONVERT_LLAMAS[shape] in bf16 on the meta device (no memory yet; see save_random_llama)."""
    tf = _require("transformers")
    config = tf.LlamaConfig(**CONVERT_LLAMAS[shape], tie_word_embeddings=False, dtype="bfloat16")
    with torch.device("meta"):
        return tf.LlamaForCausalLM(config).to(torch.bfloat16)


def save_random_llama(model: nn.Module, directory: Path, shard: str = "500MB") -> None:
    """Save a meta model with random weights, made cheaply: memory without init (`to_empty`), then one
    normal_ fill per tensor; sharded safetensors in the model's dtype."""
    model = model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=g)
    model.save_pretrained(directory, max_shard_size=shard)


class RssSampler:
    """The peak anonymous and file-backed resident memory (RssAnon, RssFile) of this process, read from
    /proc/self/status by a thread every `interval` seconds. VmHWM counts both kinds together, but they do not
    cost the same: file-backed pages (a memory-mapped file) are the kernel's to drop and read again, allocations
    are not."""

    def __init__(self, interval: float = 0.001):
        import threading

        self.interval, self.peak = interval, {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        text = Path("/proc/self/status").read_text()
        for key in self.peak:
            self.peak[key] = max(self.peak[key], int(re.search(rf"^{key}:\s+(\d+)", text, re.M).group(1)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> RssSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def convert_probe(directory: str, path: str) -> dict:
    """Run in a fresh process: RSS before and at the peak of one conversion of `directory` by `path` (VmHWM, and
    the anonymous and file-backed parts apart, sampled: RssSampler)."""
    import transformers

    from zoo.convert import convert, from_pretrained

    transformers.logging.set_verbosity_error()
    transformers.LlamaForCausalLM  # noqa: B018 (imports the model code before the baseline)
    gc.collect()
    baseline = _status_kib("VmRSS")
    anon, file = _status_kib("RssAnon"), _status_kib("RssFile")
    try:  # "5" resets VmHWM to the current RSS; ru_maxrss is never reset (it holds the imports' peak too)
        Path("/proc/self/clear_refs").write_text("5")
        reset = True
    except OSError:
        reset = False
    t0 = time.perf_counter()
    with RssSampler() as rss:
        if path == "direct":
            model = from_pretrained(directory)
        else:
            model = convert(transformers.LlamaForCausalLM.from_pretrained(directory).eval())
        wall = time.perf_counter() - t0
    hwm, maxrss = _status_kib("VmHWM") / 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # The peak is VmHWM once reset: Linux keeps ru_maxrss across fork and exec, so in a child of a large process
    # (a test session) it can hold the parent's RSS rather than anything this conversion did.
    return dict(baseline_mib=baseline / 1024, hwm_mib=hwm, maxrss_mib=maxrss, peak_mib=hwm if reset else maxrss,
                anon_growth_mib=(rss.peak["RssAnon"] - anon) / 1024,
                file_growth_mib=(rss.peak["RssFile"] - file) / 1024, wall_s=wall,
                dtypes=sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()}),
                params=sum(p.numel() for p in model.parameters()))


def _available_mib() -> float:
    text = Path("/proc/meminfo").read_text()
    return int(re.search(r"^MemAvailable:\s+(\d+)", text, re.M).group(1)) / 1024


def section_convert(sess: Session) -> str:
    s = sess.settings
    head = "## Conversion from safetensors"
    if not Path("/proc/self/status").exists():
        return f"{head}\n\nskipped: needs Linux /proc to read the resident set size.\n"
    try:
        _require("transformers")
    except NotInstalled as e:
        return f"{head}\n\nskipped: {e}\n"
    shape = CONVERT_LLAMAS[s.convert_llama]
    rows, results = [], {}
    model = random_llama(s.convert_llama)
    params = sum(p.numel() for p in model.parameters())
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    size_mib = size / 2**20
    need = 4 * size_mib + 2048  # the transformers path holds two copies, plus the interpreters
    if _available_mib() < need:
        return f"{head}\n\nskipped: {_available_mib():.0f} MiB available, about {need:.0f} MiB needed.\n"
    with tempfile.TemporaryDirectory(prefix="zoo-bench-convert-") as tmp:
        t0 = time.perf_counter()
        save_random_llama(model, Path(tmp))
        del model
        gc.collect()
        make_s = time.perf_counter() - t0
        shards = len(list(Path(tmp).glob("*.safetensors")))
        for path in CONVERT_PATHS:
            r = run_probe(["--convert-probe", f"{path}:{tmp}"], s, timeout=1200)
            if isinstance(r, str):
                rows.append([path, "-", "-", "-", "-", "-", "-", "-", "-", "-", r])
                continue
            results[path] = r
            r["ratio"] = (r["peak_mib"] - r["baseline_mib"]) / size_mib
            rows.append([path, num(r["baseline_mib"]), num(r["maxrss_mib"]), num(r["hwm_mib"]),
                         f"{r['ratio']:.2f}x", f"{r['anon_growth_mib'] / size_mib:.2f}x", num(r["file_growth_mib"]),
                         f"{r['wall_s']:.1f}", ", ".join(r["dtypes"]), r["params"], ""])
    verdict = ""
    if s.quick:
        verdict = " Quick run: at this size the growth is fixed overhead, and the ratio means nothing."
    elif "direct" in results:
        ok = results["direct"]["ratio"] <= 1.3
        verdict = (f" The promise (peak growth at most 1.3x the weights) is {'kept' if ok else '**NOT kept**'}: "
                   f"{results['direct']['ratio']:.2f}x.")
    fields = ", ".join(f"{k} {v}" for k, v in shape.items())
    return "\n".join([
        head, "",
        f"A random Llama ({fields}; {params} parameters) saved by transformers' `save_pretrained` in bf16, "
        f"{shards} safetensors shard(s), {size_mib:.0f} MiB ({size / 1e9:.2f} GB) of weights (made in {make_s:.0f} s: "
        "built on meta, `to_empty`, one normal_ fill per tensor). Each path runs in a fresh process: import torch, "
        "transformers (with the Llama model code) and zoo.convert, read the resident set size (`baseline`), reset "
        "the kernel's peak counter (VmHWM), convert, read VmHWM and `ru_maxrss`. `growth / weights` = (VmHWM - "
        "baseline) / the weights' size; `ru_maxrss` is shown but not used: it is never reset, holds the imports' "
        "peak and, as Linux keeps it across fork and exec, can hold the parent process's RSS. VmHWM counts "
        "allocations and file-backed pages (a memory-mapped file) alike, though the kernel can drop the latter: "
        "`anon growth / weights` is the peak of RssAnon (allocations) over its baseline and `file growth` the "
        "peak of RssFile over its baseline, both sampled every millisecond by a thread (zoo.bench.RssSampler)."
        + verdict, "",
        "\n".join(f"- {k}: {v}" for k, v in CONVERT_PATHS.items()), "",
        table(["path", "baseline RSS MiB", "peak ru_maxrss MiB", "peak VmHWM MiB", "growth / weights",
               "anon growth / weights", "file growth MiB", "wall s", "result dtype", "params", "notes"], rows), ""])


RUNNERS: dict[str, Callable[[Session], str]] = {
    "train": section_train, "compile": section_compile, "generate": section_generate, "kv": section_kv,
    "mfu": section_mfu, "memory": section_memory, "overhead": section_overhead, "precision": section_precision,
    "norm": section_norm, "profile": section_profile, "ttt": section_ttt, "choices": section_choices,
    "data": section_data,
    "convert": section_convert,
}


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def kind_label(s: Settings) -> str:
    """The kind of processor a timing section's heading names: the GPU with --device cuda, else what computes
    bf16 on this CPU (zoo.hardware.cpu_kind: 'AMX', 'AVX-512 BF16', or 'no native bf16')."""
    if s.device != "cpu":
        return torch.cuda.get_device_name(torch.device(s.device))
    from zoo import hardware

    return hardware.CPU_BF16.get(hardware.cpu_kind(), "no native bf16")


def _with_kind(text: str, label: str) -> str:
    """A section's text with its heading naming the processor kind: '## Training step' -> '## Training step (AMX)'."""
    heading, _, rest = text.partition("\n")
    return f"{heading} ({label})\n{rest}"


def machine_info(s: Settings) -> list[tuple[str, str]]:
    cpu, flags = platform.processor() or "unknown", ""
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
        cpu = m.group(1).strip() if m else cpu
        m = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
        flags = m.group(1) if m else ""
    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in flags.split()]
    nano = "-"
    if s.nanogpt is not None:
        nano = str(s.nanogpt)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            commit = subprocess.run(["git", "-C", str(s.nanogpt), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()
            nano += f" ({commit})" if commit else ""
    return [
        ("CPU", f"{cpu}, {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}, "
                f"capability {torch.backends.cpu.get_cpu_capability()}, bf16 flags: {', '.join(bf16) or 'none'}"),
        *([("GPU", f"{torch.cuda.get_device_name(torch.device(s.device))}, CUDA {torch.version.cuda}")]
          if s.device != "cpu" else []),
        ("OS", platform.platform()), ("Python", platform.python_version()), ("torch", torch.__version__),
        ("transformers", _version("transformers")), ("x-transformers", _version("x-transformers")),
        ("nanoGPT", nano), ("date", time.strftime("%Y-%m-%d %H:%M %Z")), ("load average at start", _load()),
    ]


def _load(short: bool = False) -> str:
    """The 1-minute load average; above the core count, processes were competing for the cores."""
    with contextlib.suppress(OSError, AttributeError):
        return f"{os.getloadavg()[0]:.2f}" + ("" if short else f" on {os.cpu_count()} cores")
    return "unknown"


def report(sections: dict[str, str], s: Settings, argv: Sequence[str],
           info: list[tuple[str, str]] | None = None) -> str:
    lines = ["# Benchmarks", "",
             "Generated by `python -m zoo.bench` (see `python -m zoo.bench --help`); do not edit by hand, rerun it. "
             "Compare ratios measured in the same run, not absolute numbers across runs or machines. Each section "
             "ends with the load average at its start and end: a load well above the core count means other "
             "processes were competing for the cores and the timings of that section are disturbed.", "",
             "Command: `" + shlex.join(["python", "-m", "zoo.bench", *_without_out(argv)])
             + _needs(argv) + "`", "",
             table(["", ""], info or machine_info(s)), ""]
    if s.quick:
        lines += ["**Quick smoke run (`--quick`): too few steps to be a measurement.**", ""]
    return "\n".join(lines + [sections[k] for k in SECTIONS if k in sections]).rstrip() + "\n"


def _needs(argv: Sequence[str]) -> str:
    """The docs' marker on a command that needs what a test machine lacks (tests/test_docs.py skips it)."""
    return "   # needs: a karpathy/nanoGPT checkout" if "--nanogpt" in argv else ""


def _without_out(argv: Sequence[str]) -> list[str]:
    """The command line minus `--out PATH`: where the report went does not change what it measured."""
    out, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--out="):
            skip = False
            continue
        skip = arg == "--out"
        if not skip:
            out.append(arg)
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m zoo.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections: {','.join(SECTIONS)}")
    p.add_argument("--quick", action="store_true", help="a fast smoke run with few steps")
    p.add_argument("--out", default="docs/benchmarks.md", help="Markdown file to write ('-' for stdout only)")
    p.add_argument("--shapes", default=None, help=f"comma-separated, of {','.join(SHAPES)} (default small,large)")
    p.add_argument("--peers", default=",".join(PEERS), help="contenders to include: zoo,hf,xt,nanogpt")
    p.add_argument("--nanogpt", default=None, help="a karpathy/nanoGPT checkout (directory with model.py)")
    p.add_argument("--rounds", type=int, default=None, help="fixed number of interleaved rounds")
    p.add_argument("--target-s", type=float, default=None, help="timed seconds per contender (default 3)")
    p.add_argument("--gen-contexts", default=None, help="comma-separated prompt lengths for generation")
    p.add_argument("--gen-shape", default=None, help="shape of the generation model (default large)")
    p.add_argument("--kv-context", type=int, default=None, help="context for the KV-cache size table")
    p.add_argument("--train-steps", type=int, default=None, help="steps for the train.py overhead section")
    p.add_argument("--train-args", default="", help="extra overrides passed to train.py (one string)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--text", default=None, help="ttt: the text file both sides train on (e.g. tinyshakespeare.txt)")
    p.add_argument("--ttt-pairs", type=int, default=None, help="ttt: rounds of every contender (default 3)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N for the mfu section on a GPU")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="a datasheet's dense bf16 peak in TFLOP/s (e.g. 989 for an H100 SXM): MFU against it too")
    p.add_argument("--memory-steps", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)  # SHAPE:VARIANT, internal
    p.add_argument("--convert-probe", default=None, help=argparse.SUPPRESS)  # PATH:DIRECTORY, internal
    p.add_argument("--bare-loop", type=int, default=None, help=argparse.SUPPRESS)  # internal
    p.add_argument("--bare-spec", default=None, help=argparse.SUPPRESS)  # internal: JSON for bare_loop
    p.add_argument("--spawned-at", type=float, default=None, help=argparse.SUPPRESS)  # internal
    return p.parse_args(argv)


def settings_from_args(a: argparse.Namespace) -> Settings:
    over: dict = {}
    if a.shapes:
        over["shapes"] = tuple(x for x in a.shapes.split(",") if x)
        bad = [x for x in over["shapes"] if x not in SHAPES]
        if bad:
            raise SystemExit(f"--shapes: unknown '{bad[0]}'; valid: {', '.join(SHAPES)}")
    over["peers"] = tuple(x for x in a.peers.split(",") if x)
    if a.nanogpt:
        over["nanogpt"] = Path(a.nanogpt).expanduser().resolve()
    if a.rounds:
        over.update(min_rounds=a.rounds, max_rounds=a.rounds, target_s=0.0)
    if a.target_s is not None:
        over["target_s"] = a.target_s
    if a.gen_contexts:
        over["gen_contexts"] = tuple(int(x) for x in a.gen_contexts.split(",") if x)
    if a.gen_shape:
        over["gen_shape"] = a.gen_shape
    if a.kv_context:
        over["kv_context"] = a.kv_context
    if a.train_steps:
        over["overhead_steps"] = a.train_steps
    if a.memory_steps:
        over["memory_steps"] = a.memory_steps
    if a.text:
        over["text"] = Path(a.text).expanduser().resolve()
    if a.ttt_pairs:
        over["ttt_pairs"] = a.ttt_pairs
    over["train_args"] = tuple(shlex.split(a.train_args))
    over["threads"] = a.threads
    over["device"], over["peak_tflops"] = a.device, a.peak_tflops
    if not re.fullmatch(r"cpu|cuda(:\d+)?", a.device):
        raise SystemExit(f"--device: unknown '{a.device}'; valid: cpu, cuda, cuda:N")
    if a.device != "cpu":
        if not torch.cuda.is_available():
            raise SystemExit(f"--device: '{a.device}' but this machine has no CUDA GPU; valid here: cpu")
        bad = [x for x in a.only.split(",") if x and x != "mfu"]
        if bad:
            raise SystemExit(f"--only: section '{bad[0]}' runs on CPU only; valid with --device {a.device}: mfu")
        if not a.quick:
            over["matmul_n"] = 8192  # a GPU's peak needs a large product (2048 is launch-bound)
    return Settings.quick_run(**over) if a.quick else Settings(**over)


def run_sections(names: Sequence[str], s: Settings, argv: Sequence[str] = (), out: Path | None = None,
                 echo: bool = True) -> str:
    """Run the named sections in order; write `out` after each one, so a crash keeps what finished.

    A run of some sections replaces just those in an existing report (the others are kept), each stamped
    with its own command and machine. Nothing is written under docs/ by a section whose load average, at its
    start or end, was above the core count: a busy machine's timings must not become the record."""
    sess, done, info, label = Session(s), {}, machine_info(s), kind_label(s)
    old = out.read_text() if out is not None and out.is_file() and set(names) != set(SECTIONS) else None
    for name in [n for n in SECTIONS if n in names]:
        t0 = time.perf_counter()
        if echo:
            print(f"[zoo.bench] {name} ...", flush=True)
        load = _load()
        busy = _load_value(load)
        text = RUNNERS[name](sess)
        done[name] = (_with_kind(text, label) if name in PER_KIND else text).rstrip() + \
            f"\n\n_Section time {time.perf_counter() - t0:.0f} s; load average {load} at its start, " \
            f"{_load()} at its end._\n"
        if echo:
            print(done[name], f"[zoo.bench] {name}: {time.perf_counter() - t0:.0f} s", sep="\n", flush=True)
        busy = max(busy, _load_value())
        if out is not None and "docs" in out.resolve().parts and busy > (os.cpu_count() or 1) and not s.quick:
            print(f"[zoo.bench] not written to {out}: the load average reached {busy:.2f} on {os.cpu_count()} "
                  "cores during this section; rerun on a quiet machine (or pass --out elsewhere)", flush=True)
            out = None
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out, splice(old, done, argv, info) if old else report(done, s, argv, info))
            print(f"[zoo.bench] wrote {name} to {out}", flush=True)
    return report(done, s, argv, info)


def _load_value(text: str | None = None) -> float:
    """The 1-minute load average as a number (0 where unknown)."""
    try:
        return float((text or _load(short=True)).split()[0])
    except ValueError:
        return 0.0


def splice(old: str, sections: dict[str, str], argv: Sequence[str], info: list[tuple[str, str]]) -> str:
    """An existing report with `sections` put in place of the ones of the same heading, each stamped with the
    command and machine it was measured with: the other sections keep their own runs. A section new to the report
    goes right after its copies for other processor kinds (the same heading before ' ('), so the kinds stand side
    by side, or else at the end."""
    cpu = dict(info).get("CPU", "unknown")
    for text in sections.values():
        heading = text.splitlines()[0]
        command = shlex.join(["python", "-m", "zoo.bench", *_without_out(argv)])
        stamped = text.rstrip() + f"\n\n_This section alone: `{command}{_needs(argv)}` on {cpu}, " \
            f"{time.strftime('%Y-%m-%d')}._\n"
        start = old.find(heading + "\n")
        if start >= 0:
            end = _section_end(old, start)
            old = old[:start] + stamped + ("\n" + old[end + 1:] if end >= 0 else "")
            continue
        base = heading.rsplit(" (", 1)[0]
        kin = [m.start() for m in re.finditer(rf"^{re.escape(base)}( \(.*\))?$", old, re.M)]
        end = _section_end(old, kin[-1]) if kin else -1
        old = old.rstrip() + "\n\n" + stamped if end < 0 else old[:end] + "\n" + stamped + old[end:]
    return old.rstrip() + "\n"


def _section_end(text: str, start: int) -> int:
    """Where the section starting at `start` ends: the newline before the next '## ' heading, or -1 at the end."""
    return text.find("\n## ", text.find("\n", start))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    s = settings_from_args(a)
    if a.threads:
        torch.set_num_threads(a.threads)
    if s.device != "cpu":
        torch.backends.cuda.matmul.allow_tf32 = True  # as trainer=gpu's tf32=true
    if a.memory_probe:
        shape_name, key = a.memory_probe.split(":", 1)
        print(json.dumps(memory_probe(shape_name, key, s)))
        return 0
    if a.convert_probe:
        path, directory = a.convert_probe.split(":", 1)
        print(json.dumps(convert_probe(directory, path)))
        return 0
    if a.bare_loop:
        spec = json.loads(a.bare_spec) if a.bare_spec else None
        print(json.dumps(bare_loop(a.bare_loop, a.spawned_at or time.time(), spec)))
        return 0
    names = [x for x in a.only.split(",") if x]
    bad = [x for x in names if x not in SECTIONS]
    if bad:
        raise SystemExit(f"--only: unknown section '{bad[0]}'; valid: {', '.join(SECTIONS)}")
    out = None if a.out == "-" else Path(a.out)
    run_sections(names, s, argv, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
