"""The memory section: peak RSS growth of a few training steps, one subprocess per contender."""

from __future__ import annotations

import gc
from pathlib import Path

from zoo.bench.contenders import FAMILY_LABELS, LABELS
from zoo.bench.markdown import num, table
from zoo.bench.processes import run_probe, status_kib
from zoo.bench.registry import section
from zoo.bench.session import Session, Variant, make_train_run
from zoo.bench.settings import SHAPES, Settings


def memory_probe(shape_name: str, key: str, s: Settings) -> dict:
    """Run in a fresh process: RSS growth (peak minus before) over a few training steps."""
    run = make_train_run(SHAPES[shape_name], Variant.parse(key), s)
    gc.collect()
    before = status_kib("VmRSS")
    try:  # "5" resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
        Path("/proc/self/clear_refs").write_text("5")
        method = "VmHWM after reset"
    except OSError:
        method = "VmHWM (not reset: includes the imports' peak)"
    for _ in range(s.memory_steps):
        run.step()
    peak = status_kib("VmHWM")
    return dict(before_mib=before / 1024, peak_mib=peak / 1024, delta_mib=max(0, peak - before) / 1024,
                method=method, params=run.params)


@section("memory")
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
