"""train.py's command line: mistakes are one line and exit 2, answered before torch loads."""

import subprocess
import sys
from pathlib import Path

import pytest

from zoo.training.cli import check_group_choices, check_keys

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


@pytest.fixture(scope="module", autouse=True)
def _options_cached():
    """The checks answer without torch once the components' options are cached in zoo/__pycache__, which the
    first run after an edit of zoo/ writes (it imports the components once): be that first run here."""
    subprocess.run([sys.executable, "-c", "from zoo.config.schema import option_specs; option_specs()"], cwd=ROOT,
                   check=True, timeout=600)


def _train(*args: str) -> subprocess.CompletedProcess:
    # -X importtime lists every module imported: the checks must answer without torch
    cmd = [sys.executable, "-X", "importtime", "train.py", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("args,expected", [
    (["model.dmodel=64"], "error: model.dmodel: unknown key (did you mean model.d_model?); valid: "),
    (["trainer.max_step=100"], "error: trainer.max_step: unknown key (did you mean trainer.max_steps?); valid: "),
    (["norm.typ=rmsnorm"], "error: model.norm.typ: unknown key (did you mean model.norm.type?); valid: "),
    (["atention=mha"], "error: atention: unknown key (did you mean attention?); valid: attention, "),
    (["model.atention.n_kv_heads=2"], "error: model.atention.n_kv_heads: unknown key (did you mean "
                                      "model.attention.n_kv_heads?); valid: "),
    (["data=text_file"], "error: data.path: required, not set; valid: data.path=<value>"),
    (["trainer=gpux"], "error: trainer: unknown option 'gpux' (did you mean gpu?); valid: cpu, ddp, fsdp, gpu"),
    (["-m", "ffn=relu,nope"], "error: ffn: unknown option 'nope'; valid: "),
    (["study=_cpu"], "error: study: unknown option '_cpu'; valid: attention, "),
])
def test_mistakes_are_one_line_and_exit_2_before_torch_loads(args, expected):
    proc = _train(*args)
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith(expected), proc.stderr[-2000:]
    assert "| torch" not in proc.stderr and "lightning" not in proc.stderr


def test_help_answers_without_torch_and_hides_the_study_base():
    proc = _train("--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    study = next(line for line in proc.stdout.splitlines() if line.startswith("study:"))
    assert "_cpu" not in study and "ffn" in study
    assert "| torch" not in proc.stderr


@pytest.mark.parametrize("args", [
    ["model.d_model=64", "trainer.max_steps=10"],
    ["data=text_file", "data.path=README.md", "data.context=8"],
    ["-m", "attention=mha,gqa", "model.attention.n_kv_heads=2"],  # a key only one choice of a sweep has
    ["+trainer.enable_progress_bar=false", "hydra.run.dir=x", "~logger"],
    ["data=hf", "data.dataset=text"],
    ["--cfg", "job", "model.d_model=64"],
    ["study=ffn", "trainer.max_steps=3"],
])
def test_valid_command_lines_pass(args):
    assert check_group_choices(args, CONF) is None
    assert check_keys(args, CONF) is None


def test_text_file_without_path_is_not_the_embedded_corpus(tmp_path):
    """Run directly (as a sweep's run would be): the `???` survives composition and stops the run."""
    from tests.helpers import TINY, compose_cfg
    from zoo.training import main

    code = main(compose_cfg(TINY + ["data=text_file", "logger=none"]), run_dir=tmp_path)
    assert code == 2 and not (tmp_path / "checkpoints").exists()


def test_an_added_trainer_key_that_lightning_lacks_is_one_line(tmp_path, capsys):
    """Hydra's advice for a misspelling is `+trainer.max_step=...`: that must not end in a traceback."""
    from tests.helpers import TINY, compose_cfg
    from zoo.training import main

    code = main(compose_cfg(TINY + ["+trainer.max_step=3", "logger=none"]), run_dir=tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[0].startswith("error: trainer.max_step: is not a Trainer argument (did you "
                                           "mean trainer.max_steps?)") and len(err) == 1
