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
    grad = torch.autograd.grad(log_p.gather(-1, target[..., None]).sum(), [hidden, model.head.latent.weight])
    grad_ref = torch.autograd.grad(ref.gather(-1, target[..., None]).log().sum(), [hidden_ref, model.head.latent.weight])
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


@pytest.mark.parametrize("over, key", [({"softmaxes": 0}, "model.softmaxes"),
                                       ({"softmaxes": 2, "parametrization": "mup"}, "model.softmaxes")])
def test_bad_head_options_are_one_line_naming_the_key(over, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        build_model(tiny_cfg(**over))
