"""The output heads and embeddings of zoo/models/vocab.py against their papers' equations written out in float64
(x-transformers 2.31 has none of them), and against torch.nn.AdaptiveLogSoftmaxWithLoss with copied weights."""

import pytest
import torch

from tests.helpers import tiny_cfg
from zoo.build import build_model, count_params, flops_per_token
from zoo.component import ConfigError
from zoo.generate import generate, sample_next
from zoo.training.objectives import OBJECTIVE

V, D = 37, 32


def mixture_reference(model, hidden: torch.Tensor) -> torch.Tensor:
    """Yang et al. 2018, eq. 4: P(x | h) = sum_k pi_k exp(h_k . w_x) / sum_x' exp(h_k . w_x'), h_k = tanh(P_k h),
    pi_k = exp(w_k . h) / sum_k' exp(w_k' . h); w_x the output table's row of x."""
    head, k = model.head, model.cfg.softmaxes
    table = head.out.table()
    prior = torch.softmax(hidden @ head.prior.weight.T, -1)
    p = torch.zeros(*hidden.shape[:-1], V, dtype=hidden.dtype)
    for i in range(k):
        rows = slice(i * D, (i + 1) * D)
        latent = hidden @ head.latent.weight[rows].T
        if head.latent.bias is not None:
            latent = latent + head.latent.bias[rows]
        logits = torch.tanh(latent) @ table.T
        if head.out.bias is not None:
            logits = logits + head.out.bias
        p += prior[..., i:i + 1] * torch.softmax(logits, -1)
    return p


@pytest.mark.parametrize("lineage, tie", [("decoder_only", True), ("decoder_only", False), ("encoder_only", True)])
def test_mixture_of_softmaxes_is_the_papers_mixture(lineage, tie):
    model = build_model(tiny_cfg(lineage, softmaxes=3, tie_embeddings=tie, init_std=0.3), seed=2).double()
    hidden = torch.randn(2, 13, D, dtype=torch.float64, requires_grad=True)
    hidden_ref = hidden.detach().clone().requires_grad_()
    log_p = model.head(hidden)
    ref = mixture_reference(model, hidden_ref)
    torch.testing.assert_close(log_p, ref.log(), rtol=1e-10, atol=1e-10)
    assert model.head.out.tied == ((model.embed,) if tie else ())
    target = torch.randint(0, V, (2, 13))
    weight = model.head.latent.weight
    grad = torch.autograd.grad(log_p.gather(-1, target[..., None]).sum(), [hidden, weight])
    grad_ref = torch.autograd.grad(ref.gather(-1, target[..., None]).log().sum(), [hidden_ref, weight])
    for g, g_ref in zip(grad, grad_ref, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-10)


def test_the_loss_is_minus_log_mixture_probability_and_sampling_draws_from_the_mixture():
    model = build_model(tiny_cfg(softmaxes=4, init_std=0.3), seed=3).double()
    tokens = torch.randint(0, V, (3, 11))
    batch = {"input": tokens[:, :-1], "target": tokens[:, 1:]}
    loss, _ = OBJECTIVE.get("decoder_only")(V).loss(model, batch)
    p = mixture_reference(model, model.decoder(batch["input"]))
    expected = -p.gather(-1, batch["target"][..., None]).log().mean()
    torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-6)  # cross_entropy in float32
    # sampling at temperature 1: softmax(log P) is P, so a seeded draw is torch.multinomial's draw from P
    log_p = model.head(model.decoder(tokens))[:, -1]
    drawn = sample_next(log_p.repeat(50, 1), generator=torch.Generator().manual_seed(5))
    p_last = mixture_reference(model, model.decoder(tokens))[:, -1].float()
    from_p = torch.multinomial(p_last.repeat(50, 1), 1, generator=torch.Generator().manual_seed(5)).squeeze(-1)
    assert torch.equal(drawn, from_p)


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_mixture_cached_generation_equals_recomputation(lineage):
    model = build_model(tiny_cfg(lineage, softmaxes=3), seed=1).eval()
    prompt, src = torch.randint(0, V, (2, 5)), torch.randint(0, V, (2, 7))
    src = src if lineage == "encoder_decoder" else None
    g = [torch.Generator().manual_seed(0) for _ in range(2)]
    cached = generate(model, prompt, 8, temperature=1.0, src=src, generator=g[0])
    assert torch.equal(cached, generate(model, prompt, 8, temperature=1.0, src=src, use_cache=False, generator=g[1]))


def test_mixture_counts_and_flops_come_from_the_module():
    plain, mixed = tiny_cfg(n_layers=1), tiny_cfg(n_layers=1, softmaxes=3)
    assert count_params(mixed)["head"] - count_params(plain)["head"] == D * 3 + D * 3 * D  # prior, latents
    extra = flops_per_token(mixed)["forward"] - flops_per_token(plain)["forward"]
    assert extra == 2 * D * 3 + 2 * D * 3 * D + 2 * 2 * V * D  # prior, latents, two more products with the table


@pytest.mark.parametrize("over, key", [({"softmaxes": 0}, "model.softmaxes"), ({"softmaxes": 1.5}, "model.softmaxes")])
def test_bad_head_options_are_one_line_naming_the_key(over, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        build_model(tiny_cfg(**over))


E = 8  # the factorized embedding's width


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_only", "encoder_decoder"])
@pytest.mark.parametrize("tie", [True, False])
def test_factorized_embedding_and_head_are_albert_s_factorization(lineage, tie):
    """ALBERT: embedding = T[x] P^T with T (vocab, E), P (d, E); the tied head reads the same T and P: h P T^T."""
    model = build_model(tiny_cfg(lineage, embed_dim=E, tie_embeddings=tie, init_std=0.3), seed=4).double()
    tokens = torch.randint(0, V, (2, 13))
    table, proj = model.embed.table.weight, model.embed.proj.weight
    torch.testing.assert_close(model.embed(tokens), table[tokens] @ proj.T, rtol=0, atol=0)
    h = torch.randn(2, 13, D, dtype=torch.float64)
    head = model.head
    down = proj if tie else head.down.weight.T
    out_table = table if tie else head.out.weight
    expected = h @ down @ out_table.T + (head.out.bias if head.out.bias is not None else 0)
    torch.testing.assert_close(head(h), expected, rtol=1e-12, atol=1e-12)
    counts = count_params(tiny_cfg(lineage, embed_dim=E, tie_embeddings=tie))
    n_tables = 2 if not tie else 1
    bias = V if lineage == "encoder_only" else 0
    assert counts["embedding"] == V * E + E * D  # the table and its projection
    assert counts["head"] - (D * D + D if lineage == "encoder_only" else 0) == \
        (n_tables - 1) * (V * E + D * E) + bias  # the MLM head's dense apart


# Narang et al. 2021's embedding rows, as encoder_decoder options: which tables are one tensor
NARANG = {  # row: (options, encoder input is decoder input, decoder input is output)
    "Tied encoder/decoder input embeddings": ({"tie_embeddings": False}, True, False),
    "Tied decoder input and output embeddings": ({"tie_encoder_decoder": False}, False, True),
    "Untied embeddings": ({"tie_embeddings": False, "tie_encoder_decoder": False}, False, False),
    "Factorized embedding": ({"embed_dim": E, "tie_embeddings": False, "tie_encoder_decoder": False}, False, False),
    "Factorized & shared embeddings": ({"embed_dim": E}, True, True),
}


@pytest.mark.parametrize("row", NARANG)
def test_narang_embedding_rows_share_what_they_say(row):
    options, enc_dec, dec_out = NARANG[row]
    model = build_model(tiny_cfg("encoder_decoder", **options))
    enc, dec = model.encoder.embed, model.decoder.embed
    assert (enc is dec) == enc_dec
    out = model.head.out.table() if hasattr(model.head, "out") else model.head.weight
    assert (out is dec.weight) == dec_out
    tables = {id(m.weight) for m in (enc, dec)} | {id(out)}
    width = options.get("embed_dim", D)
    projections = (len({id(enc), id(dec)}) + (not dec_out)) * D * E if "embed_dim" in options else 0
    assert count_params(tiny_cfg("encoder_decoder", **options))["embedding"] + \
        count_params(tiny_cfg("encoder_decoder", **options))["head"] == len(tables) * V * width + projections


@pytest.mark.parametrize("options", [{"embed_dim": E}, {"tie_encoder_decoder": False},
                                     {"embed_dim": E, "softmaxes": 2}])
def test_factorized_and_untied_cached_generation_equals_recomputation(options):
    model = build_model(tiny_cfg("encoder_decoder", **options), seed=1).eval()
    prompt, src = torch.randint(0, V, (2, 3)), torch.randint(0, V, (2, 7))
    assert torch.equal(generate(model, prompt, 8, src=src), generate(model, prompt, 8, src=src, use_cache=False))


def test_factorized_flops_come_from_the_module():
    plain, factorized = tiny_cfg(n_layers=1), tiny_cfg(n_layers=1, embed_dim=E)
    # the embedding's projection, and the head's map to E and products with a (vocab, E) table instead of (vocab, D)
    expected = 2 * E * D + 2 * D * E + 2 * V * E - 2 * V * D
    assert flops_per_token(factorized)["forward"] - flops_per_token(plain)["forward"] == expected


@pytest.mark.parametrize("over, key", [({"embed_dim": 0}, "model.embed_dim"), ({"embed_dim": 8.0}, "model.embed_dim"),
                                       ({"tie_encoder_decoder": False}, "model.tie_encoder_decoder")])
def test_bad_embedding_options_are_one_line_naming_the_key(over, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        build_model(tiny_cfg(**over))


CUTOFFS = [9, 20]  # three clusters of the 37 ids: 9, 11 and 17 tokens, 32, 8 and 2 wide (div 4)


def adaptive_cfg(lineage: str = "decoder_only", **over) -> dict:
    return tiny_cfg(lineage, adaptive_input=True, adaptive_softmax=True, adaptive_cutoffs=CUTOFFS, **over)


def test_adaptive_softmax_equals_torch_adaptive_log_softmax_with_copied_weights():
    model = build_model(tiny_cfg(adaptive_softmax=True, adaptive_cutoffs=CUTOFFS, tie_embeddings=False,
                                 adaptive_div=2.0), seed=5).double()
    ref = torch.nn.AdaptiveLogSoftmaxWithLoss(D, V, CUTOFFS, div_value=2.0).double()
    head = model.head
    with torch.no_grad():
        ref.head.weight.copy_(torch.cat([head.tables[0], head.cluster_logits]))
        for tail, table, proj in zip(ref.tail, head.tables[1:], head.proj, strict=True):
            tail[0].weight.copy_(proj)
            tail[1].weight.copy_(table)
    h = torch.randn(3, 13, D, dtype=torch.float64, requires_grad=True)
    h_ref = h.detach().clone().requires_grad_()
    out, expected = head(h), ref.log_prob(h_ref.flatten(0, 1)).view(3, 13, V)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    target = torch.randint(0, V, (3, 13))
    loss = -out.gather(-1, target[..., None]).mean()  # what cross-entropy makes of log-probabilities
    torch.testing.assert_close(loss, ref(h_ref.flatten(0, 1), target.flatten()).loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(loss, h)[0],
                               torch.autograd.grad(ref(h_ref.flatten(0, 1), target.flatten()).loss, h_ref)[0])


def test_adaptive_input_is_baevski_and_auli_s_clusters_and_tied_to_the_softmax():
    model = build_model(adaptive_cfg(init_std=0.3, max_seq_len=64), seed=6).double()
    embed, head = model.embed, model.head
    tokens = torch.arange(V).view(1, V)
    expected = torch.stack([embed.tables[0].weight[x] if x < 9 else
                            embed.tables[1].weight[x - 9] @ embed.proj[0] if x < 20 else
                            embed.tables[2].weight[x - 20] @ embed.proj[1] for x in range(V)])
    torch.testing.assert_close(embed(tokens)[0], expected, rtol=1e-12, atol=1e-12)
    assert [t.weight.shape[1] for t in embed.tables] == [32, 8, 2]
    tables, proj = head.weights()  # tied: the embedding's tensors themselves
    assert all(a is b.weight for a, b in zip(tables, embed.tables, strict=True))
    assert all(a is b for a, b in zip(proj, embed.proj, strict=True))
    assert torch.allclose(model(tokens).exp().sum(-1), torch.ones(1, V, dtype=torch.float64))


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_adaptive_cached_generation_equals_recomputation(lineage):
    model = build_model(adaptive_cfg(lineage), seed=1).eval()
    prompt, src = torch.randint(0, V, (2, 3)), torch.randint(0, V, (2, 7))
    src = src if lineage == "encoder_decoder" else None
    g = [torch.Generator().manual_seed(0) for _ in range(2)]
    cached = generate(model, prompt, 8, temperature=1.0, src=src, generator=g[0])
    assert torch.equal(cached, generate(model, prompt, 8, temperature=1.0, src=src, use_cache=False, generator=g[1]))


def test_adaptive_counts_and_flops_come_from_the_module():
    counts = count_params(adaptive_cfg(n_layers=1))
    tables, proj = 9 * 32 + 11 * 8 + 17 * 2, 8 * 32 + 2 * 32
    assert counts["embedding"] == tables + proj and counts["head"] == 2 * D  # the head's two tail entries
    plain = flops_per_token(tiny_cfg(n_layers=1))["forward"] - 2 * V * D
    head = 2 * (9 + 2) * D + 2 * (8 * 32 + 11 * 8) + 2 * (2 * 32 + 17 * 2)
    assert flops_per_token(adaptive_cfg(n_layers=1))["forward"] - plain == 2 * 8 * 32 + head


def test_adaptive_with_the_bpe_tokenizer_learns():
    """A word-piece vocabulary, as the option is meant for: BPE on the embedded corpus, ids in merge order."""
    from zoo.data.corpus import load_default_corpus
    from zoo.data.tokenizers import build_tokenizer

    text = load_default_corpus()[:20000]
    tok = build_tokenizer("bpe", vocab_size=300).fit(text)
    ids = torch.tensor(tok.encode(text)[:8 * 129]).view(8, 129)
    cfg = tiny_cfg(vocab_size=tok.vocab_size, adaptive_input=True, adaptive_softmax=True,
                   adaptive_cutoffs=[64, 160], max_seq_len=256)
    model = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    objective = OBJECTIVE.get("decoder_only")(tok.vocab_size)
    batch = objective.text_batch(ids, torch.Generator())
    first = objective.loss(model, batch)[0].item()
    for _ in range(30):
        opt.zero_grad()
        objective.loss(model, batch)[0].backward()
        opt.step()
    assert first > 5.5 and objective.loss(model, batch)[0].item() < first - 1.5  # log(300) = 5.7 at the start


@pytest.mark.parametrize("over, key", [
    ({"adaptive_softmax": True}, "model.adaptive_cutoffs"),
    ({"adaptive_softmax": True, "adaptive_cutoffs": [20, 9]}, "model.adaptive_cutoffs"),
    ({"adaptive_softmax": True, "adaptive_cutoffs": [9, 37]}, "model.adaptive_cutoffs"),
    ({"adaptive_softmax": True, "adaptive_cutoffs": [9]}, "model.tie_embeddings"),
    ({"adaptive_input": True, "adaptive_cutoffs": [9], "embed_dim": 8, "tie_embeddings": False}, "model.embed_dim"),
    ({"adaptive_softmax": True, "adaptive_cutoffs": [9], "softmaxes": 2, "tie_embeddings": False}, "model.softmaxes"),
    ({"adaptive_input": True, "adaptive_cutoffs": [9, 20, 30], "adaptive_div": 8.0, "tie_embeddings": False},
     "model.adaptive_div")])
def test_bad_adaptive_options_are_one_line_naming_the_key(over, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        build_model(tiny_cfg(**over))
