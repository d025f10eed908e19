"""The kv section: KV-cache bytes of MHA, GQA, MQA and MLA, checked against each attention's cache_bytes_per_token, and
decoding latency with each."""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from zoo.bench.markdown import ms, num, ratio, table
from zoo.bench.registry import section
from zoo.bench.sections.generate import StepTimer, generation_model
from zoo.bench.session import Session
from zoo.bench.settings import Settings
from zoo.bench.timing import Stats, interleave
from zoo.generate import generate

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
    # each attention reports its own cache size; a shared block once per layer that applies it
    layers = [model.decoder.blocks[b].attn.f for b in model.decoder.layer_blocks]
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


@section("kv")
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
