"""Properties that a wrong implementation of a component would break."""


import pytest
import torch
import torch.nn.functional as F

from tests.helpers import KINDS, case_id, cases, lineages, make, model_cases, tiny_cfg
from zoo import build_model
from zoo.block import NO_POSITION
from zoo.component import declared, option_fields
from zoo.layers.attention import attention_maps
from zoo.registry import ATTENTION, FFN, NORM, POSITION

# Every case below comes from the registries (tests/helpers.py): a part registered tomorrow is under
# every property test with no edit here. Where the full product of kinds is too big, a pairwise covering
# design per lineage (helpers.covering) stands in for it: every value of each kind meets every value of
# every other kind under every lineage.


def _with_option(option: str) -> list[dict]:
    """The attention cases whose component has `option` (e.g. backend, qk_norm)."""
    return [a for a in cases("attention") if option in option_fields(ATTENTION.options(a["name"]))]


@pytest.mark.parametrize("cfg", model_cases(lineages("generates")), ids=case_id)
def test_causality(cfg):
    """Changing tokens after t changes no decoder output at positions <= t."""
    model = build_model(cfg).eval()
    a = torch.randint(0, 37, (2, 12))
    b = a.clone()
    b[:, 7:] = torch.randint(0, 37, (2, 5))
    src = torch.randint(0, 37, (2, 9))
    out_a, out_b = (model(src, x) if model.needs_source else model(x) for x in (a, b))
    torch.testing.assert_close(out_a[:, :7], out_b[:, :7], atol=1e-6, rtol=0)
    assert (out_a[:, 7:] - out_b[:, 7:]).abs().max() > 1e-3  # the future did change something


@pytest.mark.parametrize("attention", [a for a in cases("attention") if a.get("window") is None], ids=case_id)
def test_permutation_equivariance_without_positions(attention):
    """With no positions and no mask, attention is a set operation: permuting the input permutes the output; unless
    the attention declares itself order_aware (zoo.component.AttentionPart), and then permuting must change it."""
    model = build_model(tiny_cfg("encoder_only", attention=attention, position={"name": "none"})).eval()
    tokens = torch.randint(0, 37, (2, 10))
    perm = torch.randperm(10)
    if declared(model.encoder.blocks[0].attn.f, "order_aware"):
        model = build_model(tiny_cfg("encoder_only", attention=attention, position={"name": "none"}, init_std=0.5))
        assert (model.eval()(tokens)[:, perm] - model(tokens[:, perm])).abs().max() > 1e-3
        return
    torch.testing.assert_close(model(tokens)[:, perm], model(tokens[:, perm]), atol=1e-5, rtol=0)
    learned = build_model(tiny_cfg("encoder_only", attention=attention, init_std=0.5)).eval()
    assert (learned(tokens)[:, perm] - learned(tokens[:, perm])).abs().max() > 1e-3  # positions break it


def test_rope_scores_depend_only_on_offset():
    rope = make(POSITION, "rope", d_model=64, n_heads=4, max_seq_len=16)  # grows past 16 on demand
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i: int, j: int) -> torch.Tensor:
        return (rope.rotate(q, q, i)[0] * rope.rotate(k, k, j)[1]).sum()

    for offset in (0, 1, 5):
        ref = score(offset, 0)
        for start in (3, 17, 40):
            torch.testing.assert_close(score(start + offset, start), ref, atol=1e-4, rtol=1e-4)
    assert (score(5, 0) - score(1, 0)).abs() > 1e-3  # and it does depend on the offset
    # rotation preserves norms (it is a rotation)
    torch.testing.assert_close(rope.rotate(q, q, 9)[0].norm(), q.norm())


def test_alibi_bias_is_linear_in_distance_with_geometric_slopes():
    alibi = make(POSITION, "alibi", d_model=32, n_heads=8, max_seq_len=16)
    bias = alibi.score_bias(5, 5)
    assert torch.allclose(alibi.slopes, torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    for h in range(8):
        for i in range(5):
            for j in range(5):
                assert bias[h, i, j] == pytest.approx(-alibi.slopes[h] * abs(i - j))


def test_sinusoidal_matches_formula():
    pe = make(POSITION, "sinusoidal", d_model=8, n_heads=2, max_seq_len=4).embed(torch.zeros(1, 6, 8))[0]
    for pos in range(6):
        for i in range(4):
            angle = pos / 10000 ** (2 * i / 8)
            assert pe[pos, 2 * i].item() == pytest.approx(torch.tensor(angle).sin().item(), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(torch.tensor(angle).cos().item(), abs=1e-6)


def test_gqa_with_all_kv_heads_is_mha_and_mqa_is_gqa_with_one():
    x = torch.randn(2, 7, 32)
    mha, gqa = make(ATTENTION, "mha", 32, 4), make(ATTENTION, "gqa", 32, 4, n_kv_heads=4)
    gqa.load_state_dict(mha.state_dict())
    torch.testing.assert_close(gqa(x, NO_POSITION, is_causal=True), mha(x, NO_POSITION, is_causal=True))
    mqa, gqa1 = make(ATTENTION, "mqa", 32, 4), make(ATTENTION, "gqa", 32, 4, n_kv_heads=1)
    gqa1.load_state_dict(mqa.state_dict())
    torch.testing.assert_close(gqa1(x, NO_POSITION), mqa(x, NO_POSITION))
    assert mqa.qkv.weight.shape == (32 + 2 * 8, 32)  # one shared key head and value head


def test_gqa_equals_mha_with_repeated_kv_heads():
    """GQA is MHA whose key/value heads are shared by groups of query heads."""
    x = torch.randn(2, 7, 32)
    gqa, mha = make(ATTENTION, "gqa", 32, 4, n_kv_heads=2), make(ATTENTION, "mha", 32, 4)
    q, k, v = gqa.qkv.weight.detach().split([32, 16, 16])
    rep = lambda w: w.view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
    qb, kb, vb = gqa.qkv.bias.detach().split([32, 16, 16])
    repb = lambda b: b.view(2, 8).repeat_interleave(2, dim=0).reshape(32)
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([q, rep(k), rep(v)]))
        mha.qkv.bias.copy_(torch.cat([qb, repb(kb), repb(vb)]))
        mha.out.load_state_dict(gqa.out.state_dict())
    torch.testing.assert_close(gqa(x, NO_POSITION, is_causal=True), mha(x, NO_POSITION, is_causal=True))


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_only"])
def test_sliding_window_gives_zero_weight_beyond_window(lineage):
    window = 3
    model = build_model(tiny_cfg(lineage, attention={"name": "mha", "window": window})).eval()
    maps = attention_maps(model, torch.randint(0, 37, (2, 10)))
    assert len(maps) == 2
    i, j = torch.arange(10)[:, None], torch.arange(10)[None, :]
    outside = (i - j).abs() >= window
    if lineage == "decoder_only":
        outside |= j > i
    for w in maps.values():
        assert w.shape == (2, 4, 10, 10)
        assert (w[..., outside] == 0).all()
        assert (w[..., ~outside] > 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 10))


@pytest.mark.parametrize("cfg", [c for c in model_cases(lineages(), ("attention", "position"))
                                 if c["attention"] in _with_option("backend")], ids=case_id)
def test_sdpa_and_math_backends_agree(cfg):
    fast = build_model(cfg).eval()
    slow = build_model({**cfg, "attention": {**cfg["attention"], "backend": "math"}}).eval()
    slow.load_state_dict(fast.state_dict())
    tokens = torch.randint(0, 37, (3, 11))
    padding = torch.ones(3, 11, dtype=torch.bool)
    padding[1, 8:] = False  # a padded row, where padding applies
    if not fast.generates:  # an encoder: padded tokens
        kw = {"padding": padding}
        a, b = fast(tokens, **kw), slow(tokens, **kw)
    elif fast.needs_source:
        a, b = fast(tokens, tokens[:, :6], padding), slow(tokens, tokens[:, :6], padding)
    else:
        a, b = fast(tokens), slow(tokens)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_padding_keys_are_ignored_by_the_encoder():
    model = build_model(tiny_cfg("encoder_only")).eval()
    tokens = torch.randint(0, 37, (1, 8))
    padding = torch.tensor([[True] * 5 + [False] * 3])
    other = tokens.clone()
    other[:, 5:] = (other[:, 5:] + 1) % 37
    torch.testing.assert_close(model(tokens, padding)[:, :5], model(other, padding)[:, :5])
    torch.testing.assert_close(model(tokens, padding)[:, :5], model(tokens[:, :5])[:, :5], atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first,placement", [(True, "pre"), (False, "post")])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_block_equals_torch_transformer_encoder_layer(norm_first, placement, activation):
    d, h, d_ff = 32, 4, 64
    ref = torch.nn.TransformerEncoderLayer(d, h, d_ff, dropout=0.0, activation=activation, batch_first=True,
                                           norm_first=norm_first).eval()
    model = build_model(tiny_cfg("encoder_only", d_model=d, n_heads=h, n_layers=1, position={"name": "none"},
                                 norm={"placement": placement, "type": "layernorm"},
                                 ffn={"name": activation, "d_ff": d_ff}))
    block = model.encoder.blocks[0].eval()
    with torch.no_grad():
        block.attn.f.qkv.weight.copy_(ref.self_attn.in_proj_weight)  # [q; k; v], as zoo fuses them
        block.attn.f.qkv.bias.copy_(ref.self_attn.in_proj_bias)
        block.attn.f.out.load_state_dict(ref.self_attn.out_proj.state_dict())
        block.ffn.f.up.load_state_dict(ref.linear1.state_dict())
        block.ffn.f.down.load_state_dict(ref.linear2.state_dict())
        block.attn.norm.load_state_dict(ref.norm1.state_dict())
        block.ffn.norm.load_state_dict(ref.norm2.state_dict())
    x = torch.randn(2, 9, d)
    torch.testing.assert_close(block(x, NO_POSITION, None, False), ref(x), atol=1e-5, rtol=0)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(9)
    torch.testing.assert_close(block(x, NO_POSITION, None, True), ref(x, src_mask=mask, is_causal=True),
                               atol=1e-5, rtol=0)


def test_norms_match_formulas():

    x = torch.randn(4, 16) * 3 + 1
    torch.testing.assert_close(make(NORM, "layernorm", 16, eps=1e-5)(x), F.layer_norm(x, (16,), eps=1e-5))
    rms = make(NORM, "rmsnorm", 16, eps=1e-6)
    torch.testing.assert_close(rms(x), x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())
    assert rms(x).pow(2).mean(-1).sub(1).abs().max() < 1e-3  # unit root-mean-square


@pytest.mark.parametrize("name,act", [("relu", F.relu), ("gelu", F.gelu), ("reglu", F.relu),
                                      ("geglu", F.gelu), ("swiglu", F.silu)])
def test_ffns_match_formulas(name, act):

    ffn = make(FFN, name, 16, bias=False, d_ff=24)
    x = torch.randn(3, 16)
    if ffn.gated:
        expect = (act(x @ ffn.gate.weight.T) * (x @ ffn.up.weight.T)) @ ffn.down.weight.T
    else:
        expect = act(x @ ffn.up.weight.T) @ ffn.down.weight.T
    torch.testing.assert_close(ffn(x), expect)


def test_gated_ffn_default_width_is_parameter_matched():

    plain, gated = make(FFN, "gelu", 96), make(FFN, "swiglu", 96)
    assert plain.up.out_features == 384 and gated.up.out_features == 256  # 2/3 * 384, a multiple of 8
    n = lambda m: sum(p.numel() for p in m.parameters() if p.dim() == 2)
    assert n(plain) == n(gated)


@pytest.mark.parametrize("lineage", lineages())
def test_float64_backends_agree_to_float64_precision(lineage):
    """The math path keeps float64 in float64 (only bf16/fp16 scores are promoted to float32)."""
    cfg = tiny_cfg(lineage, position={"name": "alibi"})
    fast = build_model(cfg).double().eval()
    slow = build_model({**cfg, "attention": {"backend": "math"}}).double().eval()
    slow.load_state_dict(fast.state_dict())
    tokens = torch.randint(0, 37, (3, 11))
    padding = torch.ones(3, 11, dtype=torch.bool)
    padding[1, 8:] = False
    kw = {"padding": padding} if lineage == "encoder_only" else {}
    args = (tokens, tokens[:, :6], padding) if lineage == "encoder_decoder" else (tokens,)
    with torch.no_grad():  # inference: sdpa takes the fused kernel
        a, b = fast(*args, **kw), slow(*args, **kw)
    assert a.dtype == torch.float64
    torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    torch.testing.assert_close(fast(*args, **kw), a, atol=1e-12, rtol=0)  # with gradients


def test_cross_attention_to_a_fully_padded_source_is_finite_on_both_paths():
    """A source row that is all padding leaves cross-attention no key to see: instead of NaN (math
    path, which bf16 training on CPU takes), such a row attends to all its keys, on either backend."""
    cfg = tiny_cfg("encoder_decoder")
    fast = build_model(cfg)
    slow = build_model({**cfg, "attention": {"backend": "math"}})
    slow.load_state_dict(fast.state_dict())
    src, tgt = torch.randint(0, 37, (3, 9)), torch.randint(0, 37, (3, 5))
    padding = torch.ones(3, 9, dtype=torch.bool)
    padding[1] = False  # row 1: nothing but padding
    padding[2, 6:] = False
    a, b = fast(src, tgt, padding), slow(src, tgt, padding)
    assert a.isfinite().all() and b.isfinite().all()
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    b.square().mean().backward()
    assert all(p.grad.isfinite().all() for p in slow.parameters())
    with torch.no_grad():  # the other rows are unaffected by row 1
        torch.testing.assert_close(fast(src[[0, 2]], tgt[[0, 2]], padding[[0, 2]]), a[[0, 2]], atol=1e-5, rtol=0)


def _copy_attention(zoo_attn, ref, cross: bool) -> None:
    d = ref.embed_dim
    w, b = ref.in_proj_weight, ref.in_proj_bias  # [q; k; v] rows
    if cross:
        zoo_attn.q.weight.copy_(w[:d]), zoo_attn.q.bias.copy_(b[:d])
        zoo_attn.kv.weight.copy_(w[d:]), zoo_attn.kv.bias.copy_(b[d:])
    else:
        zoo_attn.qkv.weight.copy_(w), zoo_attn.qkv.bias.copy_(b)
    zoo_attn.out.load_state_dict(ref.out_proj.state_dict())


@pytest.mark.parametrize("norm_first,placement", [(True, "pre"), (False, "post")])
def test_encoder_decoder_equals_torch_transformer(norm_first, placement):
    """torch.nn.Transformer has a final encoder and decoder norm with either placement: Post-LN
    (the original Transformer as PyTorch ships it) needs model.final_norm=true; Pre-LN has one anyway."""
    d, h, d_ff, n_enc, n_dec = 32, 4, 64, 2, 3
    ref = torch.nn.Transformer(d, h, n_enc, n_dec, d_ff, dropout=0.0, activation="relu", batch_first=True,
                               norm_first=norm_first).double().eval()
    model = build_model(tiny_cfg("encoder_decoder", d_model=d, n_heads=h, n_layers=n_enc, n_decoder_layers=n_dec,
                                 position={"name": "none"}, norm={"placement": placement, "type": "layernorm"},
                                 ffn={"name": "relu", "d_ff": d_ff}, final_norm=True)).double().eval()
    with torch.no_grad():
        for p in ref.parameters():  # norm gains and biases away from 1 and 0, so a missing or extra norm shows
            p.add_(torch.randn_like(p) * 0.1)
        for stack, ref_stack in ((model.encoder, ref.encoder), (model.decoder, ref.decoder)):
            for blk, layer in zip(stack.blocks, ref_stack.layers, strict=True):
                _copy_attention(blk.attn.f, layer.self_attn, cross=False)
                norms = [blk.attn.norm, blk.ffn.norm]
                if blk.cross is not None:
                    _copy_attention(blk.cross.f, layer.multihead_attn, cross=True)
                    norms.insert(1, blk.cross.norm)
                ref_norms = [layer.norm1, layer.norm2] + ([layer.norm3] if blk.cross is not None else [])
                for norm, ref_norm in zip(norms, ref_norms, strict=True):
                    norm.load_state_dict(ref_norm.state_dict())
                blk.ffn.f.up.load_state_dict(layer.linear1.state_dict())
                blk.ffn.f.down.load_state_dict(layer.linear2.state_dict())
            stack.final_norm.load_state_dict(ref_stack.norm.state_dict())
        src, tgt = torch.randint(0, 37, (2, 9)), torch.randint(0, 37, (2, 7))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64)
        expected = ref(model.embed(src), model.embed(tgt), tgt_mask=mask, tgt_is_causal=True)
        got = model.decoder(tgt, memory=model.encode(src))
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("window", [1, 3, 4])
def test_window_counts_visible_keys_per_query_in_both_directions(window):
    """`window` bounds the distance: a query sees keys at distance < window. Causal: at most `window`
    keys, itself included (Mistral's sliding_window). Bidirectional: `window` - 1 on each side plus
    itself, at most 2 * window - 1 (Longformer's attention_window = 2 * (window - 1)). The counts are
    read off the attention weights of built models, so they hold for what the layers do, not only the mask."""
    t = 12
    i = torch.arange(t)
    expected = {"decoder_only": torch.minimum(i + 1, torch.tensor(window)),
                "encoder_only": torch.minimum(i, torch.tensor(window - 1)) + 1
                + torch.minimum(t - 1 - i, torch.tensor(window - 1))}
    for lineage, counts in expected.items():
        model = build_model(tiny_cfg(lineage, attention={"name": "mha", "window": window})).eval()
        for w in attention_maps(model, torch.randint(0, 37, (2, t))).values():
            assert torch.equal((w > 0).sum(-1), counts.expand(2, 4, t))
    assert expected["decoder_only"].max() == window
    assert expected["encoder_only"].max() == min(2 * window - 1, t)


def _groups(model) -> dict[str, str | None]:
    """Each parameter's name -> the count group of the innermost component holding it (None: embeddings, head)."""
    group = {}
    for m in model.modules():  # outer modules first, so a norm inside an attention counts as a norm
        if hasattr(m, "count_as"):
            group.update({id(p): m.count_as for p in m.parameters()})
    return {name: group.get(id(p)) for name, p in model.named_parameters()}


@pytest.mark.parametrize("kind,case", [(k, c) for k in KINDS for c in cases(k)], ids=lambda x: case_id(x)
                         if isinstance(x, dict) else x)
@pytest.mark.parametrize("lineage", lineages())
def test_swapping_one_component_leaves_every_other_initial_weight_unchanged(lineage, kind, case):
    """Initialisation draws each parameter from a generator seeded by its name: swap one component and
    every parameter outside it keeps its name, shape and bits. A placement moves the block's parameters
    (other names), so there only the parameters that keep their name are compared."""
    base = tiny_cfg(lineage)
    node = "norm" if kind == "placement" else kind
    swapped = {**base, node: {**base.get(node, {}), **case}}
    a, b = build_model(base, seed=3), build_model(swapped, seed=3)
    theirs = dict(b.named_parameters())
    swapped_group = {"placement": None}.get(kind, kind)
    kept = [n for n, g in _groups(a).items() if kind == "placement" or g != swapped_group]
    assert "embed.weight" in kept
    for name in kept:
        if kind != "placement" or name in theirs:
            assert name in theirs and torch.equal(dict(a.named_parameters())[name], theirs[name]), name


@pytest.mark.parametrize("norm", NORM.names())
@pytest.mark.parametrize("attention", _with_option("qk_norm"), ids=case_id)
@pytest.mark.parametrize("lineage", lineages("generates"))
def test_qk_norm_normalises_each_heads_queries_and_keys(lineage, attention, norm):
    """attention.qk_norm=true: every q_norm and k_norm normalises each head's vector on its own (over the
    head size, not d_model): its output is the norm formula of its input, does not change when one head's
    vector is scaled, and cached decoding still equals recomputation."""
    cfg = tiny_cfg(lineage, attention={**attention, "qk_norm": True}, norm={"type": norm}, position={"name": "rope"})
    model = build_model(cfg).eval()
    # Every attention normalises its queries; keys wherever they have a part of their own to normalise (mla's keys
    # are made from a latent it always normalises, and only their rotary part, absent in cross-attention, has a k_norm).
    norms = {n: m for n, m in model.named_modules()
             if n.endswith(("q_norm", "k_norm")) and not isinstance(m, torch.nn.Identity)}
    attentions = [n for n, m in model.named_modules() if hasattr(m, "q_norm")]
    assert attentions and all(f"{n}.q_norm" in norms for n in attentions)
    norm_class = NORM.get(norm)  # the model's norm type (a factory that is not a class: not checked)
    assert norms and all(isinstance(m, norm_class) for m in norms.values() if isinstance(norm_class, type))
    with torch.no_grad():
        for p in model.parameters():  # gains and biases away from 1 and 0, so the norm's own weights show
            p.add_(torch.randn_like(p) * 0.1)
    seen = {}
    keep = lambda name: lambda m, args, out: seen.setdefault(name, (args[0], out)) and None  # None: output unchanged
    hooks = [m.register_forward_hook(keep(n)) for n, m in norms.items()]
    src, tgt = torch.randint(0, 37, (2, 9)), torch.randint(0, 37, (2, 12))
    model(src, tgt) if model.needs_source else model(tgt)
    for h in hooks:
        h.remove()
    assert seen.keys() == norms.keys()  # every one of them ran
    reference = {"layernorm": lambda x, m: F.layer_norm(x, (x.shape[-1],), m.weight, m.bias, m.eps),
                 "rmsnorm": lambda x, m: F.rms_norm(x, (x.shape[-1],), m.weight, m.eps)}.get(norm)
    for name, (x, y) in seen.items():
        m = norms[name]
        assert x.dim() == 4 and x.shape[-1] == m.weight.shape[0] < cfg["d_model"]  # (B, heads, T, head size)
        assert name.endswith("k_norm") or x.shape[1] == cfg["n_heads"]  # queries: every head (keys: n_kv_heads)
        if reference is not None:  # a norm type added later is checked by the scale property alone
            torch.testing.assert_close(y, reference(x, m), atol=1e-5, rtol=0)
        # each head vector its own scale in [1, 10]: the output keeps within eps' effect (a norm across
        # heads, or over d_model, would move by O(1))
        scale = torch.rand(*x.shape[:-1], 1) * 9 + 1
        with torch.no_grad():
            torch.testing.assert_close(m(x * scale), y, atol=5e-3, rtol=0)
    seq = torch.randint(0, 37, (2, 14))
    with torch.no_grad():
        memory = model.encode(src) if model.needs_source else None
        step = lambda t, c: model.decode(t, memory, cache=c) if model.needs_source else model(t, cache=c)
        cache = model.new_cache()
        cached = torch.cat([step(seq[:, :5], cache)] + [step(seq[:, t:t + 1], cache) for t in range(5, 14)], dim=1)
        torch.testing.assert_close(cached, step(seq, None), atol=1e-5, rtol=0)
