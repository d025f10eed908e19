"""zoo.convert: HF GPT-2 / BERT / Llama / BART / T5 -> zoo models with equal logits (random weights, no downloads)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

from zoo import count_params  # noqa: E402
from zoo.convert import (  # noqa: E402
    ConversionError,
    _Copier,
    bart_from_hf,
    config_from_hf,
    convert,
    llama_config_from_hf,
)

V, D, T = 101, 64, 12  # vocab, width, sequence length
ATOL = 1e-4
SMALL = dict(attn_implementation="eager")
NO_DROPOUT = {
    "gpt2": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "bert": dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "bart": dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0),
    "llama": dict(attention_dropout=0.0),
    "t5": dict(dropout_rate=0.0),
}


def gpt2_config(**kw):
    return transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=D, n_layer=2, n_head=4,
                                   **NO_DROPOUT["gpt2"], **SMALL, **kw)


def bert_config(**kw):
    return transformers.BertConfig(vocab_size=V, hidden_size=D, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=128, max_position_embeddings=32, **NO_DROPOUT["bert"],
                                   **SMALL, **kw)


def llama_config(**kw):
    kw = {"num_key_value_heads": 2, "tie_word_embeddings": False,
          "rope_parameters": {"rope_type": "default", "rope_theta": 500.0}, **kw}
    return transformers.LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=112, num_hidden_layers=2,
                                    num_attention_heads=4, max_position_embeddings=32, **NO_DROPOUT["llama"],
                                    **SMALL, **kw)


def bart_config(**kw):
    kw = {"scale_embedding": True, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
          "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, **kw}
    return transformers.BartConfig(vocab_size=V, d_model=D, encoder_layers=2, decoder_layers=2,
                                   max_position_embeddings=32, **NO_DROPOUT["bart"], **SMALL, **kw)


def t5_config(**kw):
    """The original T5 (ReLU, tied head scaled by d_model**-0.5) unless kw says otherwise; small bucket
    settings (8 buckets, max_distance 12) so the T = 12 inputs reach the log-spaced and the last buckets."""
    kw = {"feed_forward_proj": "relu", "relative_attention_num_buckets": 8, "relative_attention_max_distance": 12,
          "d_kv": D // 4, **kw}
    return transformers.T5Config(vocab_size=V, d_model=D, d_ff=96, num_layers=2, num_decoder_layers=2,
                                 num_heads=4, **NO_DROPOUT["t5"], **SMALL, **kw)


def randomize(model, seed=0):
    """Replace HF's init (zero biases, unit norms, std 0.02) with weights where every tensor matters,
    so a misplaced bias, norm or transposition changes the logits well beyond the tolerance."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied tensors appear once and stay tied
            noise = torch.randn(p.shape, generator=g)
            is_gain = p.ndim == 1 and name.endswith("weight")
            p.copy_(1 + 0.2 * noise if is_gain else 0.1 * noise)
    return model.eval()


def hf_gpt2(**kw):
    return randomize(transformers.GPT2LMHeadModel(gpt2_config(**kw)))


def hf_bert(**kw):
    return randomize(transformers.BertForMaskedLM(bert_config(**kw)))


def hf_llama(**kw):
    return randomize(transformers.LlamaForCausalLM(llama_config(**kw)))


def hf_bart(**kw):
    return randomize(transformers.BartForConditionalGeneration(bart_config(**kw)))


def hf_t5(**kw):
    return randomize(transformers.T5ForConditionalGeneration(t5_config(**kw)))


def hf_t5_v1_1(**kw):
    """T5 v1.1: gated GELU (tanh), no output scaling, a head of its own (recent transformers tie it
    to `shared` regardless, so it is untied here, as older transformers and the checkpoints have it)."""
    model = transformers.T5ForConditionalGeneration(t5_config(feed_forward_proj="gated-gelu",
                                                              tie_word_embeddings=False, **kw))
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    return randomize(model)


def use_backend(model, backend):
    for m in model.modules():
        if hasattr(m, "backend"):
            m.backend = backend
    return model


@pytest.fixture
def ids():
    return torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def padding():
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 8:] = 0  # the second sequence has 4 padding tokens at the end
    return mask


def max_diff(a, b):
    return (a - b).abs().max().item()


BACKENDS = ["sdpa", "math"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("activation", ["gelu_new", "gelu"])
def test_gpt2_logits_match(ids, backend, activation):
    hf = hf_gpt2(activation_function=activation)
    assert hf.config._attn_implementation == "eager"
    zoo_model = use_backend(convert(hf), backend)
    assert not zoo_model.training
    with torch.no_grad():
        torch.testing.assert_close(zoo_model(ids), hf(ids).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tie", [True, False])
def test_bert_logits_match_on_unpadded_positions(ids, padding, backend, tie):
    hf = hf_bert(tie_word_embeddings=tie)
    zoo_model = use_backend(convert(hf), backend)
    real = padding.bool()
    with torch.no_grad():
        expected = hf(ids, attention_mask=padding).logits  # token_type_ids default to 0
        got = zoo_model(ids, padding=real)
    torch.testing.assert_close(got[real], expected[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 4, 1])
def test_llama_logits_match(ids, backend, tie, kv_heads):
    hf = hf_llama(tie_word_embeddings=tie, num_key_value_heads=kv_heads)
    zoo_model = use_backend(convert(hf), backend)
    assert zoo_model.cfg.position.as_dict().items() >= {"name": "rope", "theta": 500.0, "fraction": 1.0}.items()
    assert zoo_model.cfg.attention.name == {1: "mqa", 2: "gqa", 4: "mha"}[kv_heads]
    assert (zoo_model.head.weight is zoo_model.embed.weight) == tie
    with torch.no_grad():
        torch.testing.assert_close(zoo_model(ids), hf(ids).logits, atol=ATOL, rtol=0)


def test_llama_cached_decoding_matches_hf_full_forward(ids):
    """RoPE offsets under the zoo KV cache: prefill, then one token at a time."""
    hf = hf_llama()
    zoo_model = convert(hf)
    cache = zoo_model.new_cache()
    with torch.no_grad():
        steps = [zoo_model(ids[:, :5], cache=cache)]
        steps += [zoo_model(ids[:, t:t + 1], cache=cache) for t in range(5, T)]
        torch.testing.assert_close(torch.cat(steps, dim=1), hf(ids).logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale", [True, False])
def test_bart_logits_match(ids, padding, backend, scale):
    hf = hf_bart(scale_embedding=scale)
    zoo_model = use_backend(convert(hf), backend)
    tgt = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=padding, decoder_input_ids=tgt).logits
        got = zoo_model(ids, tgt, src_padding=padding.bool())
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


T5_FLAVOURS = {"t5": hf_t5, "t5_v1_1": hf_t5_v1_1}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flavour", T5_FLAVOURS)
def test_t5_logits_match_with_source_padding(ids, padding, backend, flavour):
    hf = T5_FLAVOURS[flavour]()
    zoo_model = use_backend(convert(hf), backend)
    v1_1 = flavour == "t5_v1_1"
    assert zoo_model.cfg.ffn.as_dict().items() >= {"name": "geglu_tanh" if v1_1 else "relu", "d_ff": 96}.items()
    assert zoo_model.cfg.position.as_dict() == {"name": "t5", "num_buckets": 8, "max_distance": 12}
    assert (zoo_model.head.weight is zoo_model.embed.weight) == (not v1_1)
    tgt = torch.randint(0, V, (2, 14), generator=torch.Generator().manual_seed(2))  # past max_distance too
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=padding, decoder_input_ids=tgt).logits
        got = zoo_model(ids, tgt, src_padding=padding.bool())
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("flavour", T5_FLAVOURS)
def test_t5_cached_greedy_generation_matches_hf_generate(ids, padding, flavour):
    """Through the KV caches of both (the t5 bias at offset > 0): zoo.generate's tokens equal HF's greedy
    generate, and zoo's cached logits at every step equal the logits HF's generate saw."""
    from zoo.generate import generate

    hf = T5_FLAVOURS[flavour]()
    zoo_model = convert(hf)
    src_padding = padding.bool()
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=padding, max_new_tokens=16, do_sample=False, num_beams=1,
                          eos_token_id=None, decoder_start_token_id=0, output_logits=True,
                          return_dict_in_generate=True)
        start = torch.zeros(2, 1, dtype=torch.long)  # T5 starts decoding from the pad token, 0
        assert torch.equal(generate(zoo_model, start, 16, src=ids, src_padding=src_padding), out.sequences)
        memory, cache = zoo_model.encode(ids, src_padding), zoo_model.new_cache()
        steps = [zoo_model.decode(out.sequences[:, t:t + 1], memory, src_padding, cache) for t in range(16)]
    torch.testing.assert_close(torch.cat(steps, dim=1), torch.stack(out.logits, dim=1), atol=ATOL, rtol=0)


MAKERS = {"gpt2": hf_gpt2, "bert": hf_bert, "llama": hf_llama, "bart": hf_bart, **T5_FLAVOURS}


@pytest.mark.parametrize("kind", MAKERS)
def test_param_count_equals_analytic_count(kind):
    hf = MAKERS[kind]()
    zoo_model = convert(hf)
    n = sum(p.numel() for p in zoo_model.parameters())
    assert count_params(zoo_model.cfg)["total"] == n == count_params(config_from_hf(hf.config))["total"]
    # The zoo model holds exactly the HF weights, minus what it folds or drops (documented in zoo.convert).
    hf_n = sum(p.numel() for p in hf.parameters())
    dropped = {"gpt2": 0, "llama": 0,
               "bert": 2 * D,  # type_vocab_size=2 token-type rows, row 0 folded into the positions
               "bart": 2 * 2 * D,  # the 2 offset rows of each position table
               "t5": 0, "t5_v1_1": 0}
    assert hf_n - dropped[kind] == n


def _forward(kind, model, ids, hf):
    if kind in ("bart", "t5", "t5_v1_1"):
        tgt = ids[:, :7]
        return hf(input_ids=ids, decoder_input_ids=tgt).logits if model is None else model(ids, tgt)
    return hf(ids).logits if model is None else model(ids)


@pytest.mark.parametrize("kind", MAKERS)
def test_perturbed_hf_weights_break_parity(kind, ids):
    """The parity check can fail: perturb one HF tensor after conversion and the logits differ."""
    hf = MAKERS[kind]()
    zoo_model = convert(hf)
    with torch.no_grad():
        torch.testing.assert_close(_forward(kind, zoo_model, ids, hf), _forward(kind, None, ids, hf),
                                   atol=ATOL, rtol=0)
        names = [n for n, p in hf.named_parameters() if "layers.1" in n or ".1." in n]
        target = dict(hf.named_parameters())[names[len(names) // 2]]  # a deep tensor
        target.add_(0.05 * torch.randn_like(target))
        diff = max_diff(_forward(kind, zoo_model, ids, hf), _forward(kind, None, ids, hf))
    assert diff > 10 * ATOL, f"perturbing {names[len(names) // 2]} changed nothing ({diff})"


@pytest.mark.parametrize("make, match", [
    (lambda: config_from_hf(bart_config(decoder_attention_heads=2)), "encoder_attention_heads=4 != decoder"),
    (lambda: config_from_hf(bart_config(decoder_ffn_dim=64)), "encoder_ffn_dim=128 != decoder_ffn_dim=64"),
    (lambda: config_from_hf(bart_config(activation_function="tanh")), "unsupported activation"),
    (lambda: config_from_hf(gpt2_config(activation_function="silu")), "unsupported activation"),
    (lambda: config_from_hf(gpt2_config(scale_attn_by_inverse_layer_idx=True)), "scale_attn_by_inverse_layer_idx"),
    (lambda: config_from_hf(bert_config(hidden_act="relu")), "exact GELU"),
    (lambda: config_from_hf(bert_config(is_decoder=True)), "is_decoder"),
    (lambda: llama_config_from_hf(llama_config(
        rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0})), "RoPE scaling"),
    (lambda: llama_config_from_hf(llama_config(hidden_act="tanh")), "unsupported activation"),
    (lambda: llama_config_from_hf(llama_config(attention_bias=True)), "one bias switch"),
    (lambda: llama_config_from_hf(llama_config(head_dim=32)), "head_dim=32"),
    (lambda: config_from_hf(t5_config(d_kv=8)), r"d_kv \* num_heads = 8 \* 4 != d_model=64"),
    (lambda: config_from_hf(t5_config(feed_forward_proj="gated-tanh")), "unsupported activation"),
    (lambda: config_from_hf(transformers.MistralConfig()), "model_type='mistral'"),
])
def test_unsupported_configs_raise_a_clear_value_error(make, match):
    with pytest.raises(ValueError, match=match) as err:
        make()
    assert isinstance(err.value, ConversionError) and str(err.value).startswith("cannot convert")


def test_bart_nonzero_final_logits_bias_raises():
    hf = hf_bart()
    hf.final_logits_bias[0, 3] = 1.0
    with pytest.raises(ValueError, match="final_logits_bias is non-zero"):
        bart_from_hf(hf)


def test_bart_untied_embeddings_that_differ_raise():
    hf = hf_bart(tie_word_embeddings=False)  # three independent random tables
    with pytest.raises(ValueError, match="encoder and decoder token embeddings differ"):
        convert(hf)


def test_unsupported_class_raises():
    with pytest.raises(ValueError, match="cannot convert GPT2Model; supported classes"):
        convert(transformers.GPT2Model(gpt2_config()))


def test_copier_reports_unwritten_and_double_writes():
    hf = hf_gpt2()
    copier = _Copier(hf)
    zoo_model = copier.build(config_from_hf(hf.config))  # parameters on meta, nothing written yet
    with pytest.raises(RuntimeError, match="never written: .*decoder.blocks.0.attn.f.qkv.weight"):
        copier.finish()
    with torch.no_grad():
        copier.write(zoo_model.embed.weight, hf.transformer.wte.weight)
        with pytest.raises(RuntimeError, match="embed.weight written twice"):
            copier.write(zoo_model.embed.weight, hf.transformer.wte.weight)
        with pytest.raises(RuntimeError, match="shape"):
            copier.write(zoo_model.decoder.position.weight, hf.transformer.wte.weight)
    for p in zoo_model.parameters():  # all written now, but no HF weight was read
        copier.written.add(id(p))
    with pytest.raises(RuntimeError, match=r"HF parameter\(s\) never read: transformer.wte.weight, transformer.wpe"):
        copier.finish()


def test_import_does_not_need_transformers():
    code = ("import sys; sys.modules['transformers'] = None; import zoo.convert as c; "
            "assert 'transformers' not in [m for m in sys.modules if sys.modules[m] is not None]; "
            "print(c.convert.__name__)")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=root, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "convert"


def test_from_pretrained_local_path(tmp_path, ids):
    """from_pretrained on a saved checkpoint directory (no network): loads with transformers, converts."""
    from zoo.convert import from_pretrained

    hf = hf_llama()
    hf.save_pretrained(tmp_path)
    zoo_model = from_pretrained(str(tmp_path), local_files_only=True, attn_implementation="eager")
    with torch.no_grad():
        torch.testing.assert_close(zoo_model(ids), hf(ids).logits, atol=ATOL, rtol=0)


def test_float64_gpt2_converts_in_float64_with_exact_logits(ids):
    """Parameters are assigned in the source dtype: nothing passes through float32 on the way."""
    hf = hf_gpt2().double()
    with torch.no_grad():  # float64 noise: values that float32 cannot hold
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    zoo_model = convert(hf)
    assert {p.dtype for p in zoo_model.parameters()} == {torch.float64}
    for backend in BACKENDS:
        with torch.no_grad():
            torch.testing.assert_close(use_backend(zoo_model, backend)(ids), hf(ids).logits, atol=1e-12, rtol=0)


@pytest.mark.parametrize("kind", MAKERS)
def test_bf16_models_convert_to_bf16_parameters_never_staged_in_float32(kind, ids, monkeypatch):
    """The zoo model is built with parameters on the meta device (no random init, no float32 copy)
    and the bf16 tensors are assigned as they are."""
    import zoo.build

    hf = MAKERS[kind]().to(torch.bfloat16)
    registered = []
    register = torch.nn.Module.register_parameter

    def spy(module, name, param):
        if param is not None:
            registered.append((name, param.device.type, param.dtype))
        register(module, name, param)

    def no_init(*a, **kw):
        raise AssertionError("conversion ran the zoo's random initialisation")

    monkeypatch.setattr(torch.nn.Module, "register_parameter", spy)
    monkeypatch.setattr(zoo.build, "init_weights", no_init)
    zoo_model = convert(hf)
    assert registered and all(device == "meta" for _, device, _ in registered), registered[:3]
    assert {p.dtype for p in zoo_model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        got, want = _forward(kind, zoo_model, ids, hf), _forward(kind, None, ids, hf)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("kind", MAKERS)
def test_converted_parameters_share_no_storage_with_the_hf_model(kind):
    hf = MAKERS[kind]()
    zoo_model = convert(hf)
    hf_storage = {p.untyped_storage().data_ptr() for p in hf.parameters()}
    assert not [n for n, p in zoo_model.named_parameters() if p.untyped_storage().data_ptr() in hf_storage]
    if zoo_model.cfg.tie_embeddings:
        assert zoo_model.head.weight is zoo_model.embed.weight


# ------------------------------------------------------- from_pretrained: a safetensors directory, read directly

SAVES = {"single": {}, "sharded": {"max_shard_size": "20KB"}, "sharded_bf16": {"max_shard_size": "20KB"}}


def _no_hf_load(*a, **kw):
    raise AssertionError("transformers' from_pretrained was called")


def _state(model):
    return {k: v for k, v in model.state_dict(keep_vars=True).items()}


def assert_same_model(got, want):
    """Every parameter and buffer bitwise equal, dtype included; tied parameters tied alike."""
    g, w = _state(got), _state(want)
    assert g.keys() == w.keys()
    for k in g:
        assert g[k].dtype == w[k].dtype and torch.equal(g[k], w[k]), k
    assert got.cfg == want.cfg
    assert (got.head.weight is got.embed.weight) == (want.head.weight is want.embed.weight)


@pytest.mark.parametrize("save", SAVES)
@pytest.mark.parametrize("kind", MAKERS)
def test_from_pretrained_reads_safetensors_directly_with_the_result_of_transformers_path(kind, save, tmp_path, ids,
                                                                                        monkeypatch):
    """A saved checkpoint gives the same zoo model both ways: read tensor by tensor onto a meta skeleton, or loaded
    by transformers and converted. Nothing read from the file is kept beyond the zoo parameters it became, and
    those are the tensors read (not copies of them)."""
    import gc
    import weakref

    import zoo.build
    from zoo.convert import _Safetensors, from_pretrained

    hf = MAKERS[kind]()
    dtype = torch.bfloat16 if save.endswith("bf16") else torch.float32
    hf = hf.to(dtype)
    hf.save_pretrained(tmp_path, **SAVES[save])
    assert (tmp_path / "model.safetensors.index.json").is_file() == save.startswith("sharded")
    reference = convert(type(hf).from_pretrained(tmp_path).eval())  # today's path: transformers, then convert

    reads = []
    read = _Safetensors.read

    def spy(self, name, out=None):
        t = read(self, name, out)
        reads.append((name, t.data_ptr(), weakref.ref(t)))
        return t

    prepare = _Safetensors.prepare

    def prepare_spy(self, skeleton):  # the skeleton's buffers (BART's final_logits_bias) are its own to keep
        prepare(self, skeleton)
        reads.clear()

    def no_init(*a, **kw):
        raise AssertionError("conversion ran the zoo's random initialisation")

    kept = []
    assign = _Copier.assign

    def check_then_assign(self, *a):  # all values written: a read tensor alive now is one of them, or kept
        gc.collect()
        written = {v.untyped_storage().data_ptr() for v in self.values.values()}
        kept.append([name for name, _, r in reads if r() is not None and r().untyped_storage().data_ptr()
                     not in written])
        return assign(self, *a)

    monkeypatch.setattr(_Copier, "assign", check_then_assign)
    monkeypatch.setattr(_Safetensors, "read", spy)
    monkeypatch.setattr(_Safetensors, "prepare", prepare_spy)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(_no_hf_load))
    monkeypatch.setattr(zoo.build, "init_weights", no_init)
    zoo_model = from_pretrained(tmp_path)
    assert_same_model(zoo_model, reference)
    assert {p.dtype for p in zoo_model.parameters()} == {dtype}
    assert not zoo_model.training
    assert kept == [[]], f"tensors read from the file and kept after their values were written: {kept}"
    assert zoo_model.embed.weight.data_ptr() in {ptr for _, ptr, _ in reads}, "the embedding was copied"

    with torch.no_grad():
        got, want = _forward(kind, zoo_model, ids, hf), _forward(kind, None, ids, hf)
        assert torch.equal(got, _forward(kind, reference, ids, hf))
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    else:
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), atol=0.1, rtol=0.05)


def test_from_pretrained_reads_a_base_model_checkpoint_without_the_prefix(tmp_path, ids, monkeypatch):
    """A checkpoint of GPT2Model (keys without `transformer.`) into GPT2LMHeadModel, its head tied to wte."""
    from zoo.convert import from_pretrained

    hf = hf_gpt2()
    hf.transformer.save_pretrained(tmp_path)
    reference = convert(transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval())
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(_no_hf_load))
    zoo_model = from_pretrained(tmp_path)
    assert_same_model(zoo_model, reference)
    with torch.no_grad():
        torch.testing.assert_close(zoo_model(ids), hf(ids).logits, atol=ATOL, rtol=0)


def test_pickled_weights_are_refused_in_one_line_and_never_unpickled(tmp_path, monkeypatch):
    """A directory with pytorch_model.bin and no safetensors: unpickling can run code, so nothing loads it."""
    import pickle

    from zoo.convert import from_pretrained

    hf = hf_bart()
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    hf.config.save_pretrained(tmp_path)

    def unpickled(*a, **kw):
        raise AssertionError("a pickle was loaded")

    monkeypatch.setattr(torch, "load", unpickled)
    monkeypatch.setattr(pickle, "load", unpickled)
    monkeypatch.setattr(pickle, "Unpickler", unpickled)
    with pytest.raises(ConversionError, match=r": has pytorch_model.bin but no model.safetensors: zoo never loads "
                                              r"pickled weights .*save_pretrained\(dir, safe_serialization=True\)$"):
        from_pretrained(tmp_path)
    with pytest.raises(ConversionError, match="has pytorch_model.bin"):  # through transformers too
        from_pretrained(tmp_path, dtype=torch.float32)


def test_a_hub_model_is_asked_for_safetensors_only(monkeypatch):
    """transformers' loader would fall back to a hub repository's pytorch_model.bin (a pickle) without it."""
    from zoo.convert import from_pretrained

    hf, calls = hf_gpt2(), []

    def loaded(cls, name, **kw):
        calls.append((name, kw))
        return hf

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda name, **kw: hf.config)
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(loaded))
    from_pretrained("some-org/some-model")
    assert calls == [("some-org/some-model", {"use_safetensors": True})]


def test_from_pretrained_with_other_arguments_uses_transformers(tmp_path):
    from zoo.convert import from_pretrained

    hf_bart().to(torch.bfloat16).save_pretrained(tmp_path / "st")
    as_float = from_pretrained(tmp_path / "st", dtype=torch.float32)  # transformers casts: float32 out
    assert {p.dtype for p in as_float.parameters()} == {torch.float32}


def test_a_tensor_missing_from_the_file_is_named_in_a_one_line_error(tmp_path):
    from safetensors.torch import load_file, save_file

    from zoo.convert import from_pretrained

    hf_llama().save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConversionError, match=r"tensor 'model.layers.1.mlp.up_proj.weight' is not in") as err:
        from_pretrained(tmp_path)
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_safetensors_reader_equals_the_safetensors_library(tmp_path):
    """zoo's reader (the library's pread backend, zoo's dtype table, whole reads and reads into rows of a larger
    tensor) against the library's load_file on every dtype and odd shapes."""
    from safetensors.torch import load_file, save_file

    from zoo.convert import _Safetensors

    g = torch.Generator().manual_seed(0)
    tensors = {f"{dt}".removeprefix("torch."): (torch.randn(3, 5, generator=g) * 100).to(dt)
               for dt in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                          torch.int16, torch.int8, torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2)}
    tensors.update(scalar=torch.tensor(2.5), empty=torch.zeros(0, 4), flags=torch.rand(7, generator=g) > 0.5,
                   wide=torch.randn(2, 3, 4, 5, generator=g))
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    files, want = _Safetensors(tmp_path), load_file(tmp_path / "model.safetensors")
    assert set(files.entries) == set(want)
    for name, t in want.items():
        got = files.read(name)
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got.view(-1).view(torch.uint8),
                                                                              t.view(-1).view(torch.uint8)), name
        if t.ndim and t.numel():  # into the middle rows of a larger tensor, as take_rows reads a fused projection
            rows = torch.zeros((t.shape[0] + 2, *t.shape[1:]), dtype=t.dtype)
            files.read(name, out=rows[1:-1])
            assert torch.equal(rows[1:-1].view(-1).view(torch.uint8), t.view(-1).view(torch.uint8)), name
            assert not rows[0].view(torch.uint8).any() and not rows[-1].view(torch.uint8).any(), name
    files.close()
