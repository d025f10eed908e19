"""position=t5: T5's relative position bias (bucketed distances, a learned table per stack)."""

import pytest
import torch

from tests.helpers import tiny_cfg
from zoo import build_model
from zoo.component import ConfigError, Context, build
from zoo.generate import generate
from zoo.registry import POSITION
from zoo.spec import Part


def t5(causal, n_heads=4, **opts):
    ctx = Context(d_model=32, n_heads=n_heads, max_seq_len=16, causal=causal)
    pos = build(POSITION, Part("t5", POSITION.options("t5")(**opts)), ctx)
    torch.nn.init.normal_(pos.weight)
    return pos


# Worked out by hand from the rule (defaults: 32 buckets, max_distance 128), distance d = |key - query|:
# encoder: 16 buckets per direction, d < 8 exact, else 8 + floor(ln(d / 8) / ln(16) * 8), at most 15,
#          plus 16 for keys after the query; e.g. d=12: 8 + floor(1.17) = 9, d=40: 8 + floor(4.64) = 12.
# decoder: 32 buckets for keys up to the query, d < 16 exact, else 16 + floor(ln(d / 16) / ln(8) * 16),
#          at most 31; e.g. d=20: 16 + floor(1.72) = 17, d=40: 16 + floor(7.05) = 23, d=100: 16 + 14 = 30.
ENCODER = {0: 0, 1: 1, 7: 7, 8: 8, 11: 8, 12: 9, 20: 10, 30: 11, 40: 12, 90: 14, 91: 15, 127: 15, 128: 15, 500: 15}
DECODER = {0: 0, 1: 1, 15: 15, 16: 16, 20: 17, 32: 21, 40: 23, 100: 30, 127: 31, 128: 31, 500: 31}


def test_buckets_match_a_hand_computed_table_in_both_directions():
    enc, dec = t5(causal=False), t5(causal=True)
    d = torch.tensor(list(ENCODER))
    assert enc.buckets(-d).tolist() == list(ENCODER.values())  # keys before the query
    assert enc.buckets(d).tolist() == [0] + [16 + b for b in list(ENCODER.values())[1:]]  # keys after it
    d = torch.tensor(list(DECODER))
    assert dec.buckets(-d).tolist() == list(DECODER.values())
    assert dec.buckets(torch.tensor([1, 5, 300])).tolist() == [0, 0, 0]  # future keys (masked) share bucket 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 12), (6, 9)])
def test_buckets_match_hugging_face_t5(causal, num_buckets, max_distance):
    """A reference nobody here wrote: transformers' T5Attention._relative_position_bucket."""
    t5_module = pytest.importorskip("transformers.models.t5.modeling_t5")
    rel = torch.arange(-700, 700)
    ref = t5_module.T5Attention._relative_position_bucket(rel, bidirectional=not causal, num_buckets=num_buckets,
                                                          max_distance=max_distance)
    assert torch.equal(t5(causal, num_buckets=num_buckets, max_distance=max_distance).buckets(rel), ref)


@pytest.mark.parametrize("causal", [False, True])
def test_bias_depends_only_on_relative_distance(causal):
    pos = t5(causal)
    bias = pos.score_bias(40, 40)  # (H, t_q, t_k)
    assert bias.shape == (4, 40, 40)
    for i in range(40):
        for j in range(40):
            assert torch.equal(bias[:, i, j], pos.weight[pos.buckets(torch.tensor(j - i))])
    # and shifting both positions by the same amount (a KV cache offset) changes nothing
    torch.testing.assert_close(pos.score_bias(10, 30, offset=20), bias[:, 30:, 10:], atol=0, rtol=0)
    for t in range(1, 40):  # one new query against every cached key: the last row of the full bias
        torch.testing.assert_close(pos.score_bias(1, t + 1, offset=t)[:, 0], bias[:, t, : t + 1], atol=0, rtol=0)


def test_encoder_tells_left_from_right_and_decoder_does_not_need_to():
    enc, dec = t5(False), t5(True)
    e, d = enc.score_bias(5, 5), dec.score_bias(5, 5)
    assert not torch.equal(e[:, 1, 0], e[:, 0, 1])  # key one before vs one after: different buckets
    assert torch.equal(d[:, 0, 1], d[:, 0, 0])  # a decoder's future keys fall into bucket 0 (they are masked)


def test_one_table_per_stack_shared_by_its_layers_and_it_learns():
    model = build_model(tiny_cfg("encoder_decoder", n_layers=3, position={"name": "t5"}))
    tables = [n for n, _ in model.named_parameters() if "position" in n]
    assert tables == ["encoder.position.weight", "decoder.position.weight"]
    assert model.encoder.position.weight.shape == (32, 4)
    src, tgt = torch.randint(0, 37, (2, 9)), torch.randint(0, 37, (2, 6))
    padding = torch.ones(2, 9, dtype=torch.bool)
    padding[1, 6:] = False
    model(src, tgt, padding).square().mean().backward()  # the default (sdpa) backend
    for stack in (model.encoder, model.decoder):
        assert stack.position.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_cached_decoding_equals_recomputation(lineage):
    model = build_model(tiny_cfg(lineage, max_seq_len=8, position={"name": "t5", "max_distance": 12,
                                                                      "num_buckets": 8}))
    with torch.no_grad():  # a table where every bucket matters
        for stack in (getattr(model, "encoder", None), model.decoder):
            if stack is not None:
                stack.position.weight.normal_()
    src = torch.randint(0, 37, (2, 7)) if lineage == "encoder_decoder" else None
    prompt = torch.randint(0, 37, (2, 3))
    cached = generate(model, prompt, 15, src=src)  # 18 tokens: past max_seq_len and max_distance
    assert torch.equal(cached, generate(model, prompt, 15, src=src, use_cache=False))
    with torch.no_grad():
        full = model(cached) if src is None else model(src, cached)
        cache = model.new_cache()
        memory = None if src is None else model.encode(src)
        step = (lambda x: model(x, cache=cache)) if src is None else (lambda x: model.decode(x, memory, cache=cache))
        steps = [step(cached[:, :5])] + [step(cached[:, t:t + 1]) for t in range(5, cached.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("opts, match", [
    ({"num_buckets": 3}, "model.position.num_buckets: must be at least 4"),
    ({"num_buckets": 32, "max_distance": 8}, "model.position.max_distance: must be above the 8 exact"),
    ({"num_buckets": "many"}, "model.position.num_buckets: expected an integer"),
    ({"buckets": 32}, "model.position.buckets: not an option of 't5'; valid: max_distance, num_buckets"),
])
def test_bad_options_fail_in_one_line_naming_the_key(opts, match):
    with pytest.raises(ConfigError, match=match) as err:
        build_model(tiny_cfg("encoder_decoder", position={"name": "t5", **opts}))
    assert "\n" not in str(err.value)
