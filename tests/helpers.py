"""Helpers the tests import (fixtures stay in the conftest.py files, which pytest loads by itself)."""

from pathlib import Path

from hydra import compose, initialize_config_dir

CONF = str(Path(__file__).resolve().parents[1] / "conf")

# Tiny and quick: a few steps of a one-layer model, evaluated twice.
TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "trainer.max_steps=4",
        "trainer.val_check_interval=2", "trainer.log_every_n_steps=1", "data.eval_batches=2", "data.batch_size=4",
        "data.context=16"]
TINY_TASK = [o for o in TINY if not o.startswith(("data.eval_batches", "data.context"))] + [
    "data.n_train=200", "data.n_val=16", "data.n_test=16", "data.eval_examples=16"]


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=overrides)


def tiny_cfg(name: str = "decoder_only", **over) -> dict:
    """A model config small enough that a forward and backward take milliseconds."""
    cfg = dict(name=name, vocab_size=37, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


def run(model, tokens, **kw):
    """Forward any lineage on `tokens` (the encoder_decoder gets them as source and target)."""
    if model.cfg["name"] == "encoder_decoder":
        return model(tokens, tokens, **kw)
    return model(tokens, **kw)


def make(registry, name: str, d_model: int = 32, n_heads: int = 4, max_seq_len: int = 64, bias: bool = True,
         **options):
    """One component alone, built as the stack builds it: registry.get(name)(ctx, opts)."""
    from zoo.component import Context, build

    return build(registry, {"name": name, **options},
                 Context(d_model=d_model, n_heads=n_heads, max_seq_len=max_seq_len, bias=bias))


def save_pretrained_tokenizer(directory: Path, vocab_size: int = 400) -> Path:
    """A small byte-level BPE saved with save_pretrained, the way a downloaded GPT-2 tokenizer sits on disk
    (its own end-of-text token, <|endoftext|>, first); trained here, nothing downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from zoo.data import load_default_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([load_default_corpus()[:50_000]], trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(str(directory))
    return directory


def write_corpus(directory: Path, n_files: int = 4, paragraphs: int = 60) -> list[Path]:
    """Text files of Shakespeare paragraphs (blank-line separated), a few hundred documents in all."""
    from zoo.data import load_default_corpus

    paras = [p for p in load_default_corpus().split("\n\n") if p.strip()][200:200 + n_files * paragraphs]
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(n_files):
        path = directory / f"part{i}.txt"
        path.write_text("\n\n".join(paras[i * paragraphs:(i + 1) * paragraphs]) + "\n")
        files.append(path)
    return files
