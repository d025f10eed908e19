"""The mfu section: achieved FLOP/s of zoo's training steps over a matrix-multiply peak measured in the same run; the
only section that runs on a GPU (`--device cuda`)."""

from __future__ import annotations

import statistics

import torch

import zoo
from zoo.bench.contenders import FAMILY_LABELS, zoo_config
from zoo.bench.markdown import ms, num, table
from zoo.bench.registry import section
from zoo.bench.session import Session, Variant, measure_group
from zoo.bench.settings import SHAPES


@section("mfu")
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
