"""The convert section: peak memory and time of `zoo.convert.from_pretrained` on a random Llama saved in bf16
safetensors, against transformers' from_pretrained + convert."""

from __future__ import annotations

import gc
import re
import resource
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from zoo.bench.contenders import NotInstalled, require
from zoo.bench.markdown import num, table
from zoo.bench.processes import run_probe, status_kib
from zoo.bench.registry import section
from zoo.bench.session import Session
from zoo.convert import convert, from_pretrained

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
    tf = require("transformers")
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
    # optional: bench (transformers; a probe in its own process)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.LlamaForCausalLM  # noqa: B018 (imports the model code before the baseline)
    gc.collect()
    baseline = status_kib("VmRSS")
    anon, file = status_kib("RssAnon"), status_kib("RssFile")
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
    hwm, maxrss = status_kib("VmHWM") / 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
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


@section("convert")
def section_convert(sess: Session) -> str:
    s = sess.settings
    head = "## Conversion from safetensors"
    if not Path("/proc/self/status").exists():
        return f"{head}\n\nskipped: needs Linux /proc to read the resident set size.\n"
    try:
        require("transformers")
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
        "peak of RssFile over its baseline, both sampled every millisecond by a thread "
        "(zoo.bench.sections.convert.RssSampler)."
        + verdict, "",
        "\n".join(f"- {k}: {v}" for k, v in CONVERT_PATHS.items()), "",
        table(["path", "baseline RSS MiB", "peak ru_maxrss MiB", "peak VmHWM MiB", "growth / weights",
               "anon growth / weights", "file growth MiB", "wall s", "result dtype", "params", "notes"], rows), ""])

