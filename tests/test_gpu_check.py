"""scripts/gpu_check.py's steps at toy sizes on CPU (the GPU run itself needs a GPU), and its refusals without one."""

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch

from zoo import bench
from zoo.build import ConfigError
from zoo.layers.attention import KVCache
from zoo.registry import MODEL

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)
NO_GPU = not torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("lineage", MODEL.names())
def test_every_lineage_trains_a_few_steps(tmp_path, lineage):
    results = gpu_check.check_train("cpu", tiny=True, compile_=False, out=tmp_path, lineages=[lineage])
    assert [r["lineage"] for r in results] == [lineage]
    for r in results:
        assert r["ok"] and r["steps"] == 2 and 0 < r["val_loss"] < 10, r
        summary = json.loads((tmp_path / "runs" / r["lineage"] / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["model"]["name"] == r["lineage"]


def test_generation_check_passes_and_catches_a_cache_that_forgets(monkeypatch):
    results = gpu_check.check_generate("cpu", tiny=True)
    assert len(results) == 10 and all(r["ok"] for r in results), [r for r in results if not r["ok"]]
    append = KVCache.append

    def forgetful(self, *xs):  # the past comes back as zeros: decoding no longer sees it
        t = xs[0].shape[2]
        return tuple(torch.cat([torch.zeros_like(x[:, :, :-t]), x[:, :, -t:]], dim=2) for x in append(self, *xs))

    monkeypatch.setattr(KVCache, "append", forgetful)
    broken = gpu_check.check_generate("cpu", tiny=True)
    assert not any(r["ok"] for r in broken)
    assert min(r["logits_rel_diff"] for r in broken) > 0.5


def test_mfu_step_reports_every_mode(tmp_path):
    rows, md = gpu_check.check_mfu("cpu", tiny=True, out=tmp_path)
    assert {(r["family"], r["mode"]) for r in rows} == {(f, m) for f in ("gpt2", "llama")
                                                         for m in ("fp32 eager", "bf16 eager")}
    assert all(r["ok"] and r["step_s"] > 0 and 0 < r["mfu"] < 1 for r in rows)
    assert (tmp_path / "mfu.md").read_text() == md and "| tiny | GPT-2 style | bf16 eager |" in md


def test_summary_names_every_figure(tmp_path):
    results = {"generate": [{"case": "decoder_only/mha/rope", "ok": True, "logits_rel_diff": 0.01,
                             "greedy_equal": True, "tie_margin": None}],
               "mfu": [{"shape": "gpt2_small", "family": "gpt2", "mode": "bf16 compile", "step_s": 0.05,
                        "tokens_per_s": 245760.0, "achieved": 4.2e14, "mfu": 0.6, "mfu_datasheet": 0.42}]}
    lines = gpu_check.summary_lines("NVIDIA H200", results)
    assert "1/1 cases match" in lines[1]
    assert lines[2] == ("MFU gpt2_small gpt2 bf16 compile: 50.0 ms/step, 245760 tok/s, 420.0 TFLOP/s, 60.0% of the "
                        "measured matmul peak, 42.0% of the datasheet peak")
    assert gpu_check.datasheet_peak("NVIDIA H100 PCIe") == 756 and gpu_check.datasheet_peak("NVIDIA H200") == 989


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_refused_politely_without_a_gpu(capsys):
    assert gpu_check.main(["--device", "cuda"]) == 2
    assert "needs a CUDA GPU, and this machine has none; valid here: cpu" in capsys.readouterr().err
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and "--device cpu --tiny" in proc.stderr
    with pytest.raises(ConfigError, match="--device: 'cuda' but this machine has no CUDA GPU; valid here: cpu"):
        bench.settings_from_args(bench.parse_args(["--device", "cuda", "--only", "mfu"]))
