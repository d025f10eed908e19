"""The checks before Hydra starts (zoo.cli.train.preflight) answer without torch: a good command passes them and a
bad one is refused in one line, and neither imports torch (nor Lightning)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import sys
from zoo.cli.train import preflight
print(repr(preflight(sys.argv[1:])))
print(sorted(m for m in ("torch", "lightning") if m in sys.modules))
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def warm_options():
    """The components' options read once from the registries (importing torch), as the first command after an
    edit does, and kept (zoo.config.schema.option_specs): every later command reads that copy."""
    assert _python("-c", "from zoo.config.schema import option_specs; option_specs()").returncode == 0


@pytest.mark.parametrize("args,error", [
    (["trainer.max_steps=3", "model.attention.n_kv_heads=2", "attention=gqa"], None),
    (["-m", "ffn=gelu,swiglu", "seed=0,1"], None),
    (["model.d_modl=3"], "model.d_modl: unknown key (did you mean model.d_model?)"),
    (["trainer.max_steps=abc"], "trainer.max_steps: got 'abc'; valid: an integer"),
    (["hydra.callbacks.x._target_=os.system"], "hydra.callbacks.x._target_: 'os.system' is not allowed"),
], ids=["good", "sweep", "bad-key", "bad-type", "bad-target"])
def test_the_preflight_answers_without_torch(warm_options, args, error):
    proc = _python("-c", CODE, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer, loaded = proc.stdout.splitlines()[-2:]
    assert loaded == "[]", proc.stdout
    if error is None:
        assert answer == "None"
    else:
        assert answer.startswith(repr(error)[:-1]) and "\\n" not in answer, answer


@pytest.mark.parametrize("args,configs,error", [
    (["trainer.max_steps=3", "model.attention.n_kv_heads=2", "attention=gqa"], 1, None),
    (["-m", "ffn=gelu,swiglu", "seed=0,1"], 2, None),  # one config per choice of the swept group, none per seed
    (["-m", "study=ffn"], 1 + 6, None),  # and one per choice its hydra.sweeper.params sweep (ffn: six of them)
    (["-m", "study=ffn", "ffn=gelu,swiglu"], 2, None),  # the command line's choices replace the params' (Hydra's)
    # a Hydra override that does not compose: Hydra's to report; the keys are checked on the config without it
    (["hydra/launcher=nope", "model.d_modl=3"], 2, "model.d_modl: unknown key (did you mean model.d_model?)"),
], ids=["good", "sweep", "study", "study-narrowed", "bad-hydra-override"])
def test_the_preflight_composes_once(monkeypatch, args, configs, error):
    """Every check reads one composition (zoo.training.preflight.compose_command), made once per command: counted
    at the one composing function and at Hydra's own, which every other way of composing goes through."""
    from hydra._internal.hydra import Hydra

    from zoo.cli import train
    from zoo.training import preflight as module

    commands, ours, hydras = [], [], []
    for owner, name, calls in ((train, "compose_command", commands), (module, "compose", ours),
                               (Hydra, "compose_config", hydras)):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _real=real, _calls=calls, **k: _calls.append(a) or _real(*a, **k))
    answer = train.preflight(args)
    assert answer is None if error is None else answer is not None and answer.startswith(error), answer
    assert (len(commands), len(ours), len(hydras)) == (1, configs, configs)



@pytest.mark.parametrize("args,answers", [
    ([], True), (["trainer.max_steps=3"], True), (["-m", "seed=0,1"], True),
    (["hydra.mode=MULTIRUN", "seed=0,1"], True), (["hydra.mode=RUN"], True), (["study=ffn"], True),
    (["experiment=nanogpt_cpu_fast"], True),
    (["-m", "ffn=gelu,swiglu"], False),  # each choice of a swept group may set it
    (["hydra/launcher=nope"], False),  # composed without that override: Hydra's to report
], ids=["defaults", "value", "sweep", "mode-multirun", "mode-run", "study", "experiment", "swept-group", "bad"])
def test_the_known_mode_is_hydras(args, answers):
    """train.py hands Hydra the run mode the pre-flight's composition holds, sparing Hydra's get_mode its own
    composition: it is the mode get_mode reads, or nothing where it may not be (Hydra then reads it itself)."""
    from zoo.cli import train
    from zoo.training.preflight import hydra_args

    composed = train.composition(args)
    known = train.known_mode(composed)
    if not answers:
        assert known is None
        return
    hydra = composed().hydra
    assert known == (hydra.get_mode(config_name="config", overrides=list(hydra_args(args).overrides)),)
