"""The GPU rung checked once on a machine with a CUDA GPU (scripts/gpu_check.sh runs this with --device cuda):

    python scripts/gpu_check.py                          # everything on cuda, a few minutes on one H100/H200
    python scripts/gpu_check.py --device cpu --tiny      # the same steps at toy sizes on CPU (tests/test_gpu_check.py)

Steps (--steps picks some):
- train     every lineage trains a few steps as `python train.py trainer=gpu compile=true` would (bf16-mixed, TF32,
            fused AdamW, sdpa), in this process; each must complete with a finite val_loss;
- generate  KV-cached decoding against full recomputation in bf16 on the device, for every generating lineage
            with every position and attention: teacher-forced logits within bf16 rounding, and greedy tokens
            equal (a difference is allowed only where the two best tokens were a near tie);
- flash     sdpa runs the GPT-2 small attention (causal, bf16, forward and backward) with only the flash
            kernel allowed: zoo's attention reaches flash attention (CUDA only);
- mfu       zoo.bench's mfu section at the GPT-2 small shape (batch 12 x 1024, 124M): float32 (TF32), bf16 and
            bf16 + torch.compile, against the measured matmul peak and, for a known GPU, its datasheet peak.

It ends with a summary to paste into docs/benchmarks.md and writes it, with the mfu section's Markdown and the
figures as JSON, under --out. Exit code 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS = ("train", "generate", "flash", "mfu")
# Dense bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s (the first name found in the device's name).
DATASHEET_BF16 = {"H100 PCIe": 756, "H100": 989, "H200": 989, "A100": 312}


def datasheet_peak(device_name: str) -> float | None:
    return next((v for k, v in DATASHEET_BF16.items() if k in device_name), None)


def check_train(device: str, tiny: bool, compile_: bool, out: Path, lineages: list[str] | None = None) -> list[dict]:
    """A few steps of every lineage (or those named) through zoo.training.run, as train.py runs them."""
    import torch
    from hydra import compose, initialize_config_dir

    from zoo.commands import config_dir
    from zoo.registry import MODEL
    from zoo.training import run

    steps = 2 if tiny else 30
    size = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.context=16", "data.batch_size=4"] \
        if tiny else ["data.batch_size=32", "data.context=256"]
    where = ["trainer=gpu", f"trainer.devices=[{int(device.partition(':')[2] or 0)}]"] if device != "cpu" \
        else ["trainer=cpu", "trainer.precision=bf16-mixed"]
    results = []
    for lineage in lineages or MODEL.names():
        torch._dynamo.reset()  # each lineage compiles afresh, never past dynamo's recompile limit into eager
        overrides = [f"model={lineage}", *where, *size, f"compile={str(compile_).lower()}",
                     f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "data.eval_batches=2",
                     "logger=none", "sample.max_new_tokens=0", "+trainer.enable_checkpointing=false", "overwrite=true"]
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        run_dir = out / "runs" / lineage
        t0 = time.perf_counter()
        code = run(cfg, run_dir=run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        loss = summary.get("final", {}).get("val_loss")
        ok = code == 0 and summary.get("status") == "completed" and loss is not None and math.isfinite(loss)
        results.append({"lineage": lineage, "ok": ok, "val_loss": loss, "steps": summary.get("steps"),
                        "tokens_per_second": summary.get("tokens_per_second"), "seconds": time.perf_counter() - t0,
                        "overrides": overrides})
    return results


def generation_cases(tiny: bool = False) -> list[dict]:
    """Every generating lineage with every position (MHA), and every attention with RoPE, plus a sliding window;
    tiny: two positions and two attentions per lineage."""
    from zoo.registry import ATTENTION, MODEL, POSITION

    base = dict(vocab_size=101, d_model=64, n_layers=2, n_heads=4, max_seq_len=64, init_std=0.3, dropout=0.0)
    extra = {"gqa": {"n_kv_heads": 2}}
    cases = []
    for lineage in (n for n in MODEL.names() if MODEL.get(n).generates):
        for position in ("learned", "alibi") if tiny else POSITION.names():
            cases.append({**base, "name": lineage, "position": {"name": position}})
        for attention in ("gqa", "mla") if tiny else ATTENTION.names():
            cases.append({**base, "name": lineage, "position": {"name": "rope"},
                          "attention": {"name": attention, **extra.get(attention, {})}})
        cases.append({**base, "name": lineage, "position": {"name": "rope"}, "attention": {"name": "mha", "window": 8}})
    return cases


def check_generate(device: str, tiny: bool = False) -> list[dict]:
    """bf16 on the device: cached logits against recomputed ones, then greedy generation with and without cache."""
    import torch

    from zoo import build_model
    from zoo.generate import generate

    results = []
    for i, cfg in enumerate(generation_cases(tiny)):
        model = build_model(cfg, seed=i).to(device, torch.bfloat16).eval()
        g = torch.Generator().manual_seed(i)
        seq = torch.randint(0, cfg["vocab_size"], (2, 24), generator=g).to(device)
        src = torch.randint(0, cfg["vocab_size"], (2, 9), generator=g).to(device) if model.needs_source else None
        memory = model.encode(src) if src is not None else None

        def logits(tokens, cache=None, model=model, memory=memory):
            return model.head(model.decoder(tokens, memory=memory, cache=cache)).float()

        with torch.no_grad():
            full = logits(seq)
            cache = model.new_cache()
            steps = [logits(seq[:, :8], cache)] + [logits(seq[:, t:t + 1], cache) for t in range(8, 24)]
            cached = torch.cat(steps, dim=1)
        scale = full.abs().max().item()
        rel = (cached - full).abs().max().item() / scale
        prompt = seq[:, :4]
        a = generate(model, prompt, 24, src=src)
        b = generate(model, prompt, 24, src=src, use_cache=False)
        same, margin = torch.equal(a, b), None
        if not same:  # the first step where they part: how close were the two best tokens there?
            t = int((a != b).any(0).nonzero()[0])
            with torch.no_grad():
                top2 = logits(b[:, :t])[:, -1].topk(2).values
            margin = (top2[:, 0] - top2[:, 1]).min().item() / scale
        # bf16 keeps 8 significant bits: two layers of its rounding moved logits by up to 2% of the largest on
        # CPU; a wrong position, mask or cache moves them by 80% or more (tests/test_gpu_check.py). 10% between.
        ok = rel < 0.1 and (same or margin < 0.05)
        name = f"{cfg['name']}/{cfg.get('attention', {'name': 'mha'})['name']}" + \
            (f"(window {cfg['attention']['window']})" if "window" in cfg.get("attention", {}) else "") + \
            f"/{cfg['position']['name']}"
        results.append({"case": name, "ok": ok, "logits_rel_diff": rel, "greedy_equal": same,
                        "tie_margin": margin})
    return results


def check_flash(device: str) -> list[dict]:
    """The GPT-2 small attention under sdpa_kernel(FLASH_ATTENTION) alone: an error means zoo never reaches flash."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from zoo import build_model
    from zoo.bench import SHAPES, zoo_config

    if not device.startswith("cuda"):
        return [{"attention": "all", "ok": True, "flash": None, "note": "flash attention is CUDA only: not checked"}]
    shape = SHAPES["gpt2_small"]
    results = []
    for family in ("gpt2", "llama"):  # MHA with learned positions; GQA (enable_gqa) with RoPE
        cfg = {**zoo_config(shape, family), "n_layers": 1}
        model = build_model(cfg).to(device)
        x = torch.randint(0, shape.vocab, (2, shape.context), device=device)
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
                model(x).float().mean().backward()
            flash, note = True, ""
        except RuntimeError as e:
            flash, note = False, str(e).splitlines()[0][:160]
        name = cfg.get("attention", {}).get("name", "mha")
        # MHA must reach flash (the GPT-2 preset); GQA is reported (torch's flash kernel takes it from 2.5 on)
        results.append({"attention": name, "ok": flash or name != "mha", "flash": flash, "note": note})
    return results


def check_mfu(device: str, tiny: bool, out: Path) -> tuple[list[dict], str]:
    import torch

    from zoo import bench
    from zoo.bench.sections.mfu import section_mfu

    shape = "tiny" if tiny else "gpt2_small"
    cuda = device.startswith("cuda")
    peak = datasheet_peak(torch.cuda.get_device_name(torch.device(device))) if cuda else None
    settings = bench.Settings.quick_run(matmul_n=128, matmul_repeats=2) if tiny else bench.Settings(
        matmul_n=8192 if cuda else 2048)
    settings = replace(settings, shapes=(shape,), peers=("zoo",), device=device, peak_tflops=peak)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # as trainer=gpu's tf32=true
    sess = bench.Session(settings)
    md = section_mfu(sess)
    (out / "mfu.md").write_text(md)
    return [{**r, "ok": r["mfu"] > 0} for r in sess.mfu], md


def summary_lines(device_name: str, results: dict) -> list[str]:
    import torch

    lines = [f"zoo GPU check on {device_name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"]
    if "train" in results:
        parts = [f"{r['lineage']} {'ok' if r['ok'] else 'FAILED'} (val_loss {r['val_loss']:.3f}, "
                 f"{r['tokens_per_second']:.0f} tok/s)" if r["val_loss"] is not None else f"{r['lineage']} FAILED"
                 for r in results["train"]]
        how = " ".join(o for o in results["train"][0]["overrides"] if o.startswith(("trainer=", "trainer.precision",
                                                                                      "compile=", "trainer.max_steps")))
        lines.append(f"train ({how}): " + "; ".join(parts))
    if "generate" in results:
        rs = results["generate"]
        bad = [r["case"] for r in rs if not r["ok"]]
        ties = sum(1 for r in rs if not r["greedy_equal"])
        lines.append(f"generate (bf16, KV cache vs recomputation): {len(rs) - len(bad)}/{len(rs)} cases match, "
                     f"largest logit difference {100 * max(r['logits_rel_diff'] for r in rs):.2f}% of the largest "
                     f"logit, {ties} greedy runs parted at a near tie" + (f"; FAILED: {', '.join(bad)}" if bad else ""))
    if "flash" in results:
        lines.append("flash attention through sdpa (GPT-2 small layer, bf16, causal): " + "; ".join(
            f"{r['attention']} {'yes' if r['flash'] else ('no: ' + r['note'] if r['flash'] is False else r['note'])}"
            for r in results["flash"]))
    if "mfu" in results:
        for r in results["mfu"]:
            sheet = f", {100 * r['mfu_datasheet']:.1f}% of the datasheet peak" if r["mfu_datasheet"] else ""
            lines.append(f"MFU {r['shape']} {r['family']} {r['mode']}: {1e3 * r['step_s']:.1f} ms/step, "
                         f"{r['tokens_per_s']:.0f} tok/s, {r['achieved'] / 1e12:.1f} TFLOP/s, {100 * r['mfu']:.1f}% of "
                         f"the measured matmul peak{sheet}")
    return lines


def main(argv: list[str] | None = None) -> int:
    head, _, rest = __doc__.partition("\n\n")
    p = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=head, epilog=rest,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (the same steps, for a dry run)")
    p.add_argument("--tiny", action="store_true", help="toy sizes: seconds instead of minutes")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, of {','.join(STEPS)}")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile in the train step (default: on for cuda, off for cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's; 1 with --tiny)")
    p.add_argument("--out", default=None, help="directory for summary.txt, results.json, mfu.md (default: a temp dir)")
    a = p.parse_args(argv)
    steps = [s for s in a.steps.split(",") if s]
    if bad := [s for s in steps if s not in STEPS]:
        print(f"error: --steps: unknown '{bad[0]}'; valid: {', '.join(STEPS)}", file=sys.stderr)
        return 2
    import torch

    if a.threads or a.tiny:
        torch.set_num_threads(a.threads or 1)
    if a.device != "cpu":
        if not a.device.startswith("cuda") or not torch.cuda.is_available():
            print(f"error: --device: '{a.device}' needs a CUDA GPU, and this machine has none; valid here: cpu "
                  "(a dry run)", file=sys.stderr)
            return 2
        device_name = torch.cuda.get_device_name(torch.device(a.device))
    else:
        device_name = "CPU (dry run)"
    compile_ = a.device != "cpu" if a.compile is None else a.compile
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="zoo-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    results, failed = {}, []
    for step in steps:
        t0 = time.perf_counter()
        print(f"[gpu_check] {step} ...", flush=True)
        try:
            if step == "train":
                results[step] = check_train(a.device, a.tiny, compile_, out)
            elif step == "generate":
                results[step] = check_generate(a.device, a.tiny)
            elif step == "flash":
                results[step] = check_flash(a.device)
            else:
                results[step], md = check_mfu(a.device, a.tiny, out)
                print(md, flush=True)
        except Exception:
            traceback.print_exc()
            results[step] = [{"ok": False, "error": traceback.format_exc(limit=3)}]
        if not all(r["ok"] for r in results[step]):
            failed.append(step)
        print(f"[gpu_check] {step}: {'ok' if step not in failed else 'FAILED'} in {time.perf_counter() - t0:.0f} s",
              flush=True)
    try:
        lines = summary_lines(device_name, {k: v for k, v in results.items() if k not in failed or k == "generate"})
    except (KeyError, TypeError):  # a step that crashed has no figures
        lines = [f"zoo GPU check on {device_name}"]
    lines.append("all checks passed" if not failed else f"FAILED: {', '.join(failed)}")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print("\n=== summary (for docs/benchmarks.md) ===\n" + "\n".join(lines) + f"\n(written to {out})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
