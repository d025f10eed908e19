"""study=narang: conf/narang/ holds zoo's vanilla and one file per row of Narang et al. 2021's Table 1 that zoo builds,
each the vanilla plus the row's change. Each row composes in the study as written and builds (meta device) as the
vanilla with exactly the keys the row names changed; each equals docs/catalogue.md's mapping of its paper row; and
each application's study runs every row or lists it as skipped, with a reason that holds (zoo refuses the row there,
or it is the very model of the row the reason names)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from tests.helpers import compose_cfg
from tests.test_catalogue_map import NARANG, VANILLA, overrides
from zoo.build import flatten_config, resolve_config
from zoo.component import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf"
ROWS = sorted(p.stem for p in (CONF / "narang").glob("*.yaml"))
STUDIES = {"narang": 65, "narang_bpe": 1024, "narang_seq2seq": 31}  # the vocabulary each application trains with
SEQ2SEQ = "narang_seq2seq"  # the application where every row but the adaptive ones applies: their own lineage


def row_file(row: str) -> dict:
    return yaml.safe_load((CONF / "narang" / f"{row}.yaml").read_text())


def paper_row(row: str) -> str:
    """The Table 1 row a file builds, from its second line: # Narang et al. 2021, Table 1: "<row>"."""
    found = re.search(r'^# Narang et al\. 2021, Table 1: "(.+)"$', (CONF / "narang" / f"{row}.yaml").read_text(), re.M)
    assert found, f"conf/narang/{row}.yaml: its second line names no row of the paper's Table 1"
    return found.group(1)


def spec(args: list[str], vocab: int) -> dict:
    """The composed model, sized as training sizes it (its vocabulary, the context as max_seq_len), resolved and
    validated by building it on the meta device (resolve_config); flattened: {'ffn.name': 'relu', ...}. Composed once
    per file for each command line (most of this file's time is Hydra composing: the vanilla of each application is
    every row's base); a copy, so no test changes another's."""
    return dict(_spec(tuple(args), vocab))


@functools.cache
def _spec(args: tuple[str, ...], vocab: int) -> dict:
    model = OmegaConf.to_container(compose_cfg(list(args)).model, resolve=True)
    model.update(vocab_size=vocab, max_seq_len=64)
    return flatten_config(resolve_config(model).as_dict())


def shapes(args: list[str], vocab: int) -> tuple[str, list[tuple[str, tuple[int, ...]]]]:
    """The model built on the meta device: its modules as printed and every parameter's name and shape."""
    from zoo.build import meta_model

    model = OmegaConf.to_container(compose_cfg(args).model, resolve=True)
    built = meta_model({**model, "vocab_size": vocab, "max_seq_len": 64})
    return str(built), [(n, tuple(p.shape)) for n, p in built.named_parameters()]


def named(row: str) -> tuple[set[str], set[str]]:
    """(the model keys a row file sets, the component groups it overrides): what the row may change."""
    cfg = row_file(row)
    groups = {m.group(1) for d in cfg.get("defaults", []) if isinstance(d, dict)
              for k in d if (m := re.fullmatch(r"override /(\w+)", k))}
    return set(flatten_config(cfg.get("model") or {})), groups


def study(name: str) -> dict:
    return yaml.safe_load((CONF / "study" / f"{name}.yaml").read_text())


def swept(name: str) -> list[str]:
    return str(study(name)["hydra"]["sweeper"]["params"]["narang"]).split(",")


def skipped(name: str) -> dict[str, str]:
    return study(name)["hydra"]["callbacks"]["report"].get("skipped") or {}


def runs_in(name: str) -> list[str]:
    return [r for r in ROWS if r not in skipped(name)]


def test_the_group_holds_every_row_the_catalogue_builds():
    """One file per row of Table 1 that docs/catalogue.md says zoo builds, and no other."""
    built = {row for row, cell in NARANG if not cell.startswith("not built")}
    assert sorted(paper_row(r) for r in ROWS) == sorted(built)
    assert len(ROWS) == len(built) == 49  # 52 rows, 3 not built


@pytest.mark.parametrize("name", STUDIES)
def test_each_study_runs_every_row_or_says_why_not(name):
    rows, skip = swept(name), skipped(name)
    assert rows[0] == "vanilla" and study(name)["hydra"]["callbacks"]["report"]["baseline"] == "narang=vanilla"
    assert len(rows) == len(set(rows)) and not set(rows) & set(skip)
    assert sorted(rows + list(skip)) == ROWS, "a row of conf/narang/ is neither swept nor skipped with a reason"
    assert all(isinstance(why, str) and len(why) > 20 for why in skip.values())
    assert study(name)["hydra"]["sweeper"]["params"]["seed"] == "0,1,2"


@pytest.mark.parametrize("row", [r for r in ROWS if r != "vanilla"])
def test_each_row_is_the_vanilla_plus_exactly_its_change(row):
    """Composed in the application where it applies (seq2seq for the encoder rows, the BPE LM for the adaptive
    ones), the row builds, and every key in which it differs from the vanilla is one the row names: a model key it
    sets, or a key under a group it overrides; and it differs in one at least."""
    name = next(n for n in (SEQ2SEQ, "narang_bpe") if row in runs_in(n))
    base = spec([f"study={name}"], STUDIES[name])
    got = spec([f"study={name}", f"narang={row}"], STUDIES[name])
    keys, groups = named(row)
    if name == SEQ2SEQ and "tie_embeddings" in keys:  # the study ties the encoder's table to tie_embeddings
        keys |= {"tie_encoder_decoder"}
    differ = {k for k in base.keys() | got.keys() if base.get(k) != got.get(k)}
    assert differ, f"{row}: the vanilla's model"
    stray = {k for k in differ if k not in keys and k.split(".")[0] not in groups}
    assert not stray, f"{row} changes {sorted(stray)}, which it does not name"


@pytest.mark.parametrize("row", [r for r in ROWS if not r.startswith("depth_")])
def test_each_row_is_the_catalogue_s_mapping_of_its_paper_row(row):
    """The row's model equals docs/catalogue.md's overrides for its paper row on the catalogue's vanilla (T5's
    encoder-decoder), in the seq2seq application. The depth rows differ by design: the catalogue scales a 6-layer
    base, the study's is 4 layers at equal parameters (their files say how)."""
    cell = dict(NARANG)[paper_row(row)]
    setup = ["model.bias=false", "data=reverse", "model.tie_encoder_decoder=true"]
    want = spec(VANILLA + setup + overrides(cell) if cell.startswith("`") else VANILLA + setup, STUDIES[SEQ2SEQ]) \
        if row not in skipped(SEQ2SEQ) else None
    if want is None:  # the adaptive rows: the BPE LM, on the decoder-only model (they untie the head only)
        want = spec(["study=narang_bpe"] + overrides(cell), STUDIES["narang_bpe"])
        assert spec(["study=narang_bpe", f"narang={row}"], STUDIES["narang_bpe"]) == want
        return
    assert spec([f"study={SEQ2SEQ}", f"narang={row}"], STUDIES[SEQ2SEQ]) == want


def test_the_depth_rows_trade_depth_for_width_at_the_vanilla_s_parameters():
    """Their files solve d_ff for the vanilla's parameters; each has its paper row's depth ratio to 12 layers."""
    from zoo.build import count_params

    def params(args):
        model = OmegaConf.to_container(compose_cfg(args).model, resolve=True)
        return count_params({**model, "vocab_size": 65, "max_seq_len": 64})["total"]

    vanilla = params(["study=narang"])
    for row in [r for r in ROWS if r.startswith("depth_")]:
        layers = int(re.match(r"(\d+) layers", paper_row(row)).group(1))
        assert row_file(row)["model"]["n_layers"] == max(2, round(4 * layers / 12)), row
        assert abs(params(["study=narang", f"narang={row}"]) / vanilla - 1) < 0.01, row


@pytest.mark.parametrize("name", STUDIES)
def test_each_skipped_row_is_refused_there_or_is_the_row_its_reason_names(name):
    """A reason is checked: zoo refuses to build the row in that application, or the reason says 'this is the row
    <r>' and the two build the same model."""
    vocab = STUDIES[name]
    for row, why in skipped(name).items():
        same = re.search(r"this is the row (\w+)", why)
        if same:  # the same modules and weights (share_blocks=decoder and =all name one stack's sharing alike)
            assert shapes([f"study={name}", f"narang={row}"], vocab) == \
                shapes([f"study={name}", f"narang={same[1]}"], vocab), (name, row)
        else:
            with pytest.raises(ConfigError):
                spec([f"study={name}", f"narang={row}"], vocab)


@pytest.mark.parametrize("name", STUDIES)
def test_every_row_a_study_runs_builds_there(name):
    for row in swept(name):
        spec([f"study={name}", f"narang={row}"], STUDIES[name])


@pytest.mark.parametrize("application", STUDIES)
def test_every_row_the_study_runs_builds_on_its_ladder(application):
    """ladder=cpu3 trains under muP, which refused five rows (factorized embeddings, the mixture of softmaxes)
    before their heads had muP roles; the adaptive rows (BPE only) have none yet and are refused in one line.
    One size: muP's check builds the base and twice it whatever the size."""
    for row in swept(application):
        args = [f"study={application}", "ladder=cpu3", "size=cpu_l", f"narang={row}"]
        if row.startswith("adaptive_"):
            with pytest.raises(ValueError, match="adaptive embeddings and softmax have no muP roles; valid: standard"):
                spec(args, STUDIES[application])
        else:
            spec(args, STUDIES[application])


def test_the_seq2seq_vocabulary_is_the_task_s():
    """STUDIES' 31 for seq2seq: the task alphabet's char tokenizer, as training builds it."""
    from zoo.data.tasks import TASK_ALPHABET
    from zoo.data.tokenizers import build_tokenizer

    assert build_tokenizer("char").fit(TASK_ALPHABET).vocab_size == STUDIES[SEQ2SEQ]


# study=catalogue: the catalogue's ideas outside Narang et al.'s table, each on the same vanilla
CATALOGUE = sorted(p.stem for p in (CONF / "catalogue").glob("*.yaml"))


def test_study_catalogue_runs_every_file_of_its_group():
    cfg = study("catalogue")
    rows = str(cfg["hydra"]["sweeper"]["params"]["catalogue"]).split(",")
    assert rows[0] == "vanilla" and cfg["hydra"]["callbacks"]["report"]["baseline"] == "catalogue=vanilla"
    assert sorted(rows) == CATALOGUE and len(rows) == len(set(rows))
    assert spec(["study=catalogue"], 65) == spec(["study=narang"], 65)  # one vanilla for both studies


@pytest.mark.parametrize("row", [r for r in CATALOGUE if r != "vanilla"])
def test_each_catalogue_row_is_the_vanilla_plus_exactly_its_change(row):
    cfg = yaml.safe_load((CONF / "catalogue" / f"{row}.yaml").read_text())
    groups = {m.group(1) for d in cfg.get("defaults", []) if isinstance(d, dict)
              for k in d if (m := re.fullmatch(r"override /(\w+)", k))}
    keys = set(flatten_config(cfg.get("model") or {}))
    base, got = spec(["study=catalogue"], 65), spec(["study=catalogue", f"catalogue={row}"], 65)
    differ = {k for k in base.keys() | got.keys() if base.get(k) != got.get(k)}
    assert differ and not {k for k in differ if k not in keys and k.split(".")[0] not in groups}, (row, differ)
