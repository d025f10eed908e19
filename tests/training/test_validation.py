"""Every value a user can type is refused in one line naming its key, exit code 2, before any data is
loaded or weight allocated."""

import pytest
import torch
from hydra.errors import ConfigCompositionException

import zoo.training.runner as runner
import zoo.training.sizing as sizing
from tests.helpers import TINY, TINY_TASK, compose_cfg, lineages
from zoo.registry import POSITION
from zoo.schema import one_line
from zoo.training.runner import main

NO_GPU = not torch.cuda.is_available()

BAD = [  # (overrides, the start of the one-line error after "error: ")
    (["optim.lr=-0.001"], "optim.lr: got -0.001"),
    (["optim.lr=nan"], "optim.lr: got nan"),
    (["optim.lr=fast"], "optim.lr: got 'fast'"),
    (["optim.lr=0"], "optim.lr: got 0"),
    (["optim.min_lr=-1e-4"], "optim.min_lr: got -0.0001; valid: a number in [0, optim.lr=0.001]"),
    (["optim.min_lr=0.01"], "optim.min_lr: got 0.01"),
    (["optim.betas=[0.9,1.0]"], "optim.betas: got [0.9, 1.0]"),
    (["optim.betas=[-0.1,0.9]"], "optim.betas: got [-0.1, 0.9]"),
    (["optim.betas=[0.9]"], "optim.betas: got [0.9]"),
    (["optim.betas=0.9"], "optim.betas: got 0.9"),
    (["optim.warmup_steps=-5"], "optim.warmup_steps: got -5"),
    (["optim.weight_decay=-0.1"], "optim.weight_decay: got -0.1"),
    (["optim.eps=0"], "optim.eps: got 0"),
    (["seed=-1"], "seed: got -1"),
    (["seed=1.5"], "seed: got 1.5"),
    (["seed=abc"], "seed: got 'abc'"),
    (["trainer.precision=8-bit"], "trainer.precision: got '8-bit'; valid: auto, 32-true"),
    (["trainer.precision=16-mixed"], "trainer.precision: '16-mixed' (float16) needs a GPU"),
    pytest.param(["trainer=gpu"], "trainer.accelerator: 'gpu' but this machine has no CUDA GPU",
                 marks=pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")),
    pytest.param(["trainer.accelerator=cuda"], "trainer.accelerator: 'cuda' but this machine has no CUDA GPU",
                 marks=pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")),
    (["trainer.accelerator=quantum"], "trainer.accelerator: got 'quantum'"),
    (["trainer.devices=0"], "trainer.devices: got 0"),
    (["trainer.devices=-3"], "trainer.devices: got -3"),
    (["trainer.devices=lots"], "trainer.devices: got 'lots'"),
    (["trainer.devices=[0,1]"], "trainer.devices: got [0, 1]"),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval: got 0"),
    (["trainer.val_check_interval=-10"], "trainer.val_check_interval: got -10"),
    (["trainer.val_check_interval=1.5"], "trainer.val_check_interval: got 1.5"),
    (["trainer.val_check_interval=0.5"], "trainer.val_check_interval: got 0.5"),
    (["trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches: got 0"),
    (["trainer.log_every_n_steps=0"], "trainer.log_every_n_steps: got 0"),
    (["trainer.gradient_clip_val=-1"], "trainer.gradient_clip_val: got -1"),
    (["data.eval_batches=0"], "data.eval_batches: got 0"),
    (["data.tokenizer=bpe", "data.vocab_size=10"], "data.vocab_size: got 10"),
    (["data=copy", "data.n_val=0"], "data.n_val: got 0"),
    (["data=copy", "data.n_train=0"], "data.n_train: got 0"),
    (["data=copy", "data.eval_examples=0"], "data.eval_examples: got 0"),
    (["data=copy", "data.train_len=[5,2]"], "data.train_len: got [5, 2]"),
    (["data=copy", "data.test_len=[0,3]"], "data.test_len: got [0, 3]"),
    (["position=rope", "model.position.theta=0"], "model.position.theta: must be positive, got 0"),
    (["position=rope", "model.position.theta=-1"], "model.position.theta: must be positive, got -1"),
    (["position=sinusoidal", "model.position.base=0"], "model.position.base: must be positive, got 0"),
    (["model.norm.eps=-1e-5"], "model.norm.eps: must be positive"),
    (["model.norm.eps=tiny"], "model.norm.eps: got 'tiny'; valid: a number"),
    (["model.init_std=0"], "model.init_std: must be positive"),
    (["model.init_std=x"], "model.init_std: got 'x'; valid: a number"),
    (["model.parametrization=mu"], "model.parametrization: unknown 'mu'; valid: standard, mup"),
    (["model.parametrization=mup", "model.d_model=48", "model.n_heads=4"],
     "model.parametrization: mup keeps the head size (12) at the base width mup_base_d_model=128"),
    (["model.mup_base_d_model=0"], "model.mup_base_d_model: must be an integer from 1 to 65536, got 0"),
    (["model.ffn.name=5"], "model.ffn.name: unknown ffn '5'; valid: elu, geglu"),
    (["model.attention.name=[a]"], "model.attention.name: got ['a']; valid: a string"),
    (["model.norm.type={a: 1}"], "model.norm.type: got {'a': 1}; valid: a string"),
    (["model.d_model=65536", "model.n_heads=1", "model.n_layers=64"], "model: 3,298,"),
    (["data.val_fraction=abc"], "data.val_fraction: got 'abc'"),
    (["data.path=5"], "data.path: got 5"),
    (["compile=abc"], "compile: got 'abc'; valid: true or false"),
    (["trainer.deterministic=abc"], "trainer.deterministic: got 'abc'"),
    (["trainer.strategy=foo"], "trainer.strategy: got 'foo'; valid: auto, ddp"),
    (["+trainer.foo=1"], "trainer.foo: is not a Trainer argument; valid: "),
    (["+trainer.callbacks=[]"], "trainer.callbacks: is set by the run itself"),
    (["+trainer.max_epochs=-5"], "trainer: `max_epochs` must be a non-negative integer or -1"),
    (["+trainer.gradient_clip_algorithm=foo"], "trainer: `gradient_clip_algorithm` foo is invalid"),
    (["+trainer.limit_val_batches=-1"], "trainer: You have passed invalid value -1 for limit_val_batches"),
    (["optim.name=5"], "optim.name: unknown optimizer '5'; valid: adamw, muon"),  # optim=5: a group choice
    (["sample=5"], "sample: got 5"),
    (["sample.temperature=-1"], "sample.temperature: got -1"),
    (["sample.temperature=hot"], "sample.temperature: got 'hot'"),
    (["sample.max_new_tokens=-1"], "sample.max_new_tokens: got -1"),
    (["sample.top_k=0"], "sample.top_k: got 0"),
    (["sample.top_p=0"], "sample.top_p: got 0"),
    (["sample.top_p=1.5"], "sample.top_p: got 1.5"),
    (["sample.prompt=[1]"], "sample.prompt: got [1]"),
]


@pytest.mark.parametrize("overrides,error", BAD, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_bad_value_is_one_line_exit_2_before_data(overrides, error, tmp_path, capsys, monkeypatch):
    def no_data(*a, **k):
        raise AssertionError("data was loaded before the bad value was refused")

    monkeypatch.setattr(sizing, "build_data", no_data)
    task = any(o.startswith("data=copy") for o in overrides)
    try:
        cfg = compose_cfg((TINY_TASK if task else TINY) + overrides)
    except ConfigCompositionException as e:  # a wrongly typed value: refused as the config composes (zoo.schema)
        code, err = 2, f"error: {one_line(e)}"
    else:
        code = main(cfg, tmp_path)
        err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: {error}") and "\n" not in err, err
    assert "Traceback" not in err and not (tmp_path / "checkpoints").exists()


def test_model_too_large_says_what_it_needs_and_what_there_is(tmp_path, capsys, monkeypatch):
    import zoo.training.validate as validate

    monkeypatch.setattr(validate, "available_memory", lambda trainer=None: (2**30, "available RAM"))
    cfg = compose_cfg(TINY + ["model.d_model=1024", "model.n_heads=8", "model.n_layers=8"])  # ~100M params
    assert main(cfg, tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert "need 1." in err and "GiB for weights, gradients and AdamW state, but there is 1.0 GiB available RAM" in err
    assert "\n" not in err


@pytest.mark.parametrize("overrides", [
    ["trainer.precision=bf16-mixed"], ["trainer.val_check_interval=7"], ["optim.min_lr=0", "optim.warmup_steps=0"],
    ["sample.temperature=0", "sample.top_k=null", "sample.max_new_tokens=0"], ["trainer.devices=auto"],
    ["position=rope", "model.position.theta=500000.0"],
])
def test_valid_values_pass_the_checks(overrides):
    from zoo.build import resolve_config
    from zoo.training.validate import check_run

    plain = runner.OmegaConf.to_container(compose_cfg(TINY + overrides), resolve=True)
    check_run(plain)
    resolve_config({**plain["model"], "vocab_size": 10, "max_seq_len": 16})


# ---- checkpoints: weights that do not fit the architecture their config names ----------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from zoo.training import run

    run_dir = tmp_path_factory.mktemp("trained")
    assert run(compose_cfg(TINY + ["logger=none", "sample.max_new_tokens=0"]), run_dir=run_dir) == 0
    return run_dir / "checkpoints" / "last.ckpt"


def _damaged(trained, tmp_path, damage):
    ckpt = torch.load(trained, weights_only=True)
    state = ckpt["state_dict"]
    key = next(k for k, v in state.items() if k.startswith("model.") and v.dim() == 2)
    if damage == "shape":
        state[key] = torch.zeros(state[key].shape[0] + 1, state[key].shape[1])
        expect = f"weight '{key}' has shape [{state[key].shape[0]}, {state[key].shape[1]}], its config's " \
                 f"architecture needs [{state[key].shape[0] - 1}, {state[key].shape[1]}]"
    elif damage == "missing":
        del state[key]
        expect = f"lacks weight '{key}'"
    elif damage == "extra":
        state["model.extra.weight"] = torch.zeros(3, 3)
        expect = "weight 'model.extra.weight' (shape [3, 3]) is not part of its config's architecture"
    else:  # a config that would allocate far more memory than there is
        ckpt["hyper_parameters"]["cfg"]["model"].update(d_model=65536, n_heads=1, n_layers=64)
        expect = "GiB for weights, but there is"
    path = tmp_path / f"{damage}.ckpt"
    torch.save(ckpt, path)
    return path, expect


DAMAGES = ["shape", "missing", "extra", "huge"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_sample_refuses_a_checkpoint_that_does_not_fit(trained, tmp_path, capsys, damage):
    from zoo.sample import main as sample_main

    path, expect = _damaged(trained, tmp_path, damage)
    assert sample_main([str(path), "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: checkpoint: ") and expect in err and "\n" not in err, err


@pytest.mark.parametrize("damage", DAMAGES)
def test_inspect_refuses_a_checkpoint_that_does_not_fit(trained, tmp_path, capsys, damage):
    from zoo.inspect import main as inspect_main

    path, expect = _damaged(trained, tmp_path, damage)
    assert inspect_main(["--attention", str(path), "--text", "To be", "--out", str(tmp_path / "a.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: checkpoint: ") and expect in err and "\n" not in err, err
    assert not (tmp_path / "a.png").exists()


@pytest.mark.parametrize("damage", ["shape", "missing", "extra"])
def test_resume_refuses_a_checkpoint_that_does_not_fit(trained, tmp_path, capsys, damage):
    path, expect = _damaged(trained, tmp_path, damage)
    assert main(compose_cfg(TINY + ["logger=none", f"ckpt_path={path}"]), tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: checkpoint: ") and expect in err and "\n" not in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_inspect_unwritable_out_is_one_line(trained, tmp_path, capsys):
    from zoo.inspect import main as inspect_main

    (tmp_path / "file").write_text("not a folder")
    out = str(tmp_path / "file" / "a.png")
    assert inspect_main(["--attention", str(trained), "--text", "To be", "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out: cannot write") and "\n" not in err, err


def test_checkpoint_with_a_non_text_component_name_is_one_line(trained, tmp_path, capsys):
    from zoo.inspect import main as inspect_main

    ckpt = torch.load(trained, weights_only=True)
    ckpt["hyper_parameters"]["cfg"]["model"]["ffn"]["name"] = ["gelu"]
    torch.save(ckpt, tmp_path / "odd.ckpt")
    assert inspect_main(["--attention", str(tmp_path / "odd.ckpt"), "--text", "To be"]) == 2
    err = capsys.readouterr().err.strip()
    assert "model.ffn.name: unknown ffn ['gelu']; valid:" in err and "\n" not in err, err


# ---- sampling settings: generate(), python -m zoo.sample ----------------------------------------------------

@pytest.mark.parametrize("flags,error", [
    (["--temperature", "-1"], "--temperature: got -1.0; valid: a finite number >= 0"),
    (["--temperature", "nan"], "--temperature: got nan"),
    (["--max-new-tokens", "-5"], "--max-new-tokens: got -5; valid: an integer >= 0"),
    (["--top-p", "0"], "--top-p: got 0.0; valid: a number in (0, 1]"),
    (["--top-p", "1.5"], "--top-p: got 1.5"),
    (["--top-k", "0"], "--top-k: got 0; valid: an integer >= 1"),
    (["--top-k", "-3"], "--top-k: got -3"),
    (["--num-samples", "0"], "--num-samples: got 0; valid: an integer >= 1"),
    (["--num-samples", "-2"], "--num-samples: got -2"),
])
def test_sample_flags_are_checked_before_the_checkpoint_is_read(flags, error, tmp_path, capsys):
    from zoo.sample import main as sample_main

    assert sample_main([str(tmp_path / "not-read.ckpt"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {error}" or (err.startswith(f"error: {error}") and "\n" not in err), err


@pytest.mark.parametrize("kwargs,error", [
    ({"temperature": -0.5}, "temperature: got -0.5"),
    ({"max_new_tokens": -1}, "max_new_tokens: got -1"),
    ({"top_p": 0.0}, "top_p: got 0.0"),
    ({"top_p": 2.0}, "top_p: got 2.0"),
    ({"top_k": 0}, "top_k: got 0"),
])
def test_generate_refuses_bad_sampling_settings(kwargs, error):
    from tests.helpers import tiny_cfg
    from zoo.build import build_model
    from zoo.generate import generate

    model = build_model(tiny_cfg())
    args = {"max_new_tokens": 3, "temperature": 1.0, **kwargs}
    with pytest.raises(ValueError, match=f"^{error.replace('(', '[(]')}"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), **args)


# ---- an unwritable tokenizer cache is a warning, never an error ------------------------------------------------

def test_unwritable_tokenizer_cache_warns_in_one_line_and_goes_on(tmp_path, capsys):
    from zoo.data.tokenizers import cached_bpe

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    text = "to be or not to be, that is the question " * 40
    tok = cached_bpe(text, blocker / "cache.bpe.json", vocab_size=300)
    assert tok.decode(tok.encode("to be")) == "to be"
    err = capsys.readouterr().err.strip()
    assert err.startswith("warning: tokenizer cache: cannot write") and "\n" not in err, err
    assert blocker.read_text() == "a file where the cache folder should be"


# ---- python -m zoo.inspect / zoo.sample: every error one line, exit 2 -----------------------------------------

@pytest.mark.parametrize("argv,error", [
    (["data.context=abc"], "data.context: must be a positive integer, got 'abc'"),
    (["data=copy", "data.test_len=abc"], "data.test_len: got 'abc'"),
    (["data.tokenizer=5"], "data.tokenizer: unknown 5"),
    (["model.ffn.name=5"], "model.ffn.name: unknown ffn '5'"),
    (["model.d_model=abc"], "model.d_model: got 'abc'; valid: an integer"),
    (["position=rope", "model.position.theta=0"], "model.position.theta: must be positive"),
    (["--bogus"], "unrecognized arguments: --bogus; see python -m zoo.inspect --help"),
])
def test_inspect_errors_are_one_line(argv, error, capsys):
    from zoo.inspect import main as inspect_main

    try:
        code = inspect_main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: {error}") and "\n" not in err, err


@pytest.mark.parametrize("argv,error", [
    (["x.ckpt", "--temperature", "hot"], "argument --temperature: invalid float value: 'hot'"),
    ([], "the following arguments are required: checkpoint"),
])
def test_sample_usage_errors_are_one_line(argv, error, capsys):
    from zoo.sample import main as sample_main

    with pytest.raises(SystemExit) as e:
        sample_main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith(f"error: {error}") and "\n" not in err, err


@pytest.mark.parametrize("lineage", lineages())
@pytest.mark.parametrize("position", POSITION.names())
def test_weights_of_every_lineage_fit_their_own_config(lineage, position):
    """The meta-device shapes check_weights expects are those the real model has."""
    from tests.helpers import tiny_cfg
    from zoo.build import build_model
    from zoo.training.checkpoint import check_weights

    cfg = tiny_cfg(lineage, position={"name": position})
    state = {f"model.{k}": v for k, v in build_model(cfg).state_dict().items()}
    check_weights(state, cfg, "x.ckpt")
