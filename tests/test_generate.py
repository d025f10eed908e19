"""KV-cached decoding equals full recomputation; sampling does what its name says."""

import pytest
import torch

from tests.helpers import case_id, cases, lineages, make, model_cases, tiny_cfg
from zoo import build_model
from zoo.generate import generate, sample_next
from zoo.registry import POSITION

# Cases from the registries (tests/helpers.py); the full product of kinds is replaced by a pairwise
# covering design per lineage: every value of each kind meets every value of every other kind.


def _logits(model, tokens, cache=None, src=None):
    if src is None:
        return model(tokens, cache=cache)
    return model.decode(tokens, model.encode(src), cache=cache)


@pytest.mark.parametrize("cfg", model_cases(lineages("generates")), ids=case_id)
def test_cached_logits_equal_full_recomputation(cfg):
    """In float64: the equality is the maths'; in float32 a part that selects (top-k keys, product keys, experts)
    may pick differently at a near-tie, where a cached step's rounding differs from the full forward's."""
    model = build_model(cfg).eval().double()
    seq = torch.randint(0, 37, (2, 20))
    src = torch.randint(0, 37, (2, 9)) if model.needs_source else None
    with torch.no_grad():
        full = _logits(model, seq, src=src)
        cache = model.new_cache()
        steps = [_logits(model, seq[:, :6], cache, src)]  # prefill a prompt, then one token at a time
        steps += [_logits(model, seq[:, t:t + 1], cache, src) for t in range(6, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=0)


@pytest.mark.parametrize("position", cases("position"), ids=case_id)
@pytest.mark.parametrize("lineage", lineages("generates"))
def test_cached_greedy_generation_equals_uncached(lineage, position):
    model = build_model(tiny_cfg(lineage, position=position, init_std=0.3))
    prompt = torch.randint(0, 37, (3, 4))
    src = torch.randint(0, 37, (3, 7)) if model.needs_source else None
    a = generate(model, prompt, 24, src=src)
    b = generate(model, prompt, 24, src=src, use_cache=False)
    assert a.shape == (3, 28) and torch.equal(a, b)
    assert len(set(a[:, 4:].flatten().tolist())) > 1  # not a constant output


def test_learned_positions_stop_with_a_clear_error_past_max_seq_len():
    model = build_model(tiny_cfg(max_seq_len=16))
    with pytest.raises(ValueError, match="max_seq_len=16"):
        generate(model, torch.zeros(1, 10, dtype=torch.long), 7)
    assert generate(model, torch.zeros(1, 10, dtype=torch.long), 6).shape == (1, 16)


@pytest.mark.parametrize("use_cache", [True, False])
def test_slide_continues_learned_positions_on_the_last_max_seq_len_tokens(use_cache):
    model = build_model(tiny_cfg(max_seq_len=16))
    prompt = torch.randint(0, 37, (2, 10))
    out = generate(model, prompt, 30, slide=True, use_cache=use_cache)
    assert out.shape == (2, 40) and torch.equal(out[:, :16], generate(model, prompt, 6))  # as before up to the limit
    for i in range(16, 40):  # every later token is the greedy choice given the 16 tokens before it
        window = out[:, i - 16:i]
        assert torch.equal(out[:, i], model(window)[:, -1].argmax(-1)), i


@pytest.mark.parametrize("position", [p for p in cases("position") if not make(POSITION, **p).hard_limit], ids=case_id)
def test_other_positions_continue_past_max_seq_len(position):
    model = build_model(tiny_cfg(max_seq_len=16, position=position))
    out = generate(model, torch.zeros(1, 10, dtype=torch.long), 40)
    assert out.shape == (1, 50)
    # and the cached tokens past max_seq_len still equal recomputation
    assert torch.equal(out, generate(model, torch.zeros(1, 10, dtype=torch.long), 40, use_cache=False))


def test_encoder_only_does_not_generate():
    with pytest.raises(ValueError, match="does not generate"):
        generate(build_model(tiny_cfg("encoder_only")), torch.zeros(1, 3, dtype=torch.long), 2)


def test_eos_stops_generation():
    model = build_model(tiny_cfg())
    greedy = generate(model, torch.zeros(2, 3, dtype=torch.long), 5)
    eos = int(greedy[0, 3])  # the first greedy token: make it the end token
    out = generate(model, torch.zeros(2, 3, dtype=torch.long), 20, eos_id=eos)
    assert out.shape[1] == 4 and (out[:, 3] == eos).all()


def test_sampling_filters():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(2000, 1)
    g = torch.Generator().manual_seed(0)
    assert (sample_next(logits, 0.0) == 0).all()
    topk = sample_next(logits, 1.0, top_k=2, generator=g)
    assert set(topk.tolist()) == {0, 1}
    # softmax([4,3,2,1,0]) = .64 .23 .09 .03 .01: top_p=0.8 keeps the first two, 0.9 the first three
    assert set(sample_next(logits, 1.0, top_p=0.8, generator=g).tolist()) == {0, 1}
    assert set(sample_next(logits, 1.0, top_p=0.9, generator=g).tolist()) == {0, 1, 2}
    # temperature: high temperature spreads mass, low concentrates it
    hot = sample_next(logits, 100.0, generator=g)
    cold = sample_next(logits, 0.1, generator=g)
    assert (hot == 4).sum() > 200 and (cold == 0).float().mean() > 0.99


BAD_SAMPLING = [  # (keyword, value, the one line: the same from every entry point)
    ("temperature", -1.0, "temperature: got -1.0; valid: a finite number >= 0 (0 = greedy)"),
    ("temperature", float("inf"), "temperature: got inf; valid: a finite number >= 0 (0 = greedy)"),
    ("top_k", 0, "top_k: got 0; valid: an integer >= 1, or none"),
    ("top_k", -3, "top_k: got -3; valid: an integer >= 1, or none"),
    ("top_p", 0.0, "top_p: got 0.0; valid: a number in (0, 1], or none"),
    ("top_p", 1.5, "top_p: got 1.5; valid: a number in (0, 1], or none"),
]


@pytest.mark.parametrize("key, value, error", BAD_SAMPLING, ids=[f"{k}={v}" for k, v, _ in BAD_SAMPLING])
def test_the_library_checks_sampling_values_where_it_uses_them(key, value, error, capsys):
    """sample_next and generate refuse what the CLI and the config refuse, with the same line."""
    with pytest.raises(ValueError) as err:
        sample_next(torch.tensor([[4.0, 3.0, 2.0]]), **{"temperature": 1.0, key: value})
    assert str(err.value) == error
    with pytest.raises(ValueError) as err:
        generate(build_model(tiny_cfg()), torch.zeros(1, 2, dtype=torch.long), 3, **{key: value})
    assert str(err.value) == error
    from zoo.sample import main as sample_main

    assert sample_main(["no.ckpt", f"--{key.replace('_', '-')}", str(value)]) == 2  # before reading the file
    assert capsys.readouterr().err == f"error: --{key.replace('_', '-')}{error.removeprefix(key)}\n"


def test_generate_checks_its_tensors_and_ids():
    model = build_model(tiny_cfg())
    vocab = model.cfg.vocab_size
    cases = [
        (torch.zeros(3, dtype=torch.long), {}, "prompt: expected an integer tensor (batch >= 1, length >= 1), got "
                                               "torch.int64 of shape (3,)"),
        (torch.zeros(1, 2), {}, "prompt: expected an integer tensor (batch >= 1, length >= 1), got torch.float32 of "
                                "shape (1, 2)"),
        (torch.zeros(1, 0, dtype=torch.long), {}, "prompt: expected an integer tensor (batch >= 1, length >= 1), got "
                                                  "torch.int64 of shape (1, 0)"),
        (torch.full((1, 2), vocab), {}, f"prompt: id {vocab} is outside the model's vocabulary (0..{vocab - 1})"),
        (torch.full((1, 2), -1), {}, f"prompt: id -1 is outside the model's vocabulary (0..{vocab - 1})"),
        (torch.zeros(1, 2, dtype=torch.long), {"eos_id": vocab},
         f"eos_id: got {vocab}; valid: an id of the model's vocabulary, or None"),
        (torch.zeros(1, 2, dtype=torch.long), {"max_new_tokens": -1}, "max_new_tokens: got -1; valid: an integer >= 0"),
    ]
    for prompt, kw, error in cases:
        with pytest.raises(ValueError) as err:
            generate(model, prompt, **{"max_new_tokens": 3, **kw})
        assert str(err.value) == error
    with pytest.raises(ValueError, match=r"^logits: expected a float tensor \(batch, vocab\), got torch.int64"):
        sample_next(torch.zeros(2, 5, dtype=torch.long))


def test_sample_given_a_run_directory_says_which_file_to_give(tmp_path, capsys):
    from zoo.sample import main as sample_main

    assert sample_main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: checkpoint: '{tmp_path}' is a directory; give a checkpoint file "
                                       "(<run dir>/checkpoints/best.ckpt or last.ckpt)\n")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert sample_main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: checkpoint: '{tmp_path}' is a directory; give a checkpoint file "
                                       f"(e.g. '{tmp_path / 'checkpoints' / 'last.ckpt'}')\n")
