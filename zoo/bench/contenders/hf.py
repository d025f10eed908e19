"""Hugging Face transformers: `GPT2LMHeadModel` and `LlamaForCausalLM` built from configs, random weights."""

from __future__ import annotations

import torch

from zoo.bench.contenders.base import lm_loss, require
from zoo.bench.settings import Settings, Shape
from zoo.layers.ffn import default_d_ff


def build_hf(shape: Shape, family: str, s: Settings):
    tf = require("transformers")
    common = dict(vocab_size=shape.vocab, use_cache=False, attn_implementation="sdpa", bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = tf.GPT2Config(n_positions=shape.context, n_embd=shape.d_model, n_layer=shape.n_layers,
                            n_head=shape.n_heads, activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=True, **common)
        model = tf.GPT2LMHeadModel(cfg)
    else:
        d_ff = default_d_ff(shape.d_model, gated=True)
        cfg = tf.LlamaConfig(hidden_size=shape.d_model, intermediate_size=d_ff, num_hidden_layers=shape.n_layers,
                             num_attention_heads=shape.n_heads, num_key_value_heads=shape.n_kv_heads,
                             max_position_embeddings=shape.context, rms_norm_eps=1e-5, attention_bias=False,
                             mlp_bias=False, attention_dropout=0.0, tie_word_embeddings=False, **common)
        model = tf.LlamaForCausalLM(cfg)
    return model, lambda m, x, y: lm_loss(m(input_ids=x).logits, y)
