"""nGPT (zoo/layers/ngpt.py, norm=ngpt) against the paper's equations (Loshchilov et al. 2024) written out in
float64: one block at 3 heads, 13 tokens, a padding mask; cached decoding; the unit matrices after a training step;
a short training run that learns."""

import math

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tiny_cfg
from zoo import build_model
from zoo.component import ConfigError

D, H, T, V = 24, 3, 13, 37
UNIGRAM_ENTROPY = 3.34  # nats per character of the embedded corpus (tests/training/test_learning.py)


def _model(lineage: str = "decoder_only", n_layers: int = 1, **over):
    over = {"position": {"name": "none"}, "ffn": {"name": "swiglu"}, **over}
    cfg = tiny_cfg(lineage, d_model=D, n_heads=H, n_layers=n_layers, vocab_size=V, bias=False,
                   norm={"placement": "ngpt"}, **over)
    model = build_model(cfg).double()
    with torch.no_grad():  # every learned scale away from its start, so a missing or misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith("stored"):
                p.mul_(1 + 0.5 * torch.rand_like(p))
    return model


def norm(x):
    return x / x.norm(dim=-1, keepdim=True)


def paper_block(block, h, causal, pad):
    """One nGPT block, the paper's equations (section 2.6) with the block's weights. Every scale is the stored
    parameter times init / scale: alpha 0.05 / (1 / sqrt(d)), s_qk 1 / (1 / sqrt(d)), s_u = s_v 1 / 1."""
    attn, ffn = block.attn.f, block.ffn.f
    t, hd = h.shape[1], D // H
    q, k, v = F.linear(h, attn.qkv.weight).split(D, dim=-1)
    s_qk = attn.s_qk.stored.reshape(-1) * math.sqrt(D)  # (H * hd,): one per head and channel
    heads = lambda x: x.unflatten(-1, (H, hd)).transpose(1, 2)  # noqa: E731  (B, H, T, hd)
    q = norm(heads(q)) * s_qk.view(H, 1, hd)  # each head normalised, then scaled
    k = norm(heads(k)) * s_qk.view(H, 1, hd)
    scores = math.sqrt(hd) * q @ k.transpose(-1, -2)  # the softmax scale is sqrt(d_k)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (j <= i) if causal else torch.ones(t, t, dtype=torch.bool)
    if pad is not None:  # a padded key is hidden; every query keeps its own key (the zoo's rule for padded rows)
        allowed = allowed & (pad[:, None, None, :] | (i == j))
    y = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ heads(v)
    h_a = norm(F.linear(y.transpose(1, 2).flatten(2), attn.out.weight))
    alpha_a = block.attn.alpha.stored * 0.05 * math.sqrt(D)
    h = norm(h + alpha_a * (h_a - h))
    u = ffn.s_u.stored * F.linear(h, ffn.up.weight)
    v = ffn.s_v.stored * math.sqrt(D) * F.linear(h, ffn.gate.weight)
    h_m = norm(F.linear(u * F.silu(v), ffn.down.weight))
    alpha_m = block.ffn.alpha.stored * 0.05 * math.sqrt(D)
    return norm(h + alpha_m * (h_m - h))


def _compare(ours, theirs, model):
    assert torch.allclose(ours, theirs, atol=1e-10), (ours - theirs).abs().max()
    params = [p for p in model.parameters() if p.requires_grad]
    g1 = torch.autograd.grad(ours.square().sum(), params, allow_unused=True)
    g2 = torch.autograd.grad(theirs.square().sum(), params, allow_unused=True)
    for (name, _), a, b in zip(model.named_parameters(), g1, g2, strict=True):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-9)), name


def test_decoder_logits_follow_the_papers_equations():
    model = _model()
    tokens = torch.randint(0, V, (2, T))
    ours = model(tokens)
    h = norm(model.embed.weight[tokens])  # the embedding on the sphere
    h = paper_block(model.decoder.blocks[0], h, causal=True, pad=None)
    s_z = model.head.s_z.stored * math.sqrt(D)  # init 1, scale 1 / sqrt(d)
    _compare(ours, s_z * F.linear(h, model.head.weight), model)  # no final norm


def test_encoder_block_with_padding_follows_the_papers_equations():
    model = _model("encoder_only")
    tokens = torch.randint(0, V, (2, T))
    pad = torch.ones(2, T, dtype=torch.bool)
    pad[1, 9:] = False
    ours = model.encoder(tokens, padding=pad)
    h = paper_block(model.encoder.blocks[0], norm(model.embed.weight[tokens]), causal=False, pad=pad)
    _compare(ours, h, model)


def test_cached_decoding_equals_recomputation():
    model = _model(n_layers=2, position={"name": "rope"}, attention={"name": "gqa", "n_kv_heads": 1}).eval()
    tokens = torch.randint(0, V, (2, T))
    full = model(tokens)
    cache = model.new_cache()
    steps = [model(tokens[:, :5], cache=cache)] + [model(tokens[:, i:i + 1], cache=cache) for i in range(5, T)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-10)


def _unit_along_embedding(model):
    """Every matrix's vectors along d_model: rows of the tables, the head and the stream's readers, columns of its
    writers (attention out, FFN down)."""
    for name, p in model.named_parameters():
        if p.ndim == 2:
            dim = 0 if name.endswith(("attn.f.out.weight", "ffn.f.down.weight")) else 1
            assert p.shape[dim] == D and torch.allclose(p.norm(dim=dim), torch.ones(()).to(p)), name


def _train(tmp_path, overrides):
    from tests.helpers import TINY, compose_cfg
    from zoo.training import run

    cfg = compose_cfg([*TINY, "norm=ngpt", "model.n_heads=4", "ffn=swiglu", "logger=csv", *overrides])
    return run(cfg, run_dir=tmp_path), tmp_path


@pytest.mark.parametrize("optim", ["adamw", "muon"])  # the paper's Adam; Muon's orthogonalised steps as well
def test_every_matrix_is_unit_after_a_training_step(tmp_path, optim):
    """The training step's hook (Placement.after_step, after optimizer.step) puts every matrix back on the sphere:
    without it a step at this learning rate moves them well off (checked below on the same model)."""
    code, run_dir = _train(tmp_path, [f"optim={optim}", "trainer.max_steps=2", "optim.lr=0.05",
                                      "optim.warmup_steps=0"])
    assert code == 0
    (ckpt,) = (run_dir / "checkpoints").glob("last*.ckpt")
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    # the default learned positions are added before the embedding's normalisation, not a matrix nGPT keeps
    matrices = {k: p for k, p in state.items() if p.ndim == 2 and not k.endswith("position.weight")}
    assert len(matrices) >= 7, sorted(matrices)  # embedding, qkv, out, gate, up, down, head (+ learned positions)
    for name, p in matrices.items():
        dim = 0 if name.endswith(("attn.f.out.weight", "ffn.f.down.weight")) else 1
        assert p.shape[dim] == 32 and torch.allclose(p.double().norm(dim=dim), torch.ones(()).double()), name
    # the hook is what keeps them there: an Adam step off the sphere, after_step back on it
    from zoo.component import after_step

    model = _model(n_layers=2)
    logits = model(torch.randint(0, V, (2, T)))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    logits.logsumexp(-1).mean().backward()
    opt.step()
    with pytest.raises(AssertionError):
        _unit_along_embedding(model)
    after_step(model)
    _unit_along_embedding(model)


def test_a_fresh_run_starts_on_the_sphere_and_a_built_model_keeps_the_draws():
    """init_weights draws as for every placement (no matrix is renormalised at build); a fresh run's on_fit_start
    puts every matrix on the sphere, a resumed run's (ckpt_path set) leaves the restored weights alone."""
    from types import SimpleNamespace

    from zoo.training.module import ZooModule

    model = build_model(tiny_cfg(d_model=D, n_heads=H, vocab_size=V, norm={"placement": "ngpt"},
                                 position={"name": "none"}))
    with pytest.raises(AssertionError):
        _unit_along_embedding(model)
    drawn = {k: p.clone() for k, p in model.state_dict().items()}
    ZooModule.on_fit_start(SimpleNamespace(model=model, trainer=SimpleNamespace(ckpt_path="last.ckpt")))  # resumed
    assert all(torch.equal(p, drawn[k]) for k, p in model.state_dict().items())
    ZooModule.on_fit_start(SimpleNamespace(model=model, trainer=SimpleNamespace(ckpt_path=None)))  # fresh
    _unit_along_embedding(model)


@pytest.mark.slow
def test_ngpt_learns_the_corpus(tmp_path):
    """From ln(vocab) at initialisation to below the corpus' unigram entropy: a model that ignores the context (or
    a broken block, whose output the next-token head cannot use) stays above it."""
    import json

    code, run_dir = _train(tmp_path, ["trainer.max_steps=300", "trainer.val_check_interval=300", "optim.lr=0.01",
                                      "optim.warmup_steps=0", "data.batch_size=16", "data.context=32",
                                      "data.eval_batches=4"])
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["final"]["val_loss"] < 2.9 < UNIGRAM_ENTROPY, s["final"]


@pytest.mark.parametrize("over, key", [
    (dict(attention={"name": "mla"}), "model.attention.name"),
    (dict(attention={"name": "cosine"}), "model.attention"),
    (dict(ffn={"name": "moe"}), "model.ffn"),
    (dict(attention={"name": "mha", "qk_norm": True}), "model.attention.qk_norm"),
    (dict(embed_norm=True), "model.embed_norm"),
    (dict(softmaxes=2), "model.softmaxes"),
])
def test_what_it_cannot_work_with_is_refused_in_one_line(over, key):
    cfg = tiny_cfg(d_model=D, n_heads=H, norm={"placement": "ngpt"}, **over)
    with pytest.raises(ConfigError, match=rf"^{key}"):
        build_model(cfg)
