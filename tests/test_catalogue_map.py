"""docs/catalogue.md maps Narang et al.'s Table 1 and x-transformers' features to zoo configs: every row it says zoo
builds is composed as written (Hydra, the shipped conf/), built at a tiny size and run forward; each of Narang et al.'s
rows differs from their vanilla baseline, so a row mapped to nothing new fails."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers import compose_cfg, run
from zoo import build_model
from zoo.build import resolve_config
from zoo.training.cli import expand

PAGE = Path(__file__).resolve().parents[1] / "docs" / "catalogue.md"
VANILLA = ["model=encoder_decoder", "norm=pre_ln", "position=t5", "ffn=relu"]


def rows(section: str) -> list[tuple[str, str]]:
    """(row, its overrides or a 'not built' sentence) of the table under the heading `section`."""
    text = PAGE.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("row", "feature") and not set(cells[0]) <= {"-"}:
            found.append((cells[0], cells[1]))
    return found


NARANG = rows("Narang et al. 2021, Table 1")
FEATURES = rows("x-transformers' README features")


def overrides(cell: str) -> list[str]:
    """The cell's overrides as train.py reads them (`attention.qk_norm=true` is short for model.attention...)."""
    return [expand(a) for a in shlex.split(cell.strip("`"))] if cell.startswith("`") else []


def tiny_model(args: list[str]) -> dict:
    """The composed config's model, sized down as training sizes it (vocabulary from data, positions from context)."""
    model = OmegaConf.to_container(compose_cfg(args).model, resolve=True)
    model.update(vocab_size=512, max_seq_len=16, d_model=64)
    if not isinstance(model.get("sublayers"), list) and not model.get("funnel"):  # each names its blocks
        model.update({k: min(model[k], 2) for k in ("n_layers", "n_decoder_layers") if model.get(k)})
    if model.get("embed_dim"):
        model["embed_dim"] = 16
    return model


def forward(model_cfg: dict) -> None:
    model = build_model(model_cfg).eval()
    with torch.no_grad():
        out = run(model, torch.randint(0, 512, (2, 9)))
    assert torch.isfinite(out).all()


def test_the_tables_hold_every_row():
    assert len(NARANG) == 52 and len(FEATURES) == 32  # the paper's rows; the README's Features headings
    built = [r for r, cell in NARANG + FEATURES if cell.startswith("`")]
    assert all(cell.startswith("`") or cell.startswith("not built") or cell.startswith("(the baseline")
               for _, cell in NARANG + FEATURES), [c for _, c in NARANG + FEATURES]
    assert len(built) > 70


@pytest.mark.parametrize("row,cell", [r for r in NARANG if r[1].startswith("`")], ids=[r[0] for r in NARANG
                                                                                        if r[1].startswith("`")])
def test_each_narang_row_builds_and_differs_from_the_vanilla_baseline(row, cell):
    model_cfg = tiny_model(VANILLA + overrides(cell))
    baseline = tiny_model(VANILLA)
    if not re.search(r"n_layers=", cell):  # the depth rows change the sizes tiny_model caps: compared uncapped
        assert resolve_config(model_cfg).as_dict() != resolve_config(baseline).as_dict(), f"{row}: same as vanilla"
    else:
        assert OmegaConf.to_container(compose_cfg(VANILLA + overrides(cell)).model) != \
            OmegaConf.to_container(compose_cfg(VANILLA).model)
    forward(model_cfg)


@pytest.mark.parametrize("row,cell", [r for r in FEATURES if r[1].startswith("`")], ids=[r[0] for r in FEATURES
                                                                                          if r[1].startswith("`")])
def test_each_x_transformers_feature_builds(row, cell):
    forward(tiny_model(overrides(cell)))
