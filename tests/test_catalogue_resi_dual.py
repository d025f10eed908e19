"""ResiDual (norm=resi_dual_ln, placement resi_dual; Xie et al. 2023) against the paper's equations written out in
float64 on the model's own sublayers, 3 heads, 13 tokens, a padded row:
    x_a^1 = x_d^1 = x,  x_a^{k+1} = LN(x_a^k + f_k(x_a^k)),  x_d^{k+1} = x_d^k + f_k(x_a^k),
    output x_a^{N+1} + LN(x_d^{N+1}), over every sublayer f_k (attention, FFN) of every block in turn.
Cached decoding at offsets equals recomputation."""

import pytest
import torch

from tests.catalogue import check_chunked_decoding
from zoo import build_model, count_params
from zoo.block import NO_POSITION
from zoo.layers.attention import attention_bias

B, T = 2, 13


def _cfg(lineage: str = "decoder_only", norm: str = "layernorm", **over) -> dict:
    return {"name": lineage, "vocab_size": 37, "d_model": 12, "n_heads": 3, "n_layers": 3, "max_seq_len": 16,
            "position": {"name": "none"}, "norm": {"placement": "resi_dual", "type": norm}, "init_std": 0.3, **over}


def _by_the_paper(stack, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    x_a = x_d = stack.embed(tokens)
    mask, is_causal = attention_bias(T, T, stack.causal, None, NO_POSITION, padding, x_a.device, x_a.dtype)
    for block in stack.blocks:
        for step, kw in ((block.attn, dict(pos=NO_POSITION, mask=mask, is_causal=is_causal)), (block.ffn, {})):
            f = step.f(x_a, **kw)
            x_a, x_d = step.norm(x_a + f), x_d + f
    return x_a + stack.carry.norm(x_d)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_only"])
def test_resi_dual_follows_the_papers_equations(lineage, norm):
    model = build_model(_cfg(lineage, norm)).double()
    stack = model.decoder if lineage == "decoder_only" else model.encoder
    tokens = torch.randint(0, 37, (B, T), generator=torch.Generator().manual_seed(1))
    padding = torch.ones(B, T, dtype=torch.bool)
    padding[1, T - 3:] = False
    out = stack(tokens, padding=padding)
    assert isinstance(stack.final_norm, torch.nn.Identity)  # the dual stream's close is the last norm
    torch.testing.assert_close(out[padding], _by_the_paper(stack, tokens, padding)[padding], atol=1e-12, rtol=0)
    # the dual stream matters: Post-LN on the same weights (the carried norm dropped) differs
    post = build_model(_cfg(lineage, norm) | {"norm": {"placement": "post", "type": norm}})
    post = post.double()
    post.load_state_dict({k: v for k, v in model.state_dict().items() if ".carry." not in k})
    other = post.decoder if lineage == "decoder_only" else post.encoder
    assert (other(tokens, padding=padding) - out)[padding].abs().max() > 1e-2


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_resi_dual_decodes_from_the_cache_as_full_recomputation(lineage):
    model = build_model(_cfg(lineage, position={"name": "rope"})).double().eval()
    check_chunked_decoding(model, torch.randint(0, 37, (B, T), generator=torch.Generator().manual_seed(2)))


def test_resi_dual_counts_its_dual_norm_in_place_of_a_final_norm():
    """Post-LN has no final norm; ResiDual's one extra norm per stack is the dual stream's (d_model weights and
    biases), counted with the norms."""
    post = count_params(_cfg() | {"norm": {"placement": "post", "type": "layernorm"}})
    dual = count_params(_cfg())
    assert dual["total"] - post["total"] == 2 * 12 and dual["norm"] - post["norm"] == 2 * 12
