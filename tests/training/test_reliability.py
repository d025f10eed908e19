"""Bad input, divergence, interruption and resume, determinism, safe loading."""

import csv
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests import zygote
from tests.helpers import TINY, TINY_TASK, compose_cfg
from zoo.registry import FFN
from zoo.training.cli import check_group_choices
from zoo.training.runner import main

ROOT = Path(__file__).resolve().parents[2]


def _text_file(tmp_path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


BAD_OVERRIDES = [  # (overrides, the start of the one-line error)
    (["model.d_model=33"], "model.d_model: 33 is not divisible by n_heads=2"),
    (["attention=gqa", "model.attention.n_kv_heads=3", "model.n_heads=4"], "model.attention.n_kv_heads: n_heads=4"),
    (["attention=gqa", "model.attention.n_kv_heads=0"], "model.attention.n_kv_heads: must be a positive"),
    (["position=rope", "model.d_model=36", "model.n_heads=4"], "model.position.name: rope needs an even head size"),
    (["model.max_seq_len=8"], "model.max_seq_len: 8 learned positions cannot cover"),
    (["model.attention.window=0"], "model.attention.window: must be a positive integer"),
    (["model.attention.window=-3"], "model.attention.window: must be a positive integer"),
    (["model.d_model=0"], "model.d_model: must be a positive integer"),
    (["model.n_layers=-1"], "model.n_layers: must be a positive integer"),
    (["model.n_heads=0"], "model.n_heads: must be a positive integer"),
    (["model.ffn.d_ff=-4"], "model.ffn.d_ff: must be a positive integer"),
    (["model.dropout=1.0"], "model.dropout: must be in [0, 1)"),
    (["model.dropout=-0.1"], "model.dropout: must be in [0, 1)"),
    (["model.attention.backend=flash"], "model.attention.backend: unknown 'flash'; valid: sdpa, math"),
    (["model.attention.name=flash"], "model.attention.name: unknown attention 'flash'; valid: attention_on_attention"),
    (["model.position.name=rotary"], "model.position.name: unknown position 'rotary'; valid: alibi"),
    (["model.norm.type=batchnorm"], "model.norm.type: unknown norm 'batchnorm'; valid: layernorm, rmsnorm"),
    (["model.norm.placement=middle"], "model.norm.placement: unknown residual 'middle'; valid: fixup, gated"),
    (["model.ffn.name=swish"], "model.ffn.name: unknown ffn 'swish'; valid: elu, geglu"),
    (["model.name=gpt"], "model.name: unknown model 'gpt'; valid: decoder_only"),
    (["model.norm.eps=0"], "model.norm.eps: must be positive"),
    (["data=text_file", "data.path=/no/such/file.txt"], "data.path: no such file '/no/such/file.txt'"),
    (["data.tokenizer=wordpiece"], "tokenizer: unknown 'wordpiece'; valid: bpe, byte, char"),
    (["data=addition", "model=encoder_only"], "data.task: encoder_only fills the target positions"),
    (["data=copy", "data.task=foo"], "task: unknown 'foo'; valid: addition, copy, reverse, sort"),
    (["trainer.max_steps=0"], "trainer.max_steps: must be a positive integer"),
    (["threads=0"], "threads: must be a positive integer or null"),
    (["data.long_context=-5"], "data.long_context: must be a positive integer"),
    (["data.val_fraction=1.5"], "data.val_fraction: must be between 0 and 1"),
    (["data.context=0"], "data.context: must be a positive integer"),
    (["data.batch_size=-2"], "data.batch_size: must be a positive integer"),
    (["ckpt_path=/no/such.ckpt"], "ckpt_path: no checkpoint at '/no/such.ckpt'"),
    (["+logger.evil._target_=os.system", "+logger.evil.command=true"],
     "logger.evil._target_: 'os.system' is not allowed"),
]


@pytest.mark.parametrize("overrides,error", BAD_OVERRIDES, ids=lambda x: str(x)[:60])
def test_bad_config_stops_before_training_with_one_line(overrides, error, tmp_path, capsys):
    task = any(o in ("data=copy", "data=addition") for o in overrides)
    cfg = compose_cfg((TINY_TASK if task else TINY) + overrides)
    code = main(cfg, tmp_path)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"error: {error}") and "\n" not in err, err
    assert not (tmp_path / "checkpoints").exists()  # nothing trained


@pytest.mark.parametrize("name,content,error", [
    ("empty.txt", b"", "is empty"),
    ("blank.txt", b"   \n\n", "is empty"),
    ("latin1.txt", "caf\u00e9 ".encode("latin-1") * 50, "is not valid UTF-8 (byte 3)"),
    ("short.txt", b"to be or not to be\n", "too short for one window"),
])
def test_bad_data_files(name, content, error, tmp_path, capsys):
    path = _text_file(tmp_path, name, content)
    cfg = compose_cfg(TINY + ["data=text_file", f"data.path={path}"])
    assert main(cfg, tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert error in err and "\n" not in err, err


@pytest.mark.parametrize("arg", ["attention=flash", "position=rotary", "norm=layer", "ffn=swish", "model=gpt",
                                 "data=wikipedia", "trainer=tpu", "logger=neptune", "experiment=gpt5"])
def test_unknown_group_option_is_one_line_listing_choices(arg):
    group, choice = arg.split("=")
    msg = check_group_choices([arg], ROOT / "conf")
    hint = " (did you mean gpu?)" if arg == "trainer=tpu" else ""  # a close name is offered
    assert msg.startswith(f"{group}: unknown option '{choice}'{hint}; valid: ") and "\n" not in msg


def test_unknown_group_option_through_train_py():
    proc = zygote.run([sys.executable, "train.py", "-m", "ffn=relu,swish"], cwd=ROOT, capture_output=True,
                      text=True, timeout=600)
    assert proc.returncode == 2
    valid = ", ".join(FFN.names())  # the registered FFNs: each is an option of the ffn group
    assert proc.stderr.strip() == f"error: ffn: unknown option 'swish'; valid: {valid}"


def test_encoder_only_cannot_generate(tmp_path, capsys):
    from zoo.sample import main as sample_main
    from zoo.training import run

    assert run(compose_cfg(TINY + ["model=encoder_only", "logger=none"]), run_dir=tmp_path) == 0
    capsys.readouterr()
    assert sample_main([str(tmp_path / "checkpoints" / "last.ckpt")]) == 2
    assert "does not generate" in capsys.readouterr().err


def _train_py(tmp_path: Path, *overrides: str, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "train.py", *TINY, "logger=csv", f"hydra.run.dir={tmp_path}", *overrides]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_divergence_stops_writes_summary_and_exits_3(tmp_path):
    proc = _train_py(tmp_path, "norm=post_ln", "optim.lr=1e6", "optim.warmup_steps=0", "trainer.max_steps=200",
                     "trainer.gradient_clip_val=null", "model.init_std=3.0")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 3, err[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["diverged"] is True and s["status"] == "diverged"
    assert s["diverged_step"] is not None and s["steps"] <= s["diverged_step"] + 2 < 200


def _val_losses(run_dir: Path) -> list[float]:
    with (run_dir / "metrics.csv").open() as f:
        return [float(r["val_loss"]) for r in csv.DictReader(f) if r.get("val_loss")]


def test_same_seed_same_metrics(tmp_path):
    from zoo.training import run

    for name in ("a", "b"):
        assert run(compose_cfg(TINY + ["trainer.max_steps=6", "model.dropout=0.1", "trainer.deterministic=true"]),
                   run_dir=tmp_path / name) == 0
    assert _val_losses(tmp_path / "a") == _val_losses(tmp_path / "b")
    assert run(compose_cfg(TINY + ["trainer.max_steps=6", "model.dropout=0.1", "seed=1"]), run_dir=tmp_path / "c") == 0
    assert _val_losses(tmp_path / "a") != _val_losses(tmp_path / "c")


INTERRUPTIBLE = ["trainer.max_steps=300", "trainer.val_check_interval=50", "model.dropout=0.1",
                 "trainer.deterministic=true", "data.eval_batches=4"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    full = _train_py(run_dir, *INTERRUPTIBLE)
    assert full.wait(timeout=600) == 0, full.stderr.read()[-2000:]
    return run_dir


def _val_by_step(run_dir: Path) -> dict[int, float]:
    with (run_dir / "metrics.csv").open() as f:
        return {int(r["step"]): float(r["val_loss"]) for r in csv.DictReader(f) if r.get("val_loss")}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_interrupt_then_resume_equals_uninterrupted(tmp_path, sig, uninterrupted):
    part = _train_py(tmp_path, *INTERRUPTIBLE)
    deadline = time.time() + 240
    while not (tmp_path / "checkpoints" / "best.ckpt").exists():  # the first evaluation, step 50
        assert part.poll() is None and time.time() < deadline, "run ended before it could be interrupted"
        time.sleep(0.05)
    part.send_signal(sig)
    out, err = part.communicate(timeout=600)
    assert part.returncode == 130, err[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "interrupted" and 50 <= s["steps"] < 300
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == s["steps"]

    # the run says how to resume it: the same overrides, ckpt_path=last, the same directory
    command = next(line for line in out.splitlines() if line.startswith("resume with: ")).removeprefix("resume with: ")
    args = shlex.split(command)
    assert args[:2] == ["python", "train.py"] and args[-2:] == ["ckpt_path=last", f"hydra.run.dir={tmp_path}"]
    resumed = subprocess.Popen([sys.executable, *args[1:]], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    rout, rerr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, rerr[-2000:]
    assert f"| {s['steps']}/300 [" in rout and "Epoch" not in rout  # the bar counts steps, from the restored one
    a = json.loads((uninterrupted / "summary.json").read_text())
    b = json.loads((tmp_path / "summary.json").read_text())
    assert b["steps"] == a["steps"] == 300 and b["status"] == "completed"
    assert b["final"]["val_loss"] == pytest.approx(a["final"]["val_loss"], abs=1e-6)
    assert b["tokens_seen"] == a["tokens_seen"]
    full, resumed_vals = _val_by_step(uninterrupted), _val_by_step(tmp_path)
    assert set(full) <= set(resumed_vals)  # plus the evaluation made when the signal arrived
    assert [resumed_vals[k] for k in sorted(full)] == pytest.approx([full[k] for k in sorted(full)], abs=1e-6)


def _history(run_dir: Path, before_step: int | None = None) -> list[dict]:
    """metrics.csv's rows, without the timing column (tok/s differs between runs)."""
    with (run_dir / "metrics.csv").open() as f:
        rows = [{k: float(v) for k, v in r.items() if v and k != "tok/s"} for r in csv.DictReader(f)]
    return [r for r in rows if before_step is None or r["step"] < before_step]


def _same_history(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and x == pytest.approx(y, abs=1e-6)
                                    for x, y in zip(a, b, strict=True))


def _kill_when(proc: subprocess.Popen, ready, deadline: float) -> None:
    while not ready() and proc.poll() is None:
        assert time.time() < deadline, "the moment to kill never came"
        time.sleep(0.01)
    proc.kill()
    proc.communicate(timeout=120)


@pytest.mark.slow
def test_history_survives_kills_at_any_moment_including_during_resumes(tmp_path, uninterrupted):
    """SIGKILL the run after its first checkpoint, then each resume at another moment (at once, while it
    loads, after it has trained a while, right after it saved a checkpoint): every row up to the last
    checkpoint's step is always on disk, and the run resumed to the end has an uninterrupted run's history."""
    last = tmp_path / "checkpoints" / "last.ckpt"
    full = _history(uninterrupted)
    _kill_when(_train_py(tmp_path, *INTERRUPTIBLE), last.exists, time.time() + 240)
    moments = [lambda: True, lambda: time.time() > t0 + 2, lambda: time.time() > t0 + 6]
    saved_at = []
    moments.append(lambda: last.stat().st_mtime_ns != saved_at[0])  # a new checkpoint was written
    for moment in moments:
        saved_at[:] = [last.stat().st_mtime_ns]
        t0 = time.time()
        _kill_when(_train_py(tmp_path, *INTERRUPTIBLE, "ckpt_path=last"), moment, time.time() + 240)
        step = torch.load(last, weights_only=True)["global_step"]
        on_disk = _history(tmp_path, before_step=step)
        assert _same_history(on_disk, [r for r in full if r["step"] < step]), (step, len(on_disk))
    resumed = _train_py(tmp_path, *INTERRUPTIBLE, "ckpt_path=last")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()[-2000:]
    assert _same_history(_history(tmp_path), full)


def test_checkpoint_with_a_pickled_object_is_refused(tmp_path, capsys):
    from zoo.sample import main as sample_main
    from zoo.training import run

    assert run(compose_cfg(TINY + ["logger=none"]), run_dir=tmp_path) == 0
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["payload"] = os.system  # unpickling this would import and hand out os.system
    torch.save(ckpt, tmp_path / "evil.ckpt")
    capsys.readouterr()
    assert sample_main([str(tmp_path / "evil.ckpt")]) == 2
    err = capsys.readouterr().err
    assert "refusing to unpickle" in err and err.count("\n") == 1
    cfg = compose_cfg(TINY + ["logger=none", f"ckpt_path={tmp_path / 'evil.ckpt'}"])
    assert main(cfg, tmp_path / "resume") == 2
    assert "refusing to unpickle" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupted_checkpoint_gives_a_clear_error(tmp_path, capsys, damage):
    from zoo.training import run
    from zoo.training.checkpoint import CheckpointError, load_checkpoint

    assert run(compose_cfg(TINY + ["logger=none"]), run_dir=tmp_path) == 0
    data = (tmp_path / "checkpoints" / "last.ckpt").read_bytes()
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"not a checkpoint" * 10)
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_checkpoint(bad)


def test_checkpoint_naming_an_unknown_component_is_refused(tmp_path):
    from zoo.build import ConfigError
    from zoo.training import run
    from zoo.training.checkpoint import load_checkpoint

    assert run(compose_cfg(TINY + ["logger=none"]), run_dir=tmp_path) == 0
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["hyper_parameters"]["cfg"]["model"]["ffn"]["name"] = "os.system"
    torch.save(ckpt, tmp_path / "odd.ckpt")
    with pytest.raises(ConfigError, match="unknown ffn 'os.system'; valid:"):
        load_checkpoint(tmp_path / "odd.ckpt")


def test_resume_with_another_architecture_is_refused(tmp_path, capsys):
    from zoo.training import run

    assert run(compose_cfg(TINY + ["logger=none"]), run_dir=tmp_path) == 0
    cfg = compose_cfg(TINY + ["logger=none", "ffn=swiglu", "ckpt_path=last"])
    assert main(cfg, tmp_path) == 2
    assert "holds a different architecture (model.ffn.name: checkpoint 'gelu', this run 'swiglu')" in \
        capsys.readouterr().err


def test_failed_and_diverged_runs_do_not_stop_the_sweep_and_the_report_counts_them(tmp_path):
    cmd = [sys.executable, "train.py", "-m", *TINY, "logger=csv", "model.d_model=32,33", "optim.lr=1e-3,1e6",
           "norm=post_ln", "model.init_std=3.0", "optim.warmup_steps=0", "trainer.gradient_clip_val=null",
           "trainer.max_steps=20", "trainer.val_check_interval=10", f"hydra.sweep.dir={tmp_path}"]
    proc = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summaries = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*/summary.json"))]
    statuses = sorted(s["status"] for s in summaries)
    assert statuses == ["completed", "diverged", "failed", "failed"], statuses
    diverged = next(s for s in summaries if s["status"] == "diverged")
    lr = next(float(o.split("=")[1]) for o in diverged["overrides"] if o.startswith("optim.lr="))
    assert diverged["diverged_step"] < 20 and lr == 1e6

    from zoo.report import main as report_main

    assert report_main([str(tmp_path)]) == 0
    lines = [" ".join(line.split()) for line in (tmp_path / "report.md").read_text().splitlines()]  # cell padding
    row = next(line for line in lines if line.startswith("| 32 | 1000000.0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-2:] == ["1", "0"]  # diverged, failed
    assert any(line.startswith("| 33 |") and line.endswith("| 0 | 1 |") for line in lines)


def test_writes_are_atomic(tmp_path, monkeypatch):
    """An interruption while writing leaves the previous file intact, never half a file."""
    from zoo.io import atomic_write_json

    path = tmp_path / "summary.json"
    atomic_write_json(path, {"ok": 1})

    class Boom(Exception):
        pass

    def explode(f):
        f.write('{"half": ')
        raise Boom

    from zoo.io import atomic_write

    with pytest.raises(Boom):
        atomic_write(path, explode)
    assert json.loads(path.read_text()) == {"ok": 1} and list(tmp_path.iterdir()) == [path]


def test_quick_exit_still_runs_finalizers_and_exit_handlers(tmp_path):
    """collect_once_at_exit skips shutdown's walk over live objects, not what a program leaves to run at exit:
    an object in a reference cycle, garbage before exit, is still finalized, and an exit handler registered
    later (as loggers register theirs) still runs."""
    script = tmp_path / "prog.py"
    script.write_text(
        "import atexit\n"
        "from zoo.io import collect_once_at_exit\n"
        "collect_once_at_exit()\n"
        f"path = {str(tmp_path)!r}\n"
        "class Cycle:\n"
        "    def __init__(self):\n"
        "        self.me = self\n"
        "    def __del__(self):\n"
        "        with open(path + '/finalized.txt', 'w') as f:\n"
        "            f.write('yes')\n"
        "import gc; gc.disable()\n"  # so only the exit's collection can find the cycle
        "Cycle()\n"
        "atexit.register(lambda: open(path + '/handler.txt', 'w').write('ran'))\n")
    zygote.run([sys.executable, str(script)], check=True, timeout=60, cwd=Path(__file__).parents[2])
    assert (tmp_path / "finalized.txt").read_text() == "yes"
    assert (tmp_path / "handler.txt").read_text() == "ran"


def test_quick_exit_freezes_what_is_alive():
    """At exit, after the collection, every live object is in the permanent generation, which shutdown's
    collections do not visit."""
    import gc

    from zoo.io import _collect_then_freeze

    try:
        _collect_then_freeze()
        assert gc.get_freeze_count() > 10_000  # pytest and torch alone keep far more alive
    finally:
        gc.unfreeze()


def test_resume_gc_collects_what_loading_left_and_freezes_the_rest_once(tmp_path):
    """pause_gc_while_loading/resume_gc: garbage left while the collector was off is finalized at the resume, the
    survivors are frozen, and a second resume (a second run in one process) freezes nothing more."""
    script = tmp_path / "prog.py"
    script.write_text(
        "import gc\n"
        "from zoo.io import pause_gc_while_loading, resume_gc\n"
        "class Cycle:\n"
        "    def __init__(self):\n"
        "        self.me = self\n"
        "    def __del__(self):\n"
        "        print('finalized')\n"
        "pause_gc_while_loading()\n"
        "assert not gc.isenabled()\n"
        "Cycle()\n"
        "resume_gc()\n"
        "frozen = gc.get_freeze_count()\n"
        "print('enabled', gc.isenabled(), frozen > 1000)\n"
        "keep = [Cycle() for _ in range(100)]\n"
        "resume_gc()\n"
        "print('second', gc.get_freeze_count() == frozen)\n"
        "keep.clear(); gc.unfreeze()\n")
    out = zygote.run([sys.executable, str(script)], check=True, timeout=60, capture_output=True, text=True,
                     cwd=ROOT).stdout.split("\n")
    assert out[:3] == ["finalized", "enabled True True", "second True"], out


@pytest.mark.parametrize("mode", [[], ["-m", "seed=0,1"]], ids=["run", "multirun"])
def test_train_py_imports_with_the_collector_off_and_trains_with_it_on(tmp_path, mode):
    """train.py pauses the collector until torch and Lightning are in (no full collections while they load),
    then trains with it on and the start-up's objects frozen; a sweep's own process switches it back on before
    the launcher starts (a parallel launcher's parent never reaches the task function)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import gc, runpy, sys\n"
        "import zoo.io, zoo.training\n"
        "resume_gc = zoo.io.resume_gc\n"
        "def resume():\n"
        "    print('RESUME', gc.isenabled(), 'lightning' in sys.modules)\n"
        "    resume_gc()\n"
        "zoo.io.resume_gc = resume\n"
        "def train(cfg):\n"
        "    print('PROBE', gc.isenabled(), 'lightning' in sys.modules, gc.get_freeze_count() > 10_000,\n"
        "          gc.get_stats()[2]['collections'])\n"
        "    return 0\n"
        "zoo.training.main = train\n"  # what train.py's main() calls, after its imports
        "sys.argv = ['train.py', *sys.argv[1:]]\n"
        "runpy.run_path('train.py', run_name='__main__')\n")
    # a new interpreter, not tests/zygote.py's fork: what it checks happens while the imports run
    out = subprocess.run([sys.executable, str(probe), *mode, "debug=fast", f"hydra.run.dir={tmp_path / 'run'}",
                          f"hydra.sweep.dir={tmp_path / 'sweep'}"], timeout=120, capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "WANDB_MODE": "offline"})
    lines = [line.split() for line in out.stdout.splitlines() if line.startswith(("RESUME", "PROBE"))]
    probes = [line[1:] for line in lines if line[0] == "PROBE"]
    assert len(probes) == (2 if mode else 1), out.stdout + out.stderr
    # the first resume finds the collector off; in a run Lightning is in by then, in a sweep it is not yet
    assert lines[0] == ["RESUME", "False", "False" if mode else "True"], lines
    for enabled, lightning, frozen, full_collections in probes:
        assert (enabled, lightning, frozen) == ("True", "True", "True")
        if not mode:  # only resume_gc's own collection; importing Lightning with the collector on makes 6-7
            assert int(full_collections) <= 1, full_collections


# --- a signal at every point of a run: one record --------------------------------------------------------------

SIGNAL_RUN = [*TINY, "trainer.max_steps=6", "trainer.val_check_interval=2", "logger=csv", "threads=1",
              "sample.max_new_tokens=0", "checkpoints=all"]


def _send_sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread: the handler runs before the next line


def _inject(monkeypatch, point: str) -> None:
    """Send SIGTERM to this process at `point` of a 6-step run evaluated every 2 steps."""
    from zoo.training.checkpoint_io import AtomicCheckpointIO
    from zoo.training.data import ZooData
    from zoo.training.module import ZooModule
    from zoo.training.summary import Summary

    def before(cls, name: str, when) -> None:
        original = getattr(cls, name)

        def wrapped(self, *args, **kwargs):
            if when(self, *args):
                _send_sigterm()
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, wrapped)

    step = lambda at: lambda self, *a: self.trainer.global_step == at  # noqa: E731
    saving = lambda at: lambda self, ckpt, *a: ckpt["global_step"] == at  # noqa: E731
    once = lambda self, *a: True  # noqa: E731
    {"the fit's start": lambda: before(ZooData, "train_dataloader", once),
     "a step": lambda: before(ZooModule, "training_step", step(2)),  # the third step
     "a validation": lambda: before(ZooModule, "validation_step", step(2)),
     "a checkpoint write": lambda: before(AtomicCheckpointIO, "save_checkpoint", saving(2)),
     "the last step": lambda: before(ZooModule, "training_step", step(5)),
     "the final validation": lambda: before(ZooModule, "validation_step", step(6)),
     "the final save": lambda: before(AtomicCheckpointIO, "save_checkpoint", saving(6)),
     "the summary write": lambda: before(Summary, "write", once)}[point]()


def _record(run_dir: Path) -> tuple[str, int, int, list[int]]:
    """(summary's status, its steps, last.ckpt's step, the steps of metrics.csv's training rows)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    with (run_dir / "metrics.csv").open() as f:
        trained = [int(r["step"]) + 1 for r in csv.DictReader(f) if r.get("train_loss")]  # Lightning's 0-based
    return summary["status"], summary["steps"], ckpt, trained


SIGNAL_POINTS = [  # (where the signal arrives, the status, the step every file then says)
    ("the fit's start", "interrupted", 1),
    ("a step", "interrupted", 3),
    ("a validation", "interrupted", 3),
    ("a checkpoint write", "interrupted", 3),
    ("the last step", "completed", 6),  # nothing is left to stop: the run finishes
    ("the final validation", "completed", 6),
    ("the final save", "completed", 6),
    ("the summary write", "completed", 6),
]


def test_reliability_md_names_the_signal_points_tested():
    """docs/reliability.md's list of the points a signal is tested at is this table's, in its order."""
    text = " ".join((ROOT / "docs" / "reliability.md").read_text().split())
    listed = re.search(r"hook at (\w+) points \(([^)]*)\)", text)
    assert listed, "docs/reliability.md no longer says where the signal is tested"
    assert listed.group(2).split(", ") == [p[0] for p in SIGNAL_POINTS]
    assert listed.group(1) == ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                               "ten"][len(SIGNAL_POINTS) - 1]


@pytest.mark.parametrize(("point", "status", "step"), SIGNAL_POINTS, ids=[p[0] for p in SIGNAL_POINTS])
def test_a_signal_at_any_point_leaves_one_record_and_resuming_completes_it(tmp_path, monkeypatch, capsys, point,
                                                                           status, step):
    """SIGTERM sent at each point of a run (a hook calls it there, no timing): the summary, last.ckpt and
    metrics.csv all say the same step; an interrupted run resumed ends with each step's row exactly once."""
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        _inject(m, point)
        code = main(compose_cfg(SIGNAL_RUN), run_dir)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the run's handler is gone with it
    assert code == (130 if status == "interrupted" else 0), capsys.readouterr().err[-2000:]
    assert _record(run_dir) == (status, step, step, list(range(1, step + 1)))
    if status == "interrupted":
        assert main(compose_cfg([*SIGNAL_RUN, "ckpt_path=last"]), run_dir) == 0
        assert _record(run_dir) == ("completed", 6, 6, [1, 2, 3, 4, 5, 6])
    else:
        assert "stop asked (SIGTERM) after the last step" in capsys.readouterr().out


def test_resuming_a_finished_run_from_an_earlier_checkpoint_is_refused_and_loses_nothing(tmp_path, capsys):
    """The state the issue found on a loaded machine (summary.json completed at the last step, last.ckpt earlier):
    a resume would trim metrics.csv back to the checkpoint; it is refused in one line, every file as it was."""
    run_dir = tmp_path / "run"
    assert main(compose_cfg(SIGNAL_RUN), run_dir) == 0
    last = run_dir / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    torch.save({**ckpt, "global_step": 2}, last)
    before = {p.name: p.read_bytes() for p in (*run_dir.iterdir(), last) if p.is_file() and p.name != "run.lock"}
    capsys.readouterr()
    assert main(compose_cfg([*SIGNAL_RUN, "ckpt_path=last"]), run_dir) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: ckpt_path: '{run_dir}' finished (completed, summary.json) at step 6, after its last "
                   "checkpoint (step 2); resuming would drop the history of the steps between; valid: keep the run "
                   "as it is, or overwrite=true to train it again"), err
    assert {p.name: p.read_bytes() for p in (*run_dir.iterdir(), last) if p.is_file() and p.name != "run.lock"} \
        == before


def test_a_resume_that_dies_keeps_the_rows_it_had_not_redone(tmp_path, monkeypatch, capsys):
    """Killed after step 6 while its last checkpoint was at step 4 (metrics.csv holds steps 1-6, no summary), then
    resumed, and the resume dies in its first step: the rows of steps 5 and 6 are still there. Resumed again to
    the end, each step's row is there once, with the values of the run that was never stopped."""
    from zoo.training.checkpoint_io import AtomicCheckpointIO
    from zoo.training.module import ZooModule

    full, run_dir = tmp_path / "full", tmp_path / "run"
    assert main(compose_cfg(SIGNAL_RUN), full) == 0
    original = AtomicCheckpointIO.save_checkpoint

    def keep_step_4(self, checkpoint, path, storage_options=None):
        original(self, checkpoint, path, storage_options)
        if checkpoint["global_step"] == 4 and Path(path).name == "last.ckpt":
            Path(path).with_name("at4.ckpt").write_bytes(Path(path).read_bytes())

    with monkeypatch.context() as m:
        m.setattr(AtomicCheckpointIO, "save_checkpoint", keep_step_4)
        assert main(compose_cfg(SIGNAL_RUN), run_dir) == 0
    (run_dir / "checkpoints" / "at4.ckpt").replace(run_dir / "checkpoints" / "last.ckpt")
    (run_dir / "summary.json").unlink()  # as if killed before the step-6 checkpoint and the summary
    before = _history(run_dir)
    assert _same_history(before, _history(full))

    def dies(self, batch, batch_idx):
        raise RuntimeError("the machine went down")

    with monkeypatch.context() as m:
        m.setattr(ZooModule, "training_step", dies)
        assert main(compose_cfg([*SIGNAL_RUN, "ckpt_path=last"]), run_dir) == 1
    assert _same_history(_history(run_dir), before)  # nothing redone, nothing lost
    assert main(compose_cfg([*SIGNAL_RUN, "ckpt_path=last"]), run_dir) == 0
    assert _record(run_dir) == ("completed", 6, 6, [1, 2, 3, 4, 5, 6])
    assert _same_history(_history(run_dir), _history(full))
