"""The typed config reaches the code: resolve_config returns a frozen ModelSpec whose components are their options
dataclasses, the models, blocks and layers read its attributes (never a config by string key), and a run reads
its ZooConfig typed while config.yaml and checkpoints keep the plain form."""

import ast
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers import tiny_cfg
from zoo import build_model, count_params, resolve_config
from zoo.config.schema import ModelConfig
from zoo.layers.attention import GQAOptions
from zoo.layers.norm import NormOptions
from zoo.spec import ModelSpec, Part

ROOT = Path(__file__).resolve().parents[1]
# Where the config is read typed only: the parts a model is made of.
TYPED_ONLY = [*sorted((ROOT / "zoo" / "models").glob("*.py")), *sorted((ROOT / "zoo" / "layers").glob("*.py")),
              ROOT / "zoo" / "block.py"]
CONFIG_NAMES = {"cfg", "config", "plain", "model_cfg", "spec", "opts", "options", "node"}


def _root_name(node: ast.expr) -> str | None:
    """`cfg` for cfg, cfg.attention, cfg["a"]["b"], self.cfg: the name a chain of lookups starts from."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute) and node.attr in CONFIG_NAMES:
            return node.attr
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def string_key_reads(source: str) -> list[str]:
    """Every `<config>["key"]` and `<config>.get("key")` in source, where <config> is named as a config is."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
                isinstance(node.slice.value, str) and _root_name(node.value) in CONFIG_NAMES:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and \
                _root_name(node.func.value) in CONFIG_NAMES:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_check_finds_string_key_reads():
    found = string_key_reads('n = cfg["d_model"]\nw = self.cfg["attention"]["window"]\nf = cfg.get("final_norm")')
    assert sorted(found) == ["line 1: cfg['d_model']", "line 2: self.cfg['attention']",
                             "line 2: self.cfg['attention']['window']", "line 3: cfg.get('final_norm')"]
    assert string_key_reads('n = cfg.d_model\nkw = {"a": 1}\nx = kw["a"]') == []


@pytest.mark.parametrize("path", TYPED_ONLY, ids=lambda p: str(p.relative_to(ROOT)))
def test_models_blocks_and_layers_read_the_config_by_attribute(path):
    assert string_key_reads(path.read_text()) == []


def test_resolve_config_returns_a_frozen_spec_of_options_dataclasses():
    spec = resolve_config(tiny_cfg(attention={"name": "gqa", "n_kv_heads": 2},
                                   norm={"placement": "pre", "type": "rmsnorm"}))
    assert isinstance(spec, ModelSpec)
    assert spec.attention == Part("gqa", GQAOptions(n_kv_heads=2))
    assert spec.norm == Part("rmsnorm", NormOptions(), "pre")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.d_model = 64  # type: ignore[misc]
    assert resolve_config(spec) is spec  # already resolved: returned as it is
    for part in (spec.attention, spec.position, spec.norm, spec.ffn):  # and every component's options
        name = dataclasses.fields(part.options)[0].name if dataclasses.fields(part.options) else "anything"
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part.options, name, None)
    changed = dataclasses.replace(spec.attention.options, n_kv_heads=1)  # a changed copy is still possible
    assert changed.n_kv_heads == 1 and spec.attention.options.n_kv_heads == 2


def test_the_spec_has_the_schemas_keys_and_gives_back_the_plain_form():
    assert [f.name for f in dataclasses.fields(ModelSpec)] == [f.name for f in dataclasses.fields(ModelConfig)]
    plain = resolve_config(tiny_cfg(ffn={"name": "swiglu", "d_ff": 48})).as_dict()
    assert plain["ffn"] == {"name": "swiglu", "d_ff": 48, "post_act_norm": False} and plain["norm"] == {
        "type": "layernorm", "placement": "pre", "eps": 1e-5}
    assert resolve_config(plain).as_dict() == plain  # the plain form resolves to the same spec


@pytest.mark.parametrize("form", ["dict", "DictConfig", "ModelConfig", "ModelSpec"])
def test_build_model_takes_every_form_it_took_and_the_typed_ones(form):
    cfg = tiny_cfg(ffn={"name": "swiglu"})
    given = {"dict": lambda: cfg, "DictConfig": lambda: OmegaConf.create(cfg),
             "ModelConfig": lambda: ModelConfig(**{**dataclasses.asdict(ModelConfig()), **cfg}),
             "ModelSpec": lambda: resolve_config(cfg)}[form]()
    assert build_model(given).cfg == resolve_config(cfg)
    assert count_params(given) == count_params(cfg)
