"""zoo.kernels: every kernel agrees with its component's formula (kernels=none) within its documented tolerance,
forward and backward; the pass keeps the model's state as it was; the policy, the build and the layering."""

import copy
import os
import shutil
import subprocess
import sys
import textwrap
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import profile

from tests.helpers import case_id, cases, make, tiny_cfg
from zoo import build_model
from zoo.component import ConfigError, option_fields
from zoo.kernels import KERNELS, applied_kernels, apply_kernels, build, check_policy
from zoo.kernels import attention as kattention
from zoo.registry import ATTENTION, NORM, POSITION

# Edge shapes: three heads of 12 (neither a power of two: a scale 1/sqrt(12) that rounds), 13 tokens; each kernel
# is tested on every model below that has a module it serves.
EDGE = dict(d_model=36, n_heads=3, norm={"type": "rmsnorm", "placement": "pre"}, position={"name": "rope"})
MODELS = {
    "mqa": tiny_cfg(**EDGE, attention={"name": "mqa"}),
    "qk_norm": tiny_cfg(**EDGE, attention={"name": "gqa", "n_kv_heads": 3, "qk_norm": True}),
    "math": tiny_cfg(**EDGE, attention={"name": "mha", "backend": "math"}),
    "mla": tiny_cfg(**EDGE, attention={"name": "mla", "kv_rank": 16, "rope_dim": 4}),
    "encoder": tiny_cfg("encoder_only", **{**EDGE, "position": {"name": "learned"}}),
}
CASES = [(name, dtype) for name in KERNELS.names() for dtype in sorted(KERNELS.get(name).dtypes, key=str)]


def built(kernel: str) -> None:
    """The kernel can run here: skipped, saying why, without a C++ compiler (zoo runs the formula there by design);
    a compiler that fails to build it fails the test."""
    k = KERNELS.get(kernel)
    if k.source is not None and not build.compiler():
        pytest.skip(f"no C++ compiler (c++ or $CXX): zoo/kernels/{k.source}.cpp cannot be built here")
    assert k.load(), f"{kernel} did not build (see the log in {build.cache_dir()})"


def _step(model, dtype, tokens, weights):
    """Outputs and every gradient of one forward and backward, in `dtype` (low precision: autocast, as trained)."""
    with profile() as prof, torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        out = model(tokens)
        (out.float() * weights).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return out.float(), grads, {e.key for e in prof.key_averages()}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("kernel,dtype", CASES, ids=[f"{n}-{str(d).removeprefix('torch.')}" for n, d in CASES])
def test_every_kernel_agrees_with_the_formula_forward_and_backward(kernel, dtype):
    """kernels=[kernel] against kernels=none on the same weights and batch: outputs and gradients within the
    kernel's documented tolerance (Kernel.tolerance, docs/performance.md) on every model it serves, and on at
    least one of them it did run (the operators executed differ)."""
    built(kernel)
    ran, served = False, 0
    for cfg in MODELS.values():
        torch.manual_seed(0)
        formula = build_model(cfg).train()
        with torch.no_grad():
            for p in formula.parameters():
                p.normal_(std=0.3)  # gains and biases too: no exact ones and zeros to hide an error
        fast = copy.deepcopy(formula)
        if apply_kernels(fast, [kernel], precision=dtype) != [kernel]:
            continue
        served += 1
        tokens, weights = torch.randint(0, 37, (2, 13)), torch.randn(2, 13, 37)
        out, grads, ops = _step(fast, dtype, tokens, weights)
        ref_out, ref_grads, ref_ops = _step(formula, dtype, tokens, weights)
        tol = KERNELS.get(kernel).tolerance[dtype]
        assert _relative(out, ref_out) <= tol and _relative(grads, ref_grads) <= tol, \
            (cfg, _relative(out, ref_out), _relative(grads, ref_grads))
        ran |= ops != ref_ops
    assert served and ran, f"{kernel} served {served} of the test models and ran on none: add a model it serves"


def test_the_pass_keeps_state_and_the_formula_comes_back():
    """Only the classes change: the same parameters, buffers and state_dict keys; a second pass replaces the
    first; kernels=none gives the components' own classes back."""
    model = build_model(MODELS["mqa"])
    classes, state = [type(m) for m in model.modules()], model.state_dict()
    applied = apply_kernels(model, "auto", precision="bf16-mixed")
    assert "rope_cpp" in applied or not build.compiler()
    assert set(applied_kernels(model)) == set(applied) and model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert apply_kernels(model, "auto", precision="bf16-mixed") == applied  # not stacked twice
    assert apply_kernels(model, "none") == [] and [type(m) for m in model.modules()] == classes


def test_auto_picks_by_device_and_precision():
    """A float32 run gets the float32 kernels, a bf16 run the attention ones too, a GPU run none of zoo's CPU
    kernels; rmsnorm_cpu stands in for rmsnorm_cpp only where that one is not applied."""
    def auto(**kw):
        return apply_kernels(build_model(MODELS["mqa"]), "auto", **kw)

    cpp = bool(build.compiler())
    assert auto(precision="32-true") == (["rmsnorm_cpp", "rope_cpp"] if cpp else ["rmsnorm_cpu"])
    assert set(auto(precision="bf16-mixed")) == ({"attention_softmax_cpp", "attention_written_out", "rmsnorm_cpp",
                                                  "rope_cpp"} if cpp else {"attention_written_out", "rmsnorm_cpu"})
    assert auto(device="cuda", precision="bf16-mixed") == []


def test_a_named_kernel_that_cannot_help_says_so_and_an_unknown_name_lists_the_valid_ones(capsys):
    assert apply_kernels(build_model(MODELS["mqa"]), ["attention_written_out"], precision="32-true") == []
    assert capsys.readouterr().err.strip() == ("zoo: kernel attention_written_out not applied: it computes bfloat16, "
                                               "float16, this run float32")
    with pytest.raises(ConfigError) as e:
        check_policy(["rope_cpp", "rope"])
    assert str(e.value) == ("kernels: unknown kernel 'rope'; valid: auto, none, or a list of "
                            + ", ".join(KERNELS.names()))
    with pytest.raises(ConfigError, match="expected a name or a list of names, got 3"):
        check_policy(3)
    assert check_policy("none") == [] and check_policy("rope_cpp") == ["rope_cpp"]


def test_components_import_neither_the_hardware_nor_the_kernels():
    """The components hold their formulas: zoo.layers and zoo.models import no CPU probe and no kernel."""
    code = ("import sys, zoo.layers, zoo.models, zoo.build; print(sorted(m for m in sys.modules "
            "if m in ('zoo.hardware', 'zoo.native') or m.startswith('zoo.kernels')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---- the kernels' own properties, beyond agreeing with the formula ------------------------------------------


def test_rope_cpp_equals_the_formula_in_float32_and_is_closer_to_exact_in_bf16():
    """torch.ops.zoo.rope: in float32 the formula's bits, values and gradients, for queries laid out as attention
    makes them (a transposed view) and at an offset; in bf16 closer to the exact rotation than the formula in bf16
    (it computes in float32 and rounds once); the same in inference mode."""
    from zoo.layers.position import _rotate

    built("rope_cpp")
    rope = make(POSITION, "rope", d_model=48, n_heads=3, max_seq_len=8)
    base = torch.randn(2, 9, 3, 16)  # (B, T, H, hd), as the qkv projection leaves it
    grad = torch.randn(2, 3, 9, 16)
    cos, sin = rope._rows(4, 9).unbind(1)
    exact = _rotate(base.double().transpose(1, 2), cos.double(), sin.double())
    for dtype in (torch.float32, torch.bfloat16):
        x = base.to(dtype).transpose(1, 2).requires_grad_()
        ref_x = x.detach().clone().requires_grad_()
        y = torch.ops.zoo.rope(x, cos, sin)
        y.backward(grad.to(dtype))
        ref = _rotate(ref_x, cos.to(dtype), sin.to(dtype))
        ref.backward(grad.to(dtype))
        if dtype == torch.float32:
            assert torch.equal(y, ref) and torch.equal(x.grad, ref_x.grad)
        else:
            assert (y.double() - exact).abs().max() <= (ref.double() - exact).abs().max()
            torch.testing.assert_close(x.grad, ref_x.grad, atol=0.05, rtol=0.02)
        with torch.inference_mode():
            assert torch.equal(torch.ops.zoo.rope(x.detach(), cos, sin), y.detach())
    q = base.transpose(1, 2)
    formula = rope.rotate(q, q, 4)
    apply_kernels(rope, ["rope_cpp"])
    assert torch.equal(rope.rotate(q, q, 4)[0], formula[0])


@pytest.mark.parametrize("kernel", ["rmsnorm_cpp", "rmsnorm_cpu"])
def test_rmsnorm_kernels_match_autograd_of_the_formula(kernel):
    """Both float32 CPU RMSNorm kernels: the module's values and gradients against autograd of F.rms_norm in
    float64 on rows split between threads; rmsnorm_cpu's backward also against torch's numerical gradients."""
    from zoo.kernels.norm import _CpuRMSNorm

    built(kernel)
    if kernel == "rmsnorm_cpu":
        x = (torch.randn(2, 3, 8, dtype=torch.float64) * 3 + 1).requires_grad_()
        w = torch.randn(8, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x, w: _CpuRMSNorm.apply(x, w, 1e-5), (x, w))
        assert torch.autograd.gradcheck(lambda x: _CpuRMSNorm.apply(x, w.detach(), 1e-5), (x,))  # weight frozen
    for d, rows in [(16, (5, 7)), (45, (3, 300))]:  # a row of lanes and a remainder; more rows than one block
        rms = make(NORM, "rmsnorm", d, eps=1e-6)
        assert apply_kernels(rms, [kernel]) == [kernel]
        with torch.no_grad():
            rms.weight.add_(torch.randn(d))
        x = (torch.randn(rows[0], d, rows[1]) * 4 - 2).transpose(1, 2).requires_grad_()  # not contiguous
        grad = torch.randn(rows[0], rows[1], d)
        ref_x = x.detach().double().requires_grad_()  # the reference in float64: both float32 paths round
        ref_w = rms.weight.detach().double().requires_grad_()
        y = rms(x)
        y.backward(grad)
        ref = F.rms_norm(ref_x, (d,), ref_w, 1e-6)
        ref.backward(grad.double())
        close = partial(torch.testing.assert_close, rtol=1e-5, atol=1e-5, check_dtype=False)
        close(y, ref)
        close(x.grad, ref_x.grad)
        close(rms.weight.grad, ref_w.grad)  # a sum over 900 rows
        with torch.inference_mode():  # no autograd graph: the op's plain CPU kernel
            close(rms(x.detach()), ref.detach())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # normalises in float32 under autocast too
        assert rms(x).dtype == torch.float32


@pytest.mark.parametrize("op", ["rms_norm", "attention_softmax"])
def test_cpp_kernels_give_the_same_bits_on_any_thread_count(op):
    """Their sums run in a fixed order (lanes within a row, blocks of rows for the gain's gradient), so a run's
    numbers do not depend on how many threads torch has."""
    built("rmsnorm_cpp" if op == "rms_norm" else "attention_softmax_cpp")
    if op == "rms_norm":
        inputs = (torch.randn(1000, 200, requires_grad=True), torch.randn(200, requires_grad=True))
        fn, grad = (lambda x, w: torch.ops.zoo.rms_norm(x, w, 1e-5)), torch.randn(1000, 200)
    else:
        inputs = (torch.randn(4, 4, 33, 70).bfloat16().requires_grad_(),)
        fn, grad = (lambda s: kattention.attention_softmax(s, 0.125, True)), torch.randn(4, 4, 33, 70).bfloat16()
    threads, results = torch.get_num_threads(), []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            y = fn(*inputs)
            results.append((y, *torch.autograd.grad(y, inputs, grad)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))


def _softmax_in_torch(s: torch.Tensor, scale: float, causal: bool, dtype=torch.float32) -> torch.Tensor:
    """softmax(s * scale) over keys, causal with the queries last, computed in `dtype`."""
    from zoo.layers.attention import attention_mask

    x = s.to(dtype) * scale
    if causal:
        x = x.masked_fill(~attention_mask(*s.shape[-2:], True, None, s.device), float("-inf"))
    return x.softmax(-1, dtype=torch.promote_types(dtype, torch.float32))


@pytest.mark.parametrize("t_q,t_k,causal", [(64, 64, True), (5, 37, True), (1, 9, True), (7, 7, False),
                                            (3, 100, False), (17, 17, True)])
def test_attention_softmax_cpp_is_closer_to_the_exact_softmax_than_torch_in_bf16(t_q, t_k, causal):
    """torch.ops.zoo.attention_softmax: masked keys get exactly 0 and no gradient; values and gradients are within
    bf16's rounding of the exact softmax, and no further from it than torch's bf16 path (which rounds the scaled
    scores to bf16 first); rows of any length (lanes of 16 and a tail); inference mode gives the same bits."""
    built("attention_softmax_cpp")
    g = torch.Generator().manual_seed(t_q * 1000 + t_k)
    s = (torch.randn(2, 3, t_q, t_k, generator=g) * 6).bfloat16().requires_grad_()
    grad = torch.randn(2, 3, t_q, t_k, generator=g).bfloat16()
    scale = 0.37
    p = kattention.attention_softmax(s, scale, causal)
    (ds,) = torch.autograd.grad(p, s, grad)
    exact_s = s.detach().double().requires_grad_()
    exact = _softmax_in_torch(exact_s, scale, causal, torch.float64)
    (exact_ds,) = torch.autograd.grad(exact, exact_s, grad.double())
    torch_s = s.detach().clone().requires_grad_()
    in_torch = _softmax_in_torch(torch_s, scale, causal, torch.bfloat16).bfloat16()
    (torch_ds,) = torch.autograd.grad(in_torch, torch_s, grad)
    assert p.dtype == ds.dtype == torch.bfloat16
    if causal:
        masked = exact == 0
        assert masked.any() == (t_q > 1) and (p[masked] == 0).all() and (ds[masked] == 0).all()  # the last sees all
    err = {name: ((a.double() - b).abs().max() / b.abs().max()).item()
           for name, a, b in (("p", p, exact), ("ds", ds, exact_ds), ("torch p", in_torch, exact),
                              ("torch ds", torch_ds, exact_ds))}
    assert err["p"] <= 2 ** -8 and err["ds"] <= 2 ** -7, err  # bf16 keeps 8 bits
    assert err["p"] <= err["torch p"] and err["ds"] <= err["torch ds"], err
    torch.testing.assert_close(p.double().sum(-1), torch.ones(2, 3, t_q, dtype=torch.float64), atol=t_k * 2 ** -8,
                               rtol=0)
    with torch.inference_mode():
        assert torch.equal(kattention.attention_softmax(s.detach(), scale, causal), p.detach())


def test_attention_softmax_cpp_refuses_what_it_does_not_do():
    built("attention_softmax_cpp")
    s = torch.randn(4, 4, 33, 70).bfloat16().requires_grad_()
    grad = torch.randn(4, 4, 33, 70).bfloat16()
    with pytest.raises(RuntimeError, match="contiguous bf16"):
        kattention.attention_softmax(s.detach().float(), 0.125, True)
    with pytest.raises(RuntimeError, match="causal needs Tk >= Tq"):
        kattention.attention_softmax(s.detach().transpose(-1, -2).contiguous(), 0.125, True)
    _, stats = torch.ops.zoo.attention_softmax(s.detach(), 0.125, True)
    with pytest.raises(RuntimeError, match="shaped as the scores and the forward's float32 stats"):
        torch.ops.zoo.attention_softmax_backward(grad, s.detach(), stats[..., :1], 0.125, True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(kattention.attention_softmax(s, 0.125, True), s, grad, create_graph=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_softmax_kernel_serves_bf16_causal_or_unmasked_scores_only(dtype):
    """The written-out form with attention_softmax_cpp: bf16 causal scores on the kernel; float32 scores and other
    masks (a window) keep the formula to the bit."""
    from zoo.layers.attention import attention_mask, attention_weights

    built("attention_softmax_cpp")
    attn = make(ATTENTION, "mha", backend="math")
    formula = copy.deepcopy(attn)
    assert apply_kernels(attn, ["attention_softmax_cpp"]) == ["attention_softmax_cpp"]
    q, k = torch.randn(2, 3, 10, 8).to(dtype), torch.randn(2, 3, 10, 8).to(dtype)
    scores, window = q @ k.transpose(-2, -1), attention_mask(10, 10, True, 3, q.device)
    kernel = kattention.attention_softmax(scores.bfloat16(), 1 / 8 ** 0.5, True)
    assert torch.equal(attn._softmax(scores, None, True, 8).to(dtype),
                       kernel if dtype == torch.bfloat16 else formula._softmax(scores, None, True, 8).to(dtype))
    assert torch.equal(attn._softmax(scores, window, False, 8), formula._softmax(scores, window, False, 8))
    assert torch.equal(formula._softmax(scores, None, True, 8).to(dtype), attention_weights(q, k, None, True))


def test_compiled_models_take_the_softmax_kernel_from_its_length_with_the_eager_bits(monkeypatch):
    """Under torch.compile the kernel runs in the graph (its ops' shapes registered, its autograd.Function traced)
    from COMPILED_SOFTMAX_FROM keys, with eager mode's bits each way; below, inductor fuses torch's formula."""
    built("attention_softmax_cpp")
    attn = make(ATTENTION, "mha", backend="math")
    apply_kernels(attn, ["attention_softmax_cpp"])
    monkeypatch.setattr(kattention, "COMPILED_SOFTMAX_FROM", 12)
    g = torch.Generator().manual_seed(0)

    def weights(q, k):
        return attn._softmax(q @ k.transpose(-2, -1), None, True, 8)

    for t, kernel in ((12, True), (11, False)):
        q, k, grad = (torch.randn(2, 3, t, 8, generator=g).bfloat16() for _ in range(3))
        results = []
        for fn in (weights, torch.compile(weights, fullgraph=True)):
            leaf = q.clone().requires_grad_()
            with profile() as prof:
                w = fn(leaf, k).bfloat16()
                (dq,) = torch.autograd.grad(w @ k, leaf, grad)
            results.append((w, dq, "zoo::attention_softmax" in {e.key for e in prof.key_averages()}))
        (eager, eager_dq, eager_ran), (compiled, compiled_dq, compiled_ran) = results
        assert eager_ran and compiled_ran == kernel
        if kernel:
            assert torch.equal(compiled, eager) and torch.equal(compiled_dq, eager_dq)
        else:
            torch.testing.assert_close(compiled, eager, atol=2 ** -8, rtol=0)


@pytest.mark.parametrize("attention", [a for a in cases("attention")
                                       if "backend" in option_fields(ATTENTION.options(a["name"]))], ids=case_id)
def test_attention_written_out_is_backend_math_to_the_bit(attention):
    """Under CPU bf16 autocast with gradients, attention_written_out routes the sdpa backend to the written-out
    form (the fused backward is the slower there): bit-identical to backend=math, and within bf16 error of
    float32."""
    cfg = tiny_cfg("decoder_only", attention=attention, position={"name": "alibi"})
    fast = build_model(cfg).train()
    assert apply_kernels(fast, ["attention_written_out"], precision="bf16-mixed") == ["attention_written_out"]
    slow = build_model({**cfg, "attention": {**cfg["attention"], "backend": "math"}}).train()
    slow.load_state_dict(fast.state_dict())
    tokens = torch.randint(0, 37, (3, 11))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = fast(tokens), slow(tokens)
    assert torch.equal(a, b)
    a.float().square().mean().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in fast.parameters() if p.requires_grad)
    torch.testing.assert_close(a.float(), fast(tokens), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("softmax_kernel", [True, False])
@pytest.mark.parametrize("start,t_k,written_out", [(None, 64, True), (None, 1024, True), (256, 64, True),
                                                   (256, 255, True), (256, 256, False), (256, 1024, False)])
def test_written_out_attention_by_key_length(monkeypatch, start, t_k, written_out, softmax_kernel):
    """Each rule table on its own: the written-out form's softmax on zoo's kernel, or in torch ops; only
    low-precision training (inference and float32 keep the fused kernel)."""
    mine, other = ("FUSED_BACKWARD_FROM_SOFTMAX_KERNEL", "FUSED_BACKWARD_FROM")[::1 if softmax_kernel else -1]
    monkeypatch.setattr(kattention, mine, start)
    monkeypatch.setattr(kattention, other, 128 if start is None else None)  # the other table must not count
    q = torch.zeros(1, 2, 4, 8, dtype=torch.bfloat16, requires_grad=True)
    assert kattention.written_out_is_faster(q, t_k, None, softmax_kernel) is written_out
    assert not kattention.written_out_is_faster(q.detach(), t_k, None, softmax_kernel)
    assert not kattention.written_out_is_faster(q.float(), t_k, None, softmax_kernel)


def test_the_rule_tables_name_cpu_kinds():
    from zoo.hardware import CPU_BF16

    for table in (kattention.FUSED_FROM, kattention.FUSED_FROM_SOFTMAX_KERNEL, kattention.COMPILED_SOFTMAX_KERNEL_FROM):
        assert set(table) <= set(CPU_BF16)


# ---- building ------------------------------------------------------------------------------------------------


def test_a_kernel_is_built_once_per_machine_and_a_failed_build_is_said_once_per_process(tmp_path):
    """The build goes into the cache once (a second process loads the same file, saying nothing); a compiler that
    fails is said on one line, once per process however often the kernel is asked for, and the pass goes on
    with the other kernels (auto: rmsnorm_cpu instead of rmsnorm_cpp); a new process tries again."""
    if not build.compiler():
        pytest.skip("no C++ compiler (c++ or $CXX)")
    probe = textwrap.dedent("""
        from zoo import build_model
        from zoo.kernels import apply_kernels, build
        from tests.helpers import tiny_cfg
        print(build.load('rmsnorm'), build.load('rmsnorm'))
        model = build_model(tiny_cfg(norm={'type': 'rmsnorm', 'placement': 'pre'}))
        print(apply_kernels(model, 'auto', precision='32-true'))""")

    def run(**env) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                              env={**os.environ, "ZOO_CACHE": str(tmp_path), **env})

    first = run()
    assert first.stdout.splitlines()[0] == "True True" and first.stderr.count("building rmsnorm.cpp") == 1
    libs = sorted((tmp_path / "native").glob("rmsnorm-*.so"))
    assert len(libs) == 1
    stamp = libs[0].stat().st_mtime_ns
    again = run()
    assert again.stdout == first.stdout and "building" not in again.stderr
    assert libs[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
    for _ in range(2):  # each process tries, and says so once
        failing = run(CXX="false")
        assert failing.stdout.splitlines() == ["False False", "['rmsnorm_cpu']"]
        said = [ln for ln in failing.stderr.splitlines() if "rmsnorm.cpp" in ln]
        assert len(said) == 2 and "building rmsnorm.cpp" in said[0] and "did not build" in said[1], failing.stderr
    missing = run(CXX=str(tmp_path / "no-such-compiler"))
    assert missing.stdout.splitlines()[0] == "False False" and missing.stderr.count("could not be built") == 1


def test_cpp_kernels_have_no_second_derivative():
    built("rmsnorm_cpp")
    x, w = torch.randn(3, 8, requires_grad=True), torch.ones(8, requires_grad=True)
    torch.autograd.grad(torch.ops.zoo.rms_norm(x, w, 1e-5).sum(), x)  # a first derivative is fine
    with pytest.raises(RuntimeError, match="no second derivative; kernels=none uses torch's formula"):
        torch.autograd.grad(torch.ops.zoo.rms_norm(x, w, 1e-5).sum(), x, create_graph=True)


def test_the_command_line_lists_and_builds(capsys):
    from zoo.kernels.__main__ import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in KERNELS.names():
        assert f"\n{name}: speeds up {KERNELS.get(name).target.__name__}" in out
    assert main(["build", "rope_cpp", "attention_written_out"]) == (0 if shutil.which("c++") else 1)
    assert capsys.readouterr().out.splitlines()[-1] == "attention_written_out: torch ops, nothing to build"
    assert main(["build", "nope"]) == 2
    assert capsys.readouterr().err.startswith("error: kernels: unknown kernel 'nope'; valid: auto, none")


def test_the_docs_table_lists_every_kernel_with_its_class_and_tolerance():
    from pathlib import Path

    names = {torch.float32: "float32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    lines = (Path(__file__).parents[1] / "docs" / "performance.md").read_text().splitlines()
    table = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines if line.startswith("| `")]
    rows = {cells[0].strip("`"): cells for cells in table}
    assert set(rows) == set(KERNELS.names())
    for name, cells in rows.items():
        k = KERNELS.get(name)
        assert cells[1] == f"`{k.target.__name__}`"
        assert cells[3] == ("torch ops" if k.source is None else f"`zoo/kernels/{k.source}.cpp`")
        assert cells[4].strip() == ", ".join(f"{names[d]} {v}" for d, v in k.tolerance.items())
