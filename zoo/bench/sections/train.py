"""The train section: a training step (forward + backward + AdamW step) of zoo's GPT-2-style and Llama-style models
against Hugging Face, x-transformers and (with `--nanogpt PATH`) nanoGPT, all of the same shape, random weights,
dropout 0."""

from __future__ import annotations

from zoo.bench.contenders import FAMILY_LABELS, LABELS, PEERS
from zoo.bench.markdown import ms, num, ratio, table
from zoo.bench.registry import section
from zoo.bench.session import Session, Variant, measure_group
from zoo.bench.settings import SHAPES


@section("train")
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
