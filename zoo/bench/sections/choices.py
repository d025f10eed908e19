"""The choices section: the rows behind zoo.hardware's and zoo.kernels' rules on this CPU kind: low-precision
attention on the fused kernel against the written-out form, the written-out form's softmax under torch.compile,
and AdamW's kernels."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo import hardware
from zoo.bench.contenders import FAMILY_LABELS, lm_loss, zoo_config, zoo_model
from zoo.bench.markdown import ms, ratio, table
from zoo.bench.registry import section
from zoo.bench.session import Session, batch
from zoo.bench.settings import SHAPES, Settings, Shape
from zoo.bench.timing import interleave
from zoo.kernels import KERNELS, attention
from zoo.layers.attention import attention_weights


@contextlib.contextmanager
def attention_path(fused_from: int | None, softmax_kernel: bool = True):
    """Low-precision attention training on the fused kernel from key length `fused_from` (0: always, None:
    never), the written-out form's softmax on zoo's kernel where it builds (compiled or not) or in torch ops,
    whatever zoo.kernels' rules chose for this CPU (the models have zoo.kernels' pass applied)."""
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


@section("choices")
def section_choices(sess: Session) -> str:
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
