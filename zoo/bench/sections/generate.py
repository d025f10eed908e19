"""The generate section: per-token decoding latency with and without the KV cache at growing contexts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch
from torch import nn

from zoo.bench.contenders import zoo_config, zoo_model
from zoo.bench.markdown import ms, ratio, table
from zoo.bench.registry import section
from zoo.bench.session import Session
from zoo.bench.settings import SHAPES, Settings
from zoo.bench.timing import Stats, interleave
from zoo.generate import generate


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


@section("generate")
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
