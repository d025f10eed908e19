"""Every trainer.*, data.* and optim.* key a user can set is checked for its type before torch loads, with the
same one line as the model's typed keys: `<key>: got <value>; valid: <what it takes>`, exit code 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import zygote

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
PRESETS = [[], ["data=text_file"], ["data=tokens"], ["data=copy"], ["data=hf"], ["trainer=gpu"]]
WRONG = {bool: ("maybe", "true or false"), int: ("ten", "an integer"), float: ("abc", "a number"),
         list: ("x", "a list")}


def _cases() -> list[tuple[list[str], str, str, str]]:
    """(the group choices, key, a value of the wrong type, the start of the expected error) for every key of
    every data and trainer preset whose value has a type (text takes any value; null is the run's to check)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from zoo.config.schema import register

    register()
    cases, seen = [], set()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for groups in PRESETS:
            cfg = compose("config", overrides=groups)
            for section in ("trainer", "data", "optim"):
                for name, default in OmegaConf.to_container(cfg[section], resolve=False).items():
                    key = f"{section}.{name}"
                    kind = next((k for k in (bool, int, float, list) if isinstance(default, k)), None)
                    if key == "data.long_context":
                        kind = int  # null by default; an integer when set
                    if kind is None or key in seen or key == "trainer.devices":
                        continue
                    seen.add(key)
                    value, valid = WRONG[kind]
                    cases.append((groups, key, value, f"{key}: got {value!r}; valid: {valid}"))
    return cases


CASES = _cases()


def test_the_table_covers_every_section():
    keys = {c[1] for c in CASES}
    for key in ("trainer.max_steps", "trainer.val_check_interval", "trainer.deterministic", "trainer.gradient_clip_val",
                "data.batch_size", "data.val_fraction", "data.long_context", "data.n_train", "data.train_len",
                "optim.lr", "optim.warmup_steps", "optim.betas"):
        assert key in keys
    assert len(CASES) >= 25


def test_every_wrongly_typed_key_is_one_line_before_torch_loads():
    """All cases in one fresh interpreter, through train.py's own argument check: each answered with its one
    line, and torch never imported."""
    script = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from train import check_arguments
out = [check_arguments(groups + [f"{{key}}={{value}}"]) for groups, key, value, _ in {CASES!r}]
print(json.dumps({{"errors": out, "torch": "torch" in sys.modules}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["torch"] is False
    for (groups, key, value, expected), got in zip(CASES, result["errors"], strict=True):
        assert got is not None and got.startswith(expected) and "\n" not in got, (groups, key, value, got)


@pytest.mark.parametrize("args, error", [
    (["trainer.max_steps=ten"], "error: trainer.max_steps: got 'ten'; valid: an integer"),
    (["data=text_file", "data.path=/no/such/file.txt"], "error: data.path: no such file '/no/such/file.txt'"),
    (["data=tokens", "data.path=/no/such/dir"], "error: data.path: no prepared corpus at '/no/such/dir'"),
])
def test_train_py_answers_in_one_line_with_exit_code_2(args, error):
    proc = zygote.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and proc.stderr.startswith(error) and proc.stderr.count("\n") == 1, proc.stderr


def test_values_of_the_right_type_pass():
    from train import check_arguments

    for args in (["trainer.devices=auto"], ["trainer.devices=[0,1]"], ["trainer.gradient_clip_val=null"],
                 ["data.long_context=128"], ["optim.lr=3e-3"], ["optim.lr=1"], ["trainer.max_steps=5,10"]):
        assert check_arguments(args) is None, args
