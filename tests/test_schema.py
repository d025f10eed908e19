"""The config's typed schema (zoo/config/schema.py): one home for every default, typed errors in one line."""

import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from tests import zygote
from tests.helpers import compose_cfg
from zoo.build import DEFAULTS, resolve_config
from zoo.component import Options
from zoo.config.schema import (
    KINDS,
    ModelConfig,
    SampleConfig,
    ZooConfig,
    default_of,
    option_specs,
    register,
)
from zoo.layers.norm import NormOptions
from zoo.optim.adamw import AdamWOptions
from zoo.registry import POSITION, REGISTRIES
from zoo.training.cli import check_group_choices, check_keys, expand, help_text

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


@pytest.mark.parametrize("args,expected", [
    (["model.d_model=abc"], "error: model.d_model: got 'abc'; valid: an integer"),
    (["optim.lr=fast"], "error: optim.lr: got 'fast'; valid: a number"),
    (["attention.window=abc"], "error: model.attention.window: got 'abc'; valid: an integer, or null"),
    (["seed=x"], "error: seed: got 'x'; valid: an integer"),
    (["-m", "seed=0,x"], "error: seed: got 'x'; valid: an integer"),
])
def test_a_wrongly_typed_value_is_one_line_naming_the_full_key(args, expected):
    proc = zygote.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and proc.stderr.strip() == expected, proc.stderr[-2000:]


def test_a_preset_key_the_chosen_option_lacks_is_one_line():
    """experiment=nanogpt_cpu_fast sets Muon's optim.adamw_lr; with optim=adamw beside it the key has no home: one
    line naming the key, the preset that set it, the option and the option's keys, not Hydra's four lines."""
    valid = ", ".join(sorted(f.name for f in dataclasses.fields(AdamWOptions)))  # as optim.<key>'s own error
    proc = zygote.run([sys.executable, "train.py", "experiment=nanogpt_cpu_fast", "optim=adamw"], cwd=ROOT,
                      capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and proc.stderr.strip() == \
        f"error: optim.adamw_lr (set by experiment/nanogpt_cpu_fast): not an option of 'adamw'; valid: {valid}", \
        proc.stderr[-2000:]
    assert "lr" in valid.split(", ") and "adamw_lr" not in valid


def test_typed_errors_answer_without_torch_once_the_options_are_cached():
    option_specs()  # this process has the registries loaded: it reads them and keeps the copy train.py reads
    proc = subprocess.run([sys.executable, "-X", "importtime", "train.py", "attention.window=abc"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "error: model.attention.window: got 'abc'" in proc.stderr, proc.stderr[-2000:]
    assert not any(line.rstrip().endswith(" torch") for line in proc.stderr.splitlines()), "torch was imported"


@pytest.mark.parametrize("args,expected", [
    (["model.n_heads=2.5"], "model.n_heads: got 2.5; valid: an integer"),
    (["norm.eps=abc"], "model.norm.eps: got 'abc'; valid: a number"),
    (["optim.betas=[0.9,x]"], "optim.betas[1]: got 'x'; valid: a number"),
    (["-m", "model=encoder_only,decoder_only", "model.dropout=0.1,big"], "model.dropout: got 'big'; valid: a number"),
    (["sample.top_k=many"], "sample.top_k: got 'many'; valid: an integer, or null"),
    (["model.bias=5"], "model.bias: got 5; valid: true or false"),  # OmegaConf alone would read 5 as true
    (["compile=1"], "compile: got 1; valid: true or false"),
])
def test_typed_errors_in_process(args, expected):
    assert check_keys([expand(a) for a in args], CONF) == expected


def test_well_typed_values_pass():
    assert check_keys(["model.d_model=64", "optim.lr=3e-4", "model.attention.window=32", "model.norm.eps=1e-6",
                       "position=rope", "model.position.theta=5e5", "model.ffn.d_ff=256", "seed=3",
                       "model.dropout=0"], CONF) is None


def _values(node) -> dict:
    return OmegaConf.to_container(node) if OmegaConf.is_config(node) else node


def test_the_default_config_composes_to_the_dataclass_defaults():
    cfg = compose_cfg([])
    assert _values(cfg.optim) == {"name": "adamw", **dataclasses.asdict(AdamWOptions())}
    assert _values(cfg.sample) == dataclasses.asdict(SampleConfig())
    top = {f.name: f.default for f in dataclasses.fields(ZooConfig) if f.default is not dataclasses.MISSING}
    assert {k: cfg[k] for k in top} == top
    model = _values(cfg.model)
    numbers = {k: v for k, v in dataclasses.asdict(ModelConfig(max_seq_len=None)).items()
               if k not in ("attention", "position", "norm", "ffn")}
    assert {k: model[k] for k in numbers} == numbers
    # the components the config chooses by default are the ones build_model takes by default
    size = {"vocab_size": 10, "max_seq_len": 16}
    assert resolve_config({**model, **size}) == resolve_config({**DEFAULTS, **size})


@pytest.mark.parametrize("kind", ["attention", "position", "norm", "ffn"])
def test_every_preset_restates_no_default(kind):
    """A preset holds only what it chooses: every option it does not set is the component's dataclass default."""
    chosen = {"gqa": {"n_kv_heads": 2}, "sliding_window": {"window": 32}, "sigmoid": {"sigmoid": True},
              "sparse_topk": {"sparse_topk": 8}, "partial_rope": {"fraction": 0.25}, "xpos": {"xpos_scale_base": 512},
              # Narang et al.'s Synthesizer rows (attention=synthesizer is dense alone: the defaults)
              "synthesizer_dense_plus": {"mix": "plus"}, "synthesizer_dense_plus_alpha": {"mix": "alpha"},
              "synthesizer_factorized": {"synthetic": "factorized"}, "synthesizer_random": {"synthetic": "random"},
              "synthesizer_random_plus": {"synthetic": "random", "mix": "plus"},
              "synthesizer_random_plus_alpha": {"synthetic": "random", "mix": "alpha"}}
    name_key = KINDS[kind][1]
    for path in sorted((CONF / kind).glob("*.yaml")):
        node = _values(compose_cfg([f"{kind}={path.stem}"]).model[kind])
        options = REGISTRIES[kind].options(node[name_key])
        defaults = {f.name: f.default for f in dataclasses.fields(options) if f.default is not dataclasses.MISSING}
        expected = {**defaults, **chosen.get(path.stem, {})}
        assert {k: node[k] for k in expected} == expected, path.name
        text = path.read_text()
        for option in defaults:
            assert f"\n{option}:" not in text or option in chosen.get(path.stem, {}), f"{path.name} restates {option}"


def test_rmsnorm_eps_has_one_default():
    assert compose_cfg(["norm=pre_rms"]).model.norm.eps == NormOptions().eps
    assert resolve_config({"vocab_size": 10, "norm": {"placement": "pre", "type": "rmsnorm"}}).norm.options.eps == \
        NormOptions().eps
    assert not any("eps" in p.read_text() for p in (CONF / "norm").glob("*.yaml"))


@dataclass(kw_only=True)
class _ScaledOptions(Options):
    scale: float = 2.0


@pytest.fixture
def new_position():
    """A position registered for the test alone (no conf file), removed afterwards."""
    POSITION.register("test_scaled", POSITION.get("none"), options=_ScaledOptions)
    register()
    yield "test_scaled"
    del POSITION._entries["test_scaled"], POSITION._options["test_scaled"], POSITION._examples["test_scaled"]
    repo = ConfigStore.instance().repo
    repo["position"].pop("test_scaled.yaml")
    repo["_zoo"]["position"].pop("test_scaled.yaml")


def test_a_registered_component_gets_its_hydra_option_with_no_yaml(new_position):
    assert not (CONF / "position" / f"{new_position}.yaml").exists()
    cfg = compose_cfg([f"position={new_position}", "model.position.scale=3"])
    assert _values(cfg.model.position) == {"name": new_position, "scale": 3.0}
    assert compose_cfg([f"position={new_position}"]).model.position.scale == 2.0
    assert check_group_choices([f"position={new_position}"], CONF) is None
    presets = {p.stem for p in (CONF / "position").glob("*.yaml")}  # partial_rope, xpos: rope with an option set
    assert f"position: {', '.join(sorted(set(POSITION.names()) | presets))}\n" in help_text([], CONF, "doc")
    assert check_keys([f"position={new_position}", "model.position.scale=big"], CONF) == \
        "model.position.scale: got 'big'; valid: a number"


def test_an_old_checkpoint_config_still_resolves():
    old = {"vocab_size": 10, "max_seq_len": 16, "attention": {"name": "mha", "window": None, "backend": "sdpa"},
           "norm": {"placement": "pre", "type": "rmsnorm", "eps": 1e-5}, "ffn": {"name": "gelu", "d_ff": None}}
    assert resolve_config(old).as_dict()["attention"] == {"name": "mha", "window": None, "backend": "sdpa",
                                                          "qk_norm": False, "sigmoid": False, "sparse_topk": None,
                                                          "head_scale": False}


def test_default_of_reads_the_schema():
    """What a resume assumes for a key an older checkpoint's config lacks."""
    assert default_of("optim.eps") == AdamWOptions().eps and default_of("seed") == 0
    assert default_of("optim.name") == "adamw"  # a config saved before the optim group trained with AdamW
    assert default_of("model.max_seq_len") is None  # training's default: the data's context
    assert default_of("data.context", "absent") == "absent"  # data presets differ: no schema default
