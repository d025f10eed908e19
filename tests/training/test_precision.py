"""trainer.precision=auto: bf16-mixed where the hardware computes bf16 natively, float32 elsewhere; the choice is
printed and recorded, an explicit precision is untouched, a resume keeps its checkpoint's, and float32 runs are
computed exactly as before (torch's default AdamW, the fused attention kernel)."""

import json
from pathlib import Path

import pytest
import torch

import zoo.hardware as hw
from tests.helpers import CONF, TINY, compose_cfg

AUTO = ["trainer.precision=auto", "logger=none", "sample.max_new_tokens=0", "threads=1"]


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to be a CPU of a kind: 'amx', 'avx512_bf16' or 'none'."""
    return lambda kind: monkeypatch.setattr(hw, "cpu_kind", lambda: kind)


@pytest.mark.parametrize("flags,kind", [({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, "amx"),
                                        ({"avx512f", "avx512_bf16"}, "avx512_bf16"), ({"avx2", "fma"}, "none")])
def test_the_cpu_kind_comes_from_its_flags(monkeypatch, flags, kind):
    monkeypatch.setattr(hw, "cpu_flags", lambda: frozenset(flags))
    assert hw.cpu_kind.__wrapped__() == kind


@pytest.mark.parametrize("kind,used", [("amx", "bf16-mixed"), ("avx512_bf16", "bf16-mixed"), ("none", "32-true")])
def test_auto_resolves_by_the_cpu(cpu, kind, used):
    cpu(kind)
    assert hw.resolve_precision({"accelerator": "cpu", "precision": "auto"}) == used
    for explicit in ("32-true", "bf16-mixed", "64-true"):  # an explicit precision is never changed
        assert hw.resolve_precision({"accelerator": "cpu", "precision": explicit}) == explicit


@pytest.mark.parametrize("native,used", [(True, "bf16-mixed"), (False, "32-true")])
def test_auto_resolves_by_the_gpu(monkeypatch, cpu, native, used):
    cpu("none")  # the GPU decides, not the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some GPU")
    assert hw.resolve_precision({"accelerator": "gpu", "precision": "auto"}) == used
    assert hw.resolve_precision({"accelerator": "auto", "precision": "auto"}) == used
    choice = hw.precision_choice({"accelerator": "gpu", "precision": "auto"})
    assert choice["reason"] == ("Some GPU computes bf16" if native else "no native bf16 here")


def test_a_resume_keeps_the_checkpoints_precision(cpu):
    cpu("amx")
    assert hw.resolve_precision({"precision": "auto"}, resumed="32-true") == "32-true"
    assert hw.resolve_precision({"precision": "bf16-mixed"}, resumed="32-true") == "bf16-mixed"  # explicit wins


def test_the_choice_is_printed_and_in_the_summary(train, cpu, capsys):
    cpu("amx")
    code, run_dir = train(AUTO)
    assert code == 0
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["precision"] == {"requested": "auto", "used": "bf16-mixed", "reason": "AMX computes bf16"}
    assert "precision bf16-mixed (auto: AMX computes bf16) on 1x cpu" in capsys.readouterr().out
    code, run_dir = train([*AUTO[1:], "trainer.precision=32-true"], name="pinned")  # explicit: no note
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["precision"] == {"requested": "32-true", "used": "32-true", "reason": "set in the config"}
    assert "precision 32-true on 1x cpu" in capsys.readouterr().out


def test_auto_without_native_bf16_is_float32_to_the_bit(train, cpu):
    """auto on a CPU without bf16 trains exactly as an explicit 32-true run: same kernels, same AdamW."""
    cpu("none")
    losses = []
    for name, precision in (("auto", "auto"), ("pinned", "32-true")):
        code, run_dir = train([*AUTO, f"trainer.precision={precision}"], name=name)
        s = json.loads((run_dir / "summary.json").read_text())
        assert code == 0 and s["precision"]["used"] == "32-true"
        losses.append([h["val_loss"] for h in s["history"]])
    assert losses[0] == losses[1]


def test_a_checkpoint_resumes_in_the_precision_it_trained_in(train, cpu, tmp_path, capsys):
    from zoo.training.runner import main

    cpu("amx")
    code, run_dir = train(AUTO)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert code == 0 and torch.load(ckpt, weights_only=True)["precision"] == "bf16-mixed"
    cpu("none")  # resumed on a machine where auto would pick float32
    code, again = train([*AUTO, f"ckpt_path={ckpt}"], name="resumed")
    s = json.loads((again / "summary.json").read_text())
    assert code == 0 and s["precision"]["used"] == "bf16-mixed" and "checkpoint" in s["precision"]["reason"]
    capsys.readouterr()
    cfg = compose_cfg(TINY + [*AUTO[1:], "trainer.precision=32-true", f"ckpt_path={ckpt}"])
    assert main(cfg, tmp_path / "explicit") == 2  # an explicit precision must be the one it trained in
    assert "(trainer.precision: checkpoint 'auto', this run '32-true')" in capsys.readouterr().err


def test_bf16_with_the_fused_adamw_still_clips_gradients(train):
    """Lightning refuses to clip for a fused optimizer under mixed precision; zoo clips bf16 gradients itself.
    Clipped to a norm of 1e-12, AdamW's steps shrink to lr * 1e-12 / eps and nothing is learned."""
    fast = ["trainer.precision=bf16-mixed", "logger=none", "sample.max_new_tokens=0", "optim.warmup_steps=0",
            "optim.lr=0.01", "trainer.max_steps=10", "trainer.val_check_interval=10"]
    losses = {}
    for clip in (1.0, 1e-12):
        code, run_dir = train([*fast, f"trainer.gradient_clip_val={clip}"], name=f"clip{clip}")
        assert code == 0
        losses[clip] = json.loads((run_dir / "summary.json").read_text())["final"]["val_loss"]
    assert losses[1e-12] > 4.3 > 3.9 > losses[1.0], losses  # ln(vocab ~100) = 4.6 at initialisation


def test_adamw_is_fused_on_cpu_in_bf16_only():
    from zoo.hardware import adamw_implementation

    cpu = torch.device("cpu")
    for precision in ("32-true", "32", 32, "64-true"):  # float32: torch's default, its results unchanged
        assert adamw_implementation(None, cpu, precision) == {}
    for precision in ("bf16-mixed", "bf16-true"):
        assert adamw_implementation(None, cpu, precision) == {"fused": True}
    assert adamw_implementation(False, cpu, "bf16-mixed") == {}  # optim.fused set: as set
    assert adamw_implementation(None, torch.device("cuda", 0), "32-true") == {"fused": True}  # CUDA: always


@pytest.mark.parametrize("study", sorted(p.stem for p in (Path(CONF) / "study").glob("*.yaml")))
def test_studies_pin_their_precision(study):
    """A study's numbers must be the same on every machine: not auto."""
    assert compose_cfg([f"study={study}"]).trainer.precision == "32-true"


def test_auto_is_the_default():
    assert compose_cfg([]).trainer.precision == "auto"


@pytest.mark.parametrize("recorded,error", [("8-bit", "trainer.precision: got '8-bit'"),
                                            ("16-mixed", "trainer.precision: '16-mixed' (float16) needs a GPU")])
def test_a_checkpoints_recorded_precision_is_checked_before_it_runs(train, tmp_path, capsys, recorded, error):
    from zoo.training.runner import main

    code, run_dir = train(AUTO)
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    torch.save({**ckpt, "precision": recorded}, tmp_path / "crafted.ckpt")
    capsys.readouterr()
    assert main(compose_cfg(TINY + [*AUTO, f"ckpt_path={tmp_path / 'crafted.ckpt'}"]), tmp_path / "again") == 2
    assert capsys.readouterr().err.startswith(f"error: {error}")
