"""The GPU and cluster rung as far as a CPU goes: trainer=gpu's defaults (TF32 on CUDA only, fused AdamW on
CUDA), experiment=gpt2_small's 124M model on a prepared corpus, DDP ranks drawing different batches from token
files in a real two-process run, FSDP refused on CPU in one line, the SLURM launcher following num_nodes."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.helpers import compose_cfg, save_pretrained_tokenizer, write_corpus
from zoo import count_params
from zoo.build import ConfigError
from zoo.commands import config_dir
from zoo.config.plan import plan
from zoo.hardware import adamw_implementation, resolve_precision
from zoo.prepare import prepare
from zoo.training.data import StepLoader, build_data
from zoo.training.objectives import OBJECTIVE
from zoo.training.runner import tf32_matmuls

ROOT = Path(__file__).resolve().parents[2]


def _tiny_plan():
    """A small run's plan, as the run makes it: context 16, d_model 32, one layer of two heads."""
    over = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.context=16", "data.eval_batches=1"]
    return plan(OmegaConf.to_container(compose_cfg(over), resolve=True), build_data)[0]
GPT2_SMALL = 124_439_808  # GPT-2 small's parameters (tied head, 50,257 ids), as Hugging Face counts them


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """A small corpus prepared with a byte-level BPE saved the way a downloaded GPT-2 tokenizer is."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("gpu")
    files = [str(p) for p in write_corpus(root / "text")]
    tok = save_pretrained_tokenizer(root / "tokenizer")
    prepare(files, root / "tokens", f"hf:{tok}", sample_by="paragraph", val_fraction=0.1, workers=1, progress=False)
    return str(root / "tokens")


def test_trainer_gpu_defaults(monkeypatch):
    cfg = compose_cfg(["trainer=gpu"])
    assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "auto"
    # auto: bf16-mixed on a GPU that computes bf16 natively, float32 on one that does not (V100, T4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100")
    for native, expected in ((True, "bf16-mixed"), (False, "32-true")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True, n=native: n)
        assert resolve_precision(dict(cfg.trainer)) == expected
    assert cfg.tf32 is True and cfg.optim.fused is None and cfg.model.attention.backend == "sdpa"
    for name in ("ddp", "fsdp"):
        assert compose_cfg([f"trainer={name}"]).trainer.num_nodes == 1  # trainer.num_nodes=N: a known key


def test_adamw_is_fused_on_cuda_unless_set():
    assert adamw_implementation(None, torch.device("cuda", 0)) == {"fused": True}
    assert adamw_implementation(None, torch.device("cpu")) == {}  # torch's default
    assert adamw_implementation(False, torch.device("cuda", 0)) == {}
    assert adamw_implementation(True, torch.device("cpu")) == {"fused": True}
    w = torch.nn.Parameter(torch.randn(4, 4))  # and torch takes it: fused AdamW runs on CPU too
    opt = torch.optim.AdamW([w], lr=0.1, **adamw_implementation(True, w.device))
    w.sum().backward()
    opt.step()
    assert opt.defaults["fused"] is True


def test_tf32_leaves_cpu_float32_alone():
    """tf32 sets CUDA's flag alone: oneDNN's CPU matmul precision and CPU float32 products stay as they were."""
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    before, cuda_flag = a @ b, torch.backends.cuda.matmul.allow_tf32
    cpu_flag = torch.backends.mkldnn.matmul.fp32_precision
    with tf32_matmuls(True):
        assert torch.backends.cuda.matmul.allow_tf32 is True
        assert torch.backends.mkldnn.matmul.fp32_precision == cpu_flag
        assert torch.get_float32_matmul_precision() == "high"  # what Lightning asks (it raises on mixed APIs)
        assert torch.equal(a @ b, before)
    assert torch.backends.cuda.matmul.allow_tf32 == cuda_flag


@pytest.mark.parametrize("override,error", [
    ("optim.fused=1", "optim.fused: got 1; valid: true, false, or null"),
    ("tf32=yes", "tf32: got 'yes'; valid: true or false"),
])
def test_bad_gpu_settings_are_one_line(override, error):
    from zoo.config.checks import check_run

    cfg = OmegaConf.to_container(compose_cfg([]), resolve=True)
    key, value = override.split("=")
    node = cfg["optim"] if key.startswith("optim.") else cfg
    node[key.rpartition(".")[2]] = int(value) if value.isdigit() else value
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(")", r"\)")):
        check_run(cfg)


def test_gpt2_small_is_124m_on_a_prepared_corpus(corpus):
    # trainer=cpu: this machine has no GPU; the model is built as the preset's run builds it (vocab and context
    # from the prepared corpus), counted on the meta device
    plain = OmegaConf.to_container(compose_cfg(["experiment=gpt2_small", f"data.path={corpus}", "trainer=cpu",
                                                "data.eval_batches=1"]), resolve=True)
    run_plan, data = plan(plain, build_data)
    m = run_plan.as_dict()["model"]
    assert (m["d_model"], m["n_layers"], m["n_heads"], m["ffn"]["name"], m["position"]["name"]) == \
        (768, 12, 12, "gelu_tanh", "learned")
    vocab = data.tokenizer.vocab_size
    assert count_params(m)["total"] == GPT2_SMALL + (vocab - 50257) * 768
    # with the GPT-2 tokenizer (50,257 ids after zoo's 20) and the preset's context: 124M
    gpt2 = {**m, "vocab_size": 50257 + 20, "max_seq_len": 1024}
    assert count_params(gpt2)["total"] == GPT2_SMALL + 20 * 768
    cfg = compose_cfg(["experiment=gpt2_small", "data.path=x"])
    assert (cfg.data.kind, cfg.data.context, cfg.trainer.accelerator, cfg.trainer.precision) == \
        ("tokens", 1024, "gpu", "bf16-mixed")
    assert (cfg.optim.lr, cfg.optim.min_lr, cfg.optim.warmup_steps, list(cfg.optim.betas)) == \
        (6e-4, 6e-5, 2000, [0.9, 0.95])
    assert compose_cfg(["experiment=gpt2_small", "data.path=x", "trainer=ddp"]).trainer.precision == "bf16-mixed"


# Runs train.py with StepLoader recording, in every process Lightning starts, a digest of each batch it yields.
PROBE = """
import hashlib, os, sys
sys.path.insert(0, {root!r})
from zoo.training import data

original = data.StepLoader.__iter__

def recording(self):
    for batch in original(self):
        with open(os.path.join({out!r}, f"rank{{self.rank}}-of-{{self.world}}.txt"), "a") as f:
            f.write(hashlib.sha1(batch["input"].numpy().tobytes()).hexdigest() + "\\n")
        yield batch

data.StepLoader.__iter__ = recording
# exec, not runpy.run_path: sys.argv[0] stays this file, so the process Lightning starts for rank 1 records too
train = os.path.join({root!r}, "train.py")
exec(compile(open(train).read(), train, "exec"), {{"__name__": "__main__", "__file__": train}})
"""


def digest(batch: dict) -> str:
    return hashlib.sha1(batch["input"].numpy().tobytes()).hexdigest()


@pytest.mark.slow
def test_ddp_ranks_draw_different_batches_from_token_files(corpus, tmp_path):
    """Two processes (gloo) train experiment=gpt2_small, shrunk, on a prepared corpus: each rank draws the batches
    of its own shard of the single-process order, none shared, accumulation included; the run completes."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE.format(root=str(ROOT), out=str(tmp_path)))
    steps, accumulate = 3, 2
    args = ["experiment=gpt2_small", f"data.path={corpus}", "trainer=ddp", "trainer.devices=2",
            "trainer.accelerator=cpu", "trainer.precision=32-true", "compile=false", "model.d_model=32",
            "model.n_layers=1", "model.n_heads=2", "data.context=16", "data.batch_size=2", "data.eval_batches=1",
            f"trainer.max_steps={steps}", "trainer.val_check_interval=3", "optim.warmup_steps=1",
            f"trainer.accumulate_grad_batches={accumulate}", "sample.max_new_tokens=0", "logger=none", "threads=1",
            f"hydra.run.dir={tmp_path}/run"]
    proc = subprocess.run([sys.executable, str(probe), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == steps
    drawn = {r: (tmp_path / f"rank{r}-of-2.txt").read_text().split() for r in (0, 1)}
    assert not set(drawn[0]) & set(drawn[1])
    d = build_data({"kind": "tokens", "path": corpus, "context": 16, "batch_size": 2, "eval_batches": 1}, 0,
                   steps * accumulate)
    d.objective = OBJECTIVE.get("decoder_only")(d.tokenizer.vocab_size)
    single = [digest(b) for b in StepLoader(d.train_batch, 0, 2 * steps * accumulate)]
    for r in (0, 1):  # rank r takes batches r, 2 + r, 4 + r, ... of one process's order
        assert drawn[r] == single[r::2]


def test_fsdp_composes_and_is_refused_on_cpu_in_one_line(corpus):
    """Lightning's FSDP needs CUDA GPUs: on this machine the run stops before any data or weight."""
    cfg = compose_cfg(["trainer=fsdp", "trainer.num_nodes=2", f"data.path={corpus}", "data=tokens"])
    assert (cfg.trainer.strategy, cfg.trainer.num_nodes, cfg.trainer.precision) == ("fsdp", 2, "auto")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    plain = OmegaConf.to_container(cfg, resolve=True)
    with pytest.raises(ConfigError, match="trainer.accelerator: 'gpu' but this machine has no CUDA GPU"):
        plan(plain, build_data)
    plain["trainer"]["accelerator"] = "cpu"
    with pytest.raises(ConfigError, match="trainer: The strategy `fsdp` requires a GPU accelerator"):
        plan(plain, build_data)


@pytest.mark.parametrize("overrides,nodes,tasks", [
    (["trainer=ddp", "trainer.num_nodes=2", "trainer.devices=4"], 2, 4),
    (["trainer=fsdp", "trainer.num_nodes=3", "trainer.devices=8"], 3, 8),
    (["trainer=gpu"], 1, 1),  # no num_nodes in the trainer: one node
])
def test_slurm_launcher_follows_num_nodes_and_devices(overrides, nodes, tasks):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from zoo.config.schema import register

    register()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm", *overrides], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (nodes, tasks, tasks)
    assert launcher._target_.endswith("SlurmLauncher")


def test_slurm_multirun_command_accepts_num_nodes():
    """The command line's own checks (before Hydra and torch) know trainer.num_nodes under trainer=ddp."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cmd = [sys.executable, "train.py", "hydra/launcher=slurm", "trainer=ddp", "trainer.num_nodes=2", "--cfg", "job"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "num_nodes: 2" in proc.stdout



@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_fused_adamw_clips_true_gradients_under_mixed_precision(precision):
    """Lightning's mixed precision refuses to clip for a fused AdamW; zoo's hook clips the true (unscaled)
    gradients, and the step equals a foreach AdamW's on the same clipped gradients."""
    from types import SimpleNamespace

    from lightning.pytorch.plugins.precision import MixedPrecision
    from lightning.pytorch.utilities.enums import GradClipAlgorithmType

    from zoo.training.module import ZooModule

    module, reference = ZooModule(_tiny_plan()), ZooModule(_tiny_plan())
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if precision == "16-mixed" else None
    module._trainer = SimpleNamespace(precision_plugin=MixedPrecision(precision, "cpu", scaler=scaler),
                                      strategy=SimpleNamespace(model=module))
    x = torch.randint(0, 37, (2, 16))
    fused = torch.optim.AdamW(module.parameters(), lr=0.1, fused=True)
    plain = torch.optim.AdamW(reference.parameters(), lr=0.1)
    loss = module.model(x).float().square().mean()
    (scaler.scale(loss) if scaler else loss).backward()
    reference.model(x).float().square().mean().backward()
    module.configure_gradient_clipping(fused, 0.05, GradClipAlgorithmType.NORM)
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.05)
    assert norm > 0.05  # clipping is active
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in module.parameters() if p.grad is not None]))
    assert clipped == pytest.approx(0.05, rel=1e-4)
    scaler.step(fused) if scaler else fused.step()
    plain.step()
    for a, b in zip(module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):  # what the hook avoids
        MixedPrecision(precision, "cpu", scaler=scaler).clip_gradients(fused, 0.5, GradClipAlgorithmType.NORM)


def test_fsdp_clips_by_the_root_modules_norm():
    """Under FSDP each rank holds a shard of the gradients: the clip goes to the FSDP root's clip_grad_norm_
    (Lightning's FSDP precision refuses norm clipping)."""
    from types import SimpleNamespace

    from lightning.pytorch.plugins.precision import FSDPPrecision

    from zoo.training.module import ZooModule

    module, calls = ZooModule(_tiny_plan()), []
    root = SimpleNamespace(clip_grad_norm_=calls.append)  # what FullyShardedDataParallel offers
    module._trainer = SimpleNamespace(precision_plugin=FSDPPrecision("bf16-mixed"),
                                      strategy=SimpleNamespace(model=root))
    module.configure_gradient_clipping(torch.optim.AdamW(module.parameters()), 1.0, "norm")
    assert calls == [1.0]
