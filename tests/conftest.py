import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


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
