"""What a run records of its kernels (zoo.kernels): the banner's line, summary.json's cpu_kind, kernels_policy and
kernels, the checkpoint's record, and the line a resume says when the machine or the policy changed."""

import json

import pytest
import torch

import zoo.hardware as hw
from tests.helpers import compose_cfg
from zoo.kernels import build

LLAMA = ["norm=pre_rms", "position=rope", "logger=none", "sample.max_new_tokens=0", "threads=1"]


def test_a_cpu_run_names_its_kernels_and_cpu_kind(train, capsys):
    """A float32 CPU run of a model with RMSNorm and RoPE: their kernels under auto, none under kernels=none."""
    code, run_dir = train(LLAMA)
    summary = json.loads((run_dir / "summary.json").read_text())
    kernels = ["rmsnorm_cpp", "rope_cpp"] if build.compiler() else ["rmsnorm_cpu"]
    assert code == 0 and {k: summary[k] for k in ("cpu_kind", "kernels_policy", "kernels")} == {
        "cpu_kind": hw.cpu_kind(), "kernels_policy": "auto", "kernels": kernels}
    assert summary["cpu_isa"] == hw.instruction_set() and summary["cpu_isa"].split("+")[0] in (
        "default", "avx2", "avx512", "sve", "sve128", "sve256", "zvector", "vsx")  # torch's dispatch levels
    banner = capsys.readouterr().out.splitlines()
    assert f"kernels auto: {', '.join(kernels)} (CPU kind {hw.cpu_kind()})" in banner[:4], banner[:4]
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["callbacks"]["KernelsUsed"]
    assert saved == {"cpu_kind": hw.cpu_kind(), "kernels_policy": "auto", "kernels": kernels}
    code, run_dir = train([*LLAMA, "kernels=none"], name="none")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and (summary["kernels_policy"], summary["kernels"]) == ("none", [])


def test_a_resume_on_another_machine_says_what_changed(train, monkeypatch, capsys):
    code, run_dir = train(LLAMA)
    assert code == 0
    here = hw.cpu_kind()
    monkeypatch.setattr(hw, "cpu_kind", lambda: "amx")  # resumed elsewhere, with the formulas only
    capsys.readouterr()
    code, _ = train([*LLAMA, f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}", "kernels=none"], name="resumed")
    kernels = "rmsnorm_cpp, rope_cpp" if build.compiler() else "rmsnorm_cpu"
    assert code == 0
    assert (f"resumed on another machine or policy: CPU kind {here} -> amx; kernels {kernels} "
            "-> none") in capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("policy,said", [("[rope_cpp,rope]", "unknown kernel 'rope'"),
                                         ("7", "expected a name or a list of names, got 7")])
def test_a_bad_policy_is_one_line_before_any_data(tmp_path, capsys, policy, said):
    from zoo.kernels import KERNELS
    from zoo.training.runner import main

    assert main(compose_cfg([f"kernels={policy}", "data.path=/nonexistent"]), tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: kernels: {said}") and err.endswith(", ".join(KERNELS.names())) and "\n" not in err
