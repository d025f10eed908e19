"""init_from=hf:<dir>: a run starts from a Hugging Face GPT-2 / BERT / Llama / BART / T5 checkpoint saved locally.

Every checkpoint here is a tiny model with random weights and a small BPE tokenizer trained on the spot, both
written with save_pretrained: nothing is downloaded. The references are the Hugging Face models themselves."""

import csv
import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from tests.helpers import CONF, compose_cfg, interrupt_at_batch, save_pretrained_tokenizer
from zoo.build import ConfigError, build_model
from zoo.data import N_SPECIAL, load_default_corpus

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

D = 32
# Each family's own special tokens, named as its tokenizer names them (T5's sentinels included).
SPECIALS = {
    "gpt2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    "bert": {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
             "mask_token": "[MASK]"},
    "llama": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    "bart": {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
             "mask_token": "<mask>"},
    "t5": {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
           "additional_special_tokens": [f"<extra_id_{i}>" for i in range(16)]},
}


def save_tokenizer(family: str, directory):
    """A byte-level BPE with the family's special tokens (ids 0.., as in the real ones), saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    named = SPECIALS[family]
    tokens = [t for k, t in named.items() if k != "additional_special_tokens"] + named.get(
        "additional_special_tokens", [])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=list(dict.fromkeys(tokens)), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([load_default_corpus()[:30_000]], trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **named)
    fast.save_pretrained(str(directory))
    return fast


def hf_model(family: str, tok):
    """A tiny model of the family, sized to the tokenizer; weights randomised so that every tensor matters."""
    v, ids = len(tok), {k: tok.convert_tokens_to_ids(t) for k, t in SPECIALS[family].items() if isinstance(t, str)}
    if family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=v, n_positions=64, n_embd=D, n_layer=2, n_head=2,
                                      bos_token_id=ids["bos_token"], eos_token_id=ids["eos_token"])
        model = transformers.GPT2LMHeadModel(cfg)
    elif family == "bert":
        cfg = transformers.BertConfig(vocab_size=v, hidden_size=D, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=64, pad_token_id=ids["pad_token"])
        model = transformers.BertForMaskedLM(cfg)
    elif family == "llama":
        cfg = transformers.LlamaConfig(vocab_size=v, hidden_size=D, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       tie_word_embeddings=False, bos_token_id=ids["bos_token"],
                                       eos_token_id=ids["eos_token"])
        model = transformers.LlamaForCausalLM(cfg)
    elif family == "bart":
        cfg = transformers.BartConfig(vocab_size=v, d_model=D, encoder_layers=2, decoder_layers=2,
                                      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                      decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=ids["pad_token"],
                                      bos_token_id=ids["bos_token"], eos_token_id=ids["eos_token"],
                                      decoder_start_token_id=ids["eos_token"], forced_eos_token_id=None)
        model = transformers.BartForConditionalGeneration(cfg)
    else:
        cfg = transformers.T5Config(vocab_size=v, d_model=D, d_kv=8, num_heads=4, d_ff=64, num_layers=2,
                                    relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                    pad_token_id=ids["pad_token"], eos_token_id=ids["eos_token"],
                                    decoder_start_token_id=ids["pad_token"])
        model = transformers.T5ForConditionalGeneration(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied tensors appear once and stay tied
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if p.ndim == 1 and name.endswith("weight") else 0.1 * noise)
    return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """family -> a directory holding a tiny model and its tokenizer, as save_pretrained writes them; "text": a
    small text file to train on."""
    root = tmp_path_factory.mktemp("pretrained")
    out = {}
    for family in SPECIALS:
        directory = root / family
        hf_model(family, save_tokenizer(family, directory)).save_pretrained(str(directory))
        out[family] = str(directory)
    text = root / "text.txt"
    text.write_text(load_default_corpus()[100_000:130_000])
    out["text"] = str(text)
    return out


def data(checkpoints) -> list[str]:
    return ["data=text_file", f"data.path={checkpoints['text']}", "data.context=32", "data.batch_size=4",
            "data.eval_batches=2", "trainer.max_steps=4", "trainer.val_check_interval=2",
            "trainer.log_every_n_steps=1", "sample.max_new_tokens=8", "logger=csv", "threads=1"]


@pytest.fixture
def hydra_run(tmp_path):
    """Run like `python train.py <overrides>`: HydraConfig set, so the run sees which overrides were explicit."""
    from zoo.training import run

    def _run(overrides: list[str], name: str = "run"):
        with initialize_config_dir(config_dir=CONF, version_base="1.3"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        return run(cfg, run_dir=tmp_path / name), tmp_path / name

    yield _run
    HydraConfig.instance().cfg = None


def prepared(overrides: list[str]) -> dict:
    """The run config as the run sizes it (checkpoint architecture, its tokenizer's vocabulary), data built."""
    from zoo.training.sizing import prepare_run

    plain = OmegaConf.to_container(compose_cfg(overrides), resolve=True)
    prepare_run(plain)
    return plain


def pretrained_model(checkpoints, family: str):
    from zoo.training.pretrained import load_weights

    plain = prepared([f"init_from=hf:{checkpoints[family]}", *data(checkpoints)])
    model = build_model(plain["model"])
    load_weights(model, checkpoints[family])
    return model.eval()


@pytest.mark.parametrize("family", list(SPECIALS))
def test_logits_on_the_pretrained_ids_equal_hugging_faces(checkpoints, family):
    model = pretrained_model(checkpoints, family)
    tok = transformers.AutoTokenizer.from_pretrained(checkpoints[family])
    hf = transformers.AutoModelForMaskedLM if family == "bert" else (
        transformers.AutoModelForSeq2SeqLM if family in ("bart", "t5") else transformers.AutoModelForCausalLM)
    hf = hf.from_pretrained(checkpoints[family]).eval()
    ids = torch.tensor([tok("To be, or not to be, that is the question", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        if family in ("bart", "t5"):
            src, tgt = ids, ids[:, :7]
            ours, theirs = model(src + N_SPECIAL, tgt + N_SPECIAL), hf(input_ids=src, decoder_input_ids=tgt).logits
        else:
            ours, theirs = model(ids + N_SPECIAL), hf(input_ids=ids).logits
    assert model.cfg.vocab_size == N_SPECIAL + len(tok)
    torch.testing.assert_close(ours[..., N_SPECIAL:], theirs, atol=1e-4, rtol=0)


def test_special_rows_come_from_the_tokens_of_the_same_role_else_the_mean(checkpoints):
    from zoo.training.pretrained import special_rows

    tok = transformers.AutoTokenizer.from_pretrained(checkpoints["t5"])
    rows = special_rows(checkpoints["t5"])
    assert {z: t for z, (_, t) in rows.items()} == {  # T5's decoder starts from <pad>
        0: "<pad>", 1: "<pad>", 2: "</s>", **{4 + i: f"<extra_id_{i}>" for i in range(16)}}
    model = pretrained_model(checkpoints, "t5")
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(checkpoints["t5"])
    rows_of = hf.shared.weight.detach()
    embed = model.embed.weight.detach()
    assert torch.equal(embed[4 + 3], rows_of[tok.convert_tokens_to_ids("<extra_id_3>")])
    torch.testing.assert_close(embed[3], rows_of.mean(0))  # T5 has no mask token: <mask> is the mean row
    assert {z: t for z, (_, t) in special_rows(checkpoints["bert"]).items()} == {
        0: "[PAD]", 1: "[CLS]", 2: "[SEP]", 3: "[MASK]"}


@pytest.mark.parametrize("extra", [5, -10])
def test_the_vocabulary_covers_the_tokenizer_and_the_checkpoints_rows(checkpoints, tmp_path, extra):
    """A checkpoint with rows past its tokenizer's ids (padded) keeps them; a tokenizer with ids past the rows gets
    mean rows for them."""
    tok = transformers.AutoTokenizer.from_pretrained(checkpoints["gpt2"])
    rows = len(tok) + extra
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=rows, n_positions=64, n_embd=D, n_layer=1,
                                                              n_head=2)).eval()
    hf.save_pretrained(str(tmp_path / "gpt2"))
    tok.save_pretrained(str(tmp_path / "gpt2"))
    model = pretrained_model({**checkpoints, "padded": str(tmp_path / "gpt2")}, "padded")
    assert model.cfg.vocab_size == N_SPECIAL + max(rows, len(tok))
    embed, theirs = model.embed.weight.detach(), hf.transformer.wte.weight.detach()
    assert torch.equal(embed[N_SPECIAL:N_SPECIAL + rows], theirs)
    if extra < 0:  # the tokenizer's last ids have no pretrained row: the mean
        torch.testing.assert_close(embed[-1], theirs.mean(0))
    ids = torch.tensor([[5, 17, 42, rows - 1]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids + N_SPECIAL)[..., N_SPECIAL:N_SPECIAL + rows], hf(input_ids=ids).logits,
                                   atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", list(SPECIALS))
def test_a_few_training_steps_from_each_checkpoint(train, checkpoints, family, capsys):
    code, run_dir = train([f"init_from=hf:{checkpoints[family]}", *data(checkpoints)], tiny=False)
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["status"] == "completed" and torch.isfinite(torch.tensor(s["final"]["val_loss"]))
    assert s["data"]["tokenizer"] == f"hf:{checkpoints[family]}"  # the checkpoint's own tokenizer, set for us
    assert f"init_from hf:{checkpoints[family]}: loaded " in capsys.readouterr().out


@pytest.fixture(scope="module")
def trained_gpt2(checkpoints, tmp_path_factory):
    """The tiny GPT-2 trained a little on the text, so its loss is far below a random model's."""
    directory = tmp_path_factory.mktemp("trained") / "gpt2"
    tok = transformers.AutoTokenizer.from_pretrained(checkpoints["gpt2"])
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoints["gpt2"]).train()
    ids = torch.tensor(tok(load_default_corpus()[:40_000])["input_ids"])
    g, opt = torch.Generator().manual_seed(0), torch.optim.AdamW(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only wait on each other
    for _ in range(30):
        starts = torch.randint(0, len(ids) - 33, (8,), generator=g)
        x = torch.stack([ids[s:s + 33] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(threads)
    model.save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return str(directory)


def test_first_validation_loss_is_the_pretrained_models(train, checkpoints, trained_gpt2):
    from zoo.eval import evaluate

    over = [*data(checkpoints), "trainer.max_steps=1", "trainer.val_check_interval=1", "optim.lr=1e-9",
            "optim.min_lr=0", "sample.max_new_tokens=0"]
    code, run_dir = train([f"init_from=hf:{trained_gpt2}", *over], tiny=False, name="pretrained")
    loss = json.loads((run_dir / "summary.json").read_text())["final"]["val_loss"]
    window = [o for o in over if o.startswith(("data.", "data="))]
    hf_loss = evaluate(f"hf:{trained_gpt2}", window, progress=False)["loss"]  # its own ids, on the same windows
    fresh = prepared([f"init_from=hf:{trained_gpt2}", *over])["model"]  # the same architecture, zoo's init
    code, fresh_dir = train([*over, f"data.tokenizer=hf:{trained_gpt2}", *(f"model.{k}={v}" for k, v in {
        "d_model": fresh["d_model"], "n_layers": fresh["n_layers"], "n_heads": fresh["n_heads"]}.items())],
        tiny=False, name="fresh")
    fresh_loss = json.loads((fresh_dir / "summary.json").read_text())["final"]["val_loss"]
    assert loss == pytest.approx(hf_loss, abs=0.05)  # the 20 added rows move it only a little
    assert loss < fresh_loss - 1.0


def test_norm_swap_loads_all_but_the_norm_biases_and_says_so(hydra_run, checkpoints, capsys):
    code, run_dir = hydra_run([f"init_from=hf:{checkpoints['gpt2']}", "norm=pre_rms", *data(checkpoints)])
    out = capsys.readouterr().out
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["model"]["norm"]["type"] == "rmsnorm" and s["model"]["norm"]["eps"] == 1e-5  # GPT-2's
    assert s["model"]["d_model"] == D and s["model"]["ffn"]["name"] == "gelu_tanh"  # the rest is the checkpoint's
    line = next(x for x in out.splitlines() if x.startswith("init_from"))
    assert "loaded 23 of 23 tensors; fresh (zoo init): none; unused pretrained: decoder.blocks.*.attn.norm.bias (x2)" \
           ", decoder.blocks.*.ffn.norm.bias (x2), decoder.final_norm.bias;" in line


def test_a_swapped_component_keeps_zoos_init_and_the_explicit_options_apply(hydra_run, checkpoints, capsys):
    code, run_dir = hydra_run([f"init_from=hf:{checkpoints['llama']}", "ffn=geglu", "model.dropout=0.1",
                               "model.attention.window=8", *data(checkpoints)])
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["model"]["ffn"].items() >= {"name": "geglu", "d_ff": 64}.items()  # Llama's size kept
    assert s["model"]["dropout"] == 0.1 and s["model"]["attention"] == {**s["model"]["attention"], "name": "gqa",
                                                                        "n_kv_heads": 2, "window": 8}
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("init_from"))
    assert "fresh (zoo init): none" in line  # geglu's gate, up and down have swiglu's names and shapes


def errors() -> list:
    return [pytest.param(*case, id=name) for name, case in zip(
        ("no-prefix", "missing-dir", "lineage", "tokenizer", "task-data", "context", "budget", "model-type"), [
        (["init_from=gpt2"], r"^init_from: got 'gpt2'; valid: hf:<Hugging Face model id or save_pretrained "),
        (["init_from=hf:/no/such/dir"], r"^init_from: 'hf:/no/such/dir': no such directory"),
        (["init_from=hf:{gpt2}", "model=encoder_only"],
         r"^model: 'encoder_only' but init_from=hf:.* is a decoder_only checkpoint; valid with init_from: "
         r"decoder_only \(or leave model out\)$"),
        (["init_from=hf:{gpt2}", "data.tokenizer=char"],
         r"^data.tokenizer: 'char' but init_from=hf:.* reads the ids of its own tokenizer; valid with init_from: hf:"),
        (["init_from=hf:{gpt2}", "data=copy"], r"^data.kind: 'task' has a tokenizer of its own; init_from=hf:"),
        (["init_from=hf:{gpt2}", "data.context=65"],
         r"^data.context: 65 is past the learned positions of init_from=hf:.* \(max_seq_len=64\); valid: 1..64$"),
        (["init_from=hf:{gpt2}", "budget=params"], r"^budget: resizes d_ff, which init_from=hf:.* fixes"),
        (["init_from=hf:{neo}"], r"^init_from: 'hf:.*': cannot convert model_type='gpt_neo'; supported: gpt2, bert"),
    ], strict=True)]


@pytest.mark.parametrize("overrides, message", errors())
def test_bad_init_from_is_one_line_before_any_data(hydra_run, checkpoints, tmp_path, overrides, message, monkeypatch):
    neo = tmp_path / "neo"
    transformers.GPTNeoConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2,
                              attention_types=[[["global"], 1]]).save_pretrained(str(neo))
    from zoo.training import sizing

    monkeypatch.setattr(sizing, "build_data", lambda *a: pytest.fail("data built before the error"))
    over = [o.format(gpt2=checkpoints["gpt2"], neo=neo) for o in overrides]
    with pytest.raises(ConfigError, match=message):
        hydra_run(over if "data=copy" in over else [*data(checkpoints), *over])


def test_no_transformers_is_one_line(train, checkpoints, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    with pytest.raises(ConfigError, match=r'^init_from needs the \'transformers\' package: pip install -e ".*\[hf\]"$'):
        train([f"init_from=hf:{checkpoints['gpt2']}", *data(checkpoints)], tiny=False)


def test_a_corpus_prepared_with_another_tokenizer_is_refused(train, checkpoints, tmp_path):
    from zoo.prepare import prepare

    over = [*data(checkpoints)[1:], "data=tokens", "data.context=16"]
    for name, spec in (("char", "char"), ("other", f"hf:{save_pretrained_tokenizer(tmp_path / 'tok')}"),
                       ("same", f"hf:{checkpoints['gpt2']}")):
        prepare([checkpoints["text"]], tmp_path / name, spec, sample_by="paragraph", val_fraction=0.1, workers=1,
                progress=False)
    for name in ("char", "other"):
        with pytest.raises(ConfigError, match=fr"^data.path: '.*{name}' was prepared with another tokenizer than "
                                              fr"init_from's; prepare it with --tokenizer hf:.*gpt2$"):
            train([f"init_from=hf:{checkpoints['gpt2']}", *over, f"data.path={tmp_path / name}"], tiny=False,
                  name=name)
    code, _ = train([f"init_from=hf:{checkpoints['gpt2']}", *over, f"data.path={tmp_path / 'same'}"], tiny=False,
                    name="same")
    assert code == 0


def test_interrupted_init_from_run_resumes_exactly_without_converting_again(train, checkpoints, monkeypatch):
    over = [f"init_from=hf:{checkpoints['gpt2']}", *data(checkpoints), "trainer.max_steps=6",
            "trainer.deterministic=true", "sample.max_new_tokens=0"]
    code, full = train(over, tiny=False, name="full")
    assert code == 0
    from zoo.training import data as data_module
    from zoo.training import pretrained

    interrupt_at_batch(monkeypatch, data_module.TextData)
    code, part = train(over, tiny=False, name="part")
    assert code == 130
    monkeypatch.undo()
    monkeypatch.setattr(pretrained, "load_weights", lambda *a: pytest.fail("converted again on resume"))
    code, part = train([*over, "ckpt_path=last"], tiny=False, name="part")
    assert code == 0

    def val_by_step(run_dir):
        with (run_dir / "metrics.csv").open() as f:
            return {int(r["step"]): float(r["val_loss"]) for r in csv.DictReader(f) if r.get("val_loss")}

    a, b = val_by_step(full), val_by_step(part)
    assert sorted(a) == sorted(b) and [b[k] for k in sorted(a)] == pytest.approx([a[k] for k in sorted(a)], abs=1e-6)
    saved = OmegaConf.load(part / "config.yaml")
    assert saved.init_from == f"hf:{checkpoints['gpt2']}" and saved.model.d_model == D  # the resolved architecture
