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
- overhead  zoo's training command (`python -m zoo train`, which train.py runs) against a bare PyTorch loop;
- precision a short training run at the large shape in float32 and bf16-mixed: validation loss and speed;
- ttt       time to a target validation loss: zoo's training command against nanoGPT's train.py on the same text file
            (`--text PATH`, e.g. tinyshakespeare) and the same recipe, back to back, from process start;
- choices   the rows behind zoo.hardware's rules on this CPU kind: low-precision attention on the fused kernel
            against the written-out form (whole models and attention alone by key length), the written-out
            form's softmax under torch.compile (zoo's kernel against inductor's fusion), and AdamW's
            for-loop, foreach and fused kernels (fp32 parameters), each against what the rule picks here;
- data      `zoo-prepare` throughput against the tokenizer's own batch encode (byte-level BPE and char), and
            data=tokens batches per second at the GPT-2 small shape against a training step at that shape.
- convert   peak memory and time of `zoo.convert.from_pretrained` on a random ~1B-parameter Llama saved in
            bf16 safetensors (straight onto the meta device), against transformers' from_pretrained + convert.

Layout: timing.py (rounds, rotation, medians), contenders/ (one file per implementation timed), session.py (a
training step of any contender, timed in groups), sections/ (one file per section, each registered by name in
registry.py's SECTIONS, which `--only` reads), markdown.py and writer.py (the report: one block per processor
kind in docs/benchmarks.md), machine.py, processes.py (probes in fresh processes, training runs), cli.py.
A new section is a file in sections/ whose function, `@section("name")` over `def section_name(sess: Session) ->
str`, returns its Markdown under one '## ' heading; sections/__init__.py imports it at its place in the report.

Timing: every contender is warmed up, then the contenders of a group run round-robin (A B C A B C ...,
the starting contender rotating each round), so slow drifts of a shared, noisy machine hit all of them
alike. Tables give the median and the interquartile range (q3 - q1); ratios are of medians measured in
the same group. Peers are imported lazily; a missing one is reported as "not installed".

torch's intra-op thread count is left at its default unless `--threads N` is given. On a small machine
shared with other jobs, the default (one thread per core) slows down many-fold whenever another process
runs, while `--threads 1` barely does; each section records the load average so a disturbed run shows.
"""

from zoo.bench.cli import main, parse_args, settings_from_args
from zoo.bench.contenders import zoo_config
from zoo.bench.registry import SECTIONS, section
from zoo.bench.session import Session, Variant, make_train_run
from zoo.bench.settings import SHAPES, Settings, Shape
from zoo.bench.timing import Stats, interleave

# What scripts use (scripts/compare_revisions.py imports these names from either revision's zoo.bench).
__all__ = ["SECTIONS", "SHAPES", "Session", "Settings", "Shape", "Stats", "Variant", "interleave", "main",
           "make_train_run", "parse_args", "section", "settings_from_args", "zoo_config"]
