"""zoo.convert.from_pretrained's memory on a safetensors directory, measured in fresh processes (zoo.bench's probe),
and the bench section that reports it."""

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from zoo import bench  # noqa: E402
from zoo.bench.processes import run_probe  # noqa: E402
from zoo.bench.sections import convert  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc for the RSS")


def probe(directory: Path, path: str) -> dict:
    r = run_probe(["--convert-probe", f"{path}:{directory}"], bench.Settings(threads=1), timeout=600)
    assert isinstance(r, dict), r  # else the child's last error line
    return r


@pytest.mark.slow
def test_direct_conversion_peaks_within_1_3x_the_weights_and_transformers_path_does_not(tmp_path):
    """The promise on a ~120M-parameter Llama in bf16 (250 MB): the direct path's peak RSS growth is at most
    1.3x the weights; transformers + convert holds both models (about 2x), so the probe can tell them apart."""
    model = convert.random_llama("small")
    size_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    convert.save_random_llama(model, tmp_path, shard="100MB")
    del model
    ratios = {}
    for path in convert.CONVERT_PATHS:
        r = probe(tmp_path, path)
        assert r["dtypes"] == ["bfloat16"]
        ratios[path] = (r["peak_mib"] - r["baseline_mib"]) / size_mib
    print(f"growth / weights of {size_mib:.0f} MiB: {ratios}")
    assert ratios["direct"] <= 1.3, ratios
    assert ratios["transformers"] >= 1.7, ratios


def test_probe_converts_by_both_paths_in_bf16(tmp_path):
    """The probe's own code, in this process (its RSS numbers mean something only in a fresh one)."""
    model = convert.random_llama("tiny")
    params = sum(p.numel() for p in model.parameters())
    convert.save_random_llama(model, tmp_path, shard="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    for path in convert.CONVERT_PATHS:
        r = convert.convert_probe(str(tmp_path), path)
        assert r["dtypes"] == ["bfloat16"] and r["params"] == params
        assert r["hwm_mib"] >= r["baseline_mib"] > 0 and r["maxrss_mib"] > 0 and r["wall_s"] > 0
        assert r["peak_mib"] == r["hwm_mib"]  # VmHWM, reset before converting (Linux)
        assert r["anon_growth_mib"] >= 0 and r["file_growth_mib"] >= 0  # sampled peaks over their baselines


@pytest.mark.slow
def test_convert_section_reports_both_paths():
    s = bench.Settings.quick_run(threads=1)
    md = convert.section_convert(bench.Session(s))
    assert md.startswith("## Conversion from safetensors")
    rows = [ln.split("|")[1:-1] for ln in md.splitlines() if ln.startswith("| direct") or ln.startswith("| transf")]
    assert [r[0].strip() for r in rows] == ["direct", "transformers"], md
    params = sum(p.numel() for p in convert.random_llama("tiny").parameters())
    for r in rows:
        assert r[8].strip() == "bfloat16" and int(r[9]) == params, md
    assert "Quick run" in md
