"""The ttt section's yardstick (zoo.bench.yardstick) and its reader of nanoGPT's checkpoints
(zoo.bench.contenders.nanogpt): the reader against GPT-2's forward written out here in float64 (and against
nanoGPT's own model class when a checkout is named by ZOO_NANOGPT), the evaluator against the same forward on
windows cut here, and their one-line refusals."""

import math
import os
import pickle
from pathlib import Path

import pytest
import torch

import zoo
from zoo.bench.contenders.nanogpt import NanoGPTCheckpointError, read_nanogpt_checkpoint, zoo_from_nanogpt
from zoo.bench.yardstick import Yardstick, YardstickError, score, zoo_checkpoint
from zoo.data.tokenizers import CharTokenizer


def nanogpt_state(args: dict, seed: int = 0, std: float = 0.3) -> dict[str, torch.Tensor]:
    """A random state_dict with the keys and shapes of nanoGPT's GPT (model.py, facts: Linear weights (out, in),
    c_attn's rows [q; k; v], lm_head tied to wte), float64."""
    g = torch.Generator().manual_seed(seed)
    V, C, T = args["vocab_size"], args["n_embd"], args["block_size"]

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    sd = {"transformer.wte.weight": r(V, C), "transformer.wpe.weight": r(T, C)}
    for i in range(args["n_layer"]):
        p = f"transformer.h.{i}."
        for name, shape in (("ln_1", (C,)), ("attn.c_attn", (3 * C, C)), ("attn.c_proj", (C, C)), ("ln_2", (C,)),
                            ("mlp.c_fc", (4 * C, C)), ("mlp.c_proj", (C, 4 * C))):
            sd[p + name + ".weight"] = 1 + r(*shape) if name.startswith("ln") else r(*shape)
            if args["bias"]:
                sd[p + name + ".bias"] = r(shape[0])
    sd["transformer.ln_f.weight"] = 1 + r(C)
    if args["bias"]:
        sd["transformer.ln_f.bias"] = r(C)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def gpt2_logits(sd: dict, args: dict, idx: torch.Tensor) -> torch.Tensor:
    """GPT-2's forward written out (float64): learned positions, pre-LayerNorm (eps 1e-5), causal attention
    scaled by 1/sqrt(head size), exact GELU MLP, final LayerNorm, tied head."""
    C, H = args["n_embd"], args["n_head"]
    hd = C // H
    B, T = idx.shape

    def get(name, kind="weight"):
        return sd.get(f"{name}.{kind}", torch.zeros(1, dtype=torch.float64))

    def ln(x, name):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5) * get(name) + get(name, "bias")

    def lin(x, name):
        return x @ get(name).T + get(name, "bias")

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(args["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = lin(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=-1)
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + lin((att @ v).transpose(1, 2).reshape(B, T, C), p + "attn.c_proj")
        h = lin(ln(x, p + "ln_2"), p + "mlp.c_fc")
        x = x + lin(0.5 * h * (1 + torch.erf(h / math.sqrt(2))), p + "mlp.c_proj")
    return ln(x, "transformer.ln_f") @ sd["lm_head.weight"].T


ARGS = dict(n_layer=2, n_head=3, n_embd=24, block_size=16, vocab_size=11, dropout=0.0)  # 3 heads, odd vocab


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("compiled", [False, True])
def test_reader_matches_gpt2_forward_in_float64(bias, compiled):
    args = {**ARGS, "bias": bias}
    sd = nanogpt_state(args)
    stored = {("_orig_mod." if compiled else "") + k: v for k, v in sd.items()}  # train.py compiled: the prefix
    model = zoo_from_nanogpt(stored, args).double()
    idx = torch.randint(0, args["vocab_size"], (2, 13), generator=torch.Generator().manual_seed(1))  # 13 < 16
    with torch.no_grad():
        got = model(idx)
    torch.testing.assert_close(got, gpt2_logits(sd, args, idx), rtol=0, atol=1e-10)
    assert not model.training


@pytest.mark.skipif(not os.environ.get("ZOO_NANOGPT"), reason="ZOO_NANOGPT: a karpathy/nanoGPT checkout")
@pytest.mark.parametrize("bias", [True, False])
def test_reader_matches_nanogpts_own_model(bias):
    from zoo.bench.contenders.nanogpt import load_nanogpt

    ng = load_nanogpt(Path(os.environ["ZOO_NANOGPT"]))
    args = {**ARGS, "bias": bias}
    torch.manual_seed(0)
    theirs = ng.GPT(ng.GPTConfig(**args)).double().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.2)  # its init zeroes the biases: move every weight off its start
    idx = torch.randint(0, args["vocab_size"], (3, 16))
    with torch.no_grad():
        want, _ = theirs(idx, idx)  # with targets it returns every position's logits
        got = zoo_from_nanogpt(theirs.state_dict(), args).double()(idx)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_reader_refuses_in_one_line():
    args = {**ARGS, "bias": False}
    sd = nanogpt_state(args)
    missing = {k: v for k, v in sd.items() if k != "transformer.h.1.mlp.c_fc.weight"}
    with pytest.raises(NanoGPTCheckpointError, match=r"missing keys: transformer\.h\.1\.mlp\.c_fc\.weight"):
        zoo_from_nanogpt(missing, args)
    with pytest.raises(NanoGPTCheckpointError, match=r"unknown keys: transformer\.h\.0\.ln_1\.bias"):
        zoo_from_nanogpt({**sd, "transformer.h.0.ln_1.bias": torch.zeros(24)}, args)  # bias=False has none
    with pytest.raises(NanoGPTCheckpointError, match="size mismatch"):
        zoo_from_nanogpt(sd, {**args, "block_size": 32})
    with pytest.raises(NanoGPTCheckpointError, match="model_args lacks bias"):
        zoo_from_nanogpt(sd, ARGS)
    with pytest.raises(NanoGPTCheckpointError, match="lm_head.weight differs"):
        zoo_from_nanogpt({**sd, "lm_head.weight": sd["lm_head.weight"] + 1}, args)


def _text(tmp_path: Path) -> Path:
    lines = ["to be or not to be, that is the question", "whether tis nobler in the mind to suffer",
             "the slings and arrows of outrageous fortune"]
    path = tmp_path / "input.txt"
    path.write_text("\n".join(lines[i % 3] for i in range(40)) + "\nzz: only in validation\n")
    return path


def windows_by_hand(text: str, context: int) -> tuple[str, int]:
    """The yardstick's text cut here: the last 10% of the characters, those the first 90% has."""
    n = int(len(text) * 0.9)
    seen = set(text[:n])
    val = "".join(c for c in text[n:] if c in seen)
    return val, (len(val) - 1) // context


def test_yardstick_scores_the_reader_as_written_out(tmp_path):
    """A nanoGPT checkpoint on disk (ckpt.pt and the meta.pkl of its prepare.py) through the reader and the
    evaluator, against the forward written out here on the windows cut here; the same file scored twice gives
    the same number."""
    path = _text(tmp_path)
    text = path.read_text()
    chars = sorted(set(text))  # nanoGPT's prepare.py: every character of the file, sorted
    stoi = {c: i for i, c in enumerate(chars)}
    args = {**ARGS, "bias": True, "vocab_size": len(chars), "block_size": 16}
    sd = nanogpt_state(args, std=0.5)
    stored = {"model": {k: v.float() for k, v in sd.items()}, "model_args": args, "iter_num": 5}
    torch.save(stored, tmp_path / "ckpt.pt")
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": len(chars), "stoi": stoi,
                                                       "itos": dict(enumerate(chars))}))
    ys = Yardstick.of_file(path, context=16)
    val, n = windows_by_hand(text, 16)
    assert ys.text == val and ys.windows == n and ys.dropped == 5  # z, z, :, y, v of the last line: never in training
    got = [score(*read_nanogpt_checkpoint(tmp_path / "ckpt.pt", tmp_path / "meta.pkl"), ys) for _ in range(2)]
    assert torch.equal(got[0].window_losses, got[1].window_losses)
    ids = torch.tensor([stoi[c] for c in val[:n * 16 + 1]])
    f32 = {k: v.float().double() for k, v in sd.items()}  # the checkpoint holds float32
    logits = gpt2_logits(f32, args, ids[:-1].view(n, 16))
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[1:], reduction="none").view(n, 16).mean(1)
    torch.testing.assert_close(got[0].window_losses, want, rtol=0, atol=1e-5)  # the model runs in float32
    assert got[0].se == pytest.approx(want.std().item() / math.sqrt(n), abs=1e-6)
    assert got[0].minus(got[1]) == (0.0, 0.0)


def test_yardstick_scores_a_zoo_checkpoint(tmp_path):
    """A zoo checkpoint whose model predicts the uniform distribution (every weight zero): log(vocabulary)."""
    path = _text(tmp_path)
    train = path.read_text()[:int(len(path.read_text()) * 0.9)]
    tok = CharTokenizer().fit(train)
    cfg = dict(name="decoder_only", vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, max_seq_len=16,
               dropout=0.0)
    model = zoo.build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    torch.save({"hyper_parameters": {"cfg": {"model": cfg}}, "global_step": 7, "tokenizer": tok.state_dict(),
                "state_dict": {"model." + k: v for k, v in model.state_dict().items()}}, tmp_path / "last.ckpt")
    ys = Yardstick.of_file(path, context=16)
    loaded, stoi, step = zoo_checkpoint(tmp_path / "last.ckpt", ys)
    s = score(loaded, stoi, ys)
    assert step == 7 and s.loss == pytest.approx(math.log(tok.vocab_size), abs=1e-12) and s.se < 1e-12


def test_yardstick_refuses_what_it_cannot_score(tmp_path):
    path = _text(tmp_path)
    ys = Yardstick.of_file(path, context=16)
    with pytest.raises(YardstickError, match="has no id for 1 characters"):
        score(torch.nn.Identity(), {c: 0 for c in set(ys.text) - {"t"}}, ys)
    with pytest.raises(YardstickError, match="too short for one window of 4096"):
        Yardstick.of_file(path, context=4096)
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps({"stoi": Path("x")}))  # an object to import: refused
    torch.save({"model": {}, "model_args": {}}, tmp_path / "ckpt.pt")
    with pytest.raises(NanoGPTCheckpointError, match="refuses to load pathlib"):
        read_nanogpt_checkpoint(tmp_path / "ckpt.pt", tmp_path / "meta.pkl")
