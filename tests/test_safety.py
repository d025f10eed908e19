"""No config can make train.py run code the user did not ask for: every `_target_` (Hydra's section included)
must be an allowed class, checked before Hydra instantiates anything."""

import sys
from pathlib import Path

import pytest

from tests import zygote
from tests.helpers import TINY, compose_cfg
from zoo.training.runner import main
from zoo.training.safety import ALLOWED_TARGETS, check_argv, check_targets

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "train.py")


def _train_py(args, cwd):
    return zygote.run([sys.executable, TRAIN, *args, *TINY, "threads=1"], cwd=cwd, capture_output=True,
                      text=True, timeout=600)


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    return victim


def _assert_refused(r, key):
    err = r.stderr.strip()
    assert r.returncode == 2, r.stderr[-2000:]
    assert err.startswith(f"error: {key}: ") and "is not allowed" in err and "\n" not in err, err


def test_hydra_callback_from_the_command_line_is_refused(tmp_path):
    victim = _victim(tmp_path)
    r = _train_py(["+hydra.callbacks.x._target_=builtins.open", f"+hydra.callbacks.x.file={victim}",
                   "+hydra.callbacks.x.mode=w", "+hydra.callbacks.y._target_=zoo.report.np.savez",
                   f"+hydra.callbacks.y.file={tmp_path / 'marker'}"], tmp_path)
    _assert_refused(r, "hydra.callbacks.x._target_")
    assert victim.read_text() == "precious"
    assert not list(tmp_path.glob("marker*"))
    assert not (tmp_path / "outputs").exists()  # refused before Hydra made a run directory


def test_hydra_callback_from_a_config_dir_yaml_is_refused_in_a_sweep(tmp_path):
    victim = _victim(tmp_path)
    conf = tmp_path / "myconf"
    conf.mkdir()
    (conf / "mine.yaml").write_text(
        "defaults:\n  - config\n  - _self_\nhydra:\n  callbacks:\n    x:\n      _target_: builtins.open\n"
        f"      file: {victim}\n      mode: w\n    y:\n      _target_: zoo.report.np.savez\n"
        f"      file: {tmp_path / 'marker'}\n")
    r = _train_py(["-m", "--config-dir", str(conf), "--config-name", "mine", "seed=0,1"], tmp_path)
    _assert_refused(r, "hydra.callbacks.x._target_")
    assert victim.read_text() == "precious"
    assert not list(tmp_path.glob("marker*"))


@pytest.mark.parametrize("argv,key", [
    (["+hydra.callbacks.x._target_=os.system"], "hydra.callbacks.x._target_"),
    (["-m", "+hydra.callbacks.x._target_=zoo.report.ReportAfterSweep,zoo.report.np.savez"],
     "hydra.callbacks.x._target_"),
    (["+hydra.callbacks.x={_target_: zoo.report.np.savez}"], "hydra.callbacks.x._target_"),
    (["hydra.launcher._target_=builtins.exec"], "hydra.launcher._target_"),
    (["-m", "hydra/sweeper=optuna", "hydra.sweeper.sampler._target_=os.remove"], "hydra.sweeper.sampler._target_"),
    (["+hydra.job_logging.handlers.x.class=logging.os.system"], "hydra.job_logging.handlers.x.class"),
    (["+logger.x._target_=zoo.report.np.savez"], "logger.x._target_"),
])
def test_check_argv_refuses(argv, key):
    error = check_argv(argv, TRAIN)
    assert error is not None and error.startswith(f"{key}: ") and "is not allowed" in error, error


def test_experimental_rerun_is_refused(tmp_path):
    """Hydra's --experimental-rerun unpickles a config file and runs it, past any check."""
    error = check_argv(["--experimental-rerun", str(tmp_path / "config.pickle")], TRAIN)
    assert error is not None and error.startswith("--experimental-rerun: not supported"), error


def test_check_argv_composes_each_swept_group_choice(tmp_path):
    """A sweep over a group whose option (from --config-dir) carries a hydra callback."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "evil.yaml").write_text(
        "# @package _global_\nhydra:\n  callbacks:\n    x:\n      _target_: builtins.open\n")
    error = check_argv(["-m", "--config-dir", str(tmp_path), "experiment=nanogpt_cpu,evil"], TRAIN)
    assert error is not None and error.startswith("hydra.callbacks.x._target_: 'builtins.open'"), error


def test_check_argv_refuses_a_logging_factory_from_a_yaml(tmp_path):
    """logging.config.dictConfig calls a handler's `()`: Hydra's logging sections are code too."""
    (tmp_path / "mine.yaml").write_text("defaults:\n  - config\n  - _self_\nhydra:\n  job_logging:\n"
                                        "    handlers:\n      x:\n        (): builtins.open\n")
    error = check_argv(["--config-dir", str(tmp_path), "--config-name", "mine"], TRAIN)
    assert error is not None and error.startswith("hydra.job_logging.handlers.x.(): 'builtins.open'"), error


def test_check_argv_composes_each_group_choice_of_the_sweepers_params(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "evil.yaml").write_text(
        "# @package _global_\nhydra:\n  job_logging:\n    handlers:\n      x:\n        class: logging.os.system\n")
    (tmp_path / "mine.yaml").write_text("defaults:\n  - config\n  - _self_\nhydra:\n  sweeper:\n    params:\n"
                                        "      experiment: nanogpt_cpu,evil\n")
    error = check_argv(["-m", "--config-dir", str(tmp_path), "--config-name", "mine"], TRAIN)
    assert error is not None and error.startswith("hydra.job_logging.handlers.x.class: 'logging.os.system'"), error


@pytest.mark.parametrize("argv", [
    [], ["-m", "study=ffn"], ["-m", "hparams_search=lr_warmup"], ["-m", "hydra/launcher=slurm"],
    ["-m", "hydra/launcher=submitit_local"], ["-m", "hydra/launcher=joblib", "ffn=relu,gelu"], ["logger=wandb"],
    ["logger=tensorboard"], ["experiment=llama_style"], ["hydra/job_logging=disabled"], ["-m", "study=speedrun"],
    ["-m", "study=speedrun", "ladder=cpu3"],
])
def test_check_argv_allows_what_conf_uses(argv):
    assert check_argv(argv, TRAIN) is None


@pytest.mark.parametrize("override, error", [
    ("hydra.callbacks.report.target=abc", "hydra.callbacks.report.target: expected a number or null, got 'abc'"),
    ("hydra.callbacks.report.also.drop_one.target=true",
     "hydra.callbacks.report.also.drop_one.target: expected a number or null, got True"),
    ('+hydra.callbacks.report.also.x={baselin:"speedrun=full"}',
     "hydra.callbacks.report.also.x: expected a baseline ('ffn=gelu') or a mapping with baseline and, optionally, "
     "target; got {'baselin': 'speedrun=full'}"),
])
def test_check_argv_refuses_bad_report_arguments_in_one_line(override, error):
    """The sweep's report callback is checked before Hydra creates it, not when the sweep has run."""
    assert check_argv(["-m", "study=speedrun", override], TRAIN) == error


def test_train_py_refuses_a_bad_report_target_before_any_run(tmp_path):
    r = _train_py(["-m", "study=speedrun", "hydra.callbacks.report.target=abc", f"hydra.sweep.dir={tmp_path / 's'}"],
                  tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == \
        "error: hydra.callbacks.report.target: expected a number or null, got 'abc'", r.stderr[-2000:]
    assert not (tmp_path / "s").exists()


def test_every_target_in_conf_is_allowed_and_importable():
    import importlib

    targets = [line.split("_target_:")[1].strip() for p in (ROOT / "conf").rglob("*.yaml")
               for line in p.read_text().splitlines() if "_target_:" in line]
    assert targets and set(targets) <= set(ALLOWED_TARGETS)
    for target in ALLOWED_TARGETS:  # a typo in the allow-list would silently refuse a valid class
        module, _, name = target.rpartition(".")
        try:
            assert hasattr(importlib.import_module(module), name), target
        except ImportError:  # optional extras (optuna, mlflow...) may be absent
            continue


def test_reexported_modules_under_zoo_are_not_allowed():
    with pytest.raises(ValueError, match="'zoo.report.np.savez' is not allowed"):
        check_targets({"logger": {"x": {"_target_": "zoo.report.np.savez"}}})


def test_logger_target_refused_in_process(tmp_path, capsys):
    marker = tmp_path / "marker"
    cfg = compose_cfg(TINY + ["+logger.x._target_=zoo.report.np.savez", f"+logger.x.file={marker}"])
    assert main(cfg, tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: logger.x._target_: 'zoo.report.np.savez' is not allowed") and "\n" not in err
    assert not list(tmp_path.glob("marker*"))
