"""The compile section: zoo with torch.compile, bf16 autocast and both, as ratios to zoo float32 eager (and nanoGPT
float32 / bf16 / compile+bf16 when given), compile time measured from empty caches."""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import replace

import torch

from zoo.bench.contenders import FAMILY_LABELS, LABELS
from zoo.bench.markdown import ms, num, ratio, table
from zoo.bench.registry import section
from zoo.bench.session import Session, Variant, measure_group
from zoo.bench.settings import SHAPES


@contextlib.contextmanager
def cold_compile_caches():
    """Compile from scratch, as a first run would: a fresh Inductor cache directory, and the FX-graph and
    AOTAutograd caches off (otherwise a second benchmark run reports the time of a cache hit)."""
    # lazy: torch._inductor (1.0 s CPU after torch), only for the compile section
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


@section("compile")
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
