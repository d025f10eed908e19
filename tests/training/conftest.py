from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

CONF = str(Path(__file__).resolve().parents[2] / "conf")

# Tiny and quick: a few steps of a one-layer model, evaluated twice.
TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "trainer.max_steps=4",
        "trainer.val_check_interval=2", "trainer.log_every_n_steps=1", "data.eval_batches=2", "data.batch_size=4",
        "data.context=16"]
TINY_TASK = [o for o in TINY if not o.startswith(("data.eval_batches", "data.context"))] + [
    "data.n_train=200", "data.n_val=16", "data.n_test=16", "data.eval_examples=16"]


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=overrides)


@pytest.fixture
def train(tmp_path):
    """Run zoo.training.run on composed overrides in a fresh directory; returns (exit code, run dir)."""
    from zoo.training import run

    def _train(overrides: list[str], tiny: bool = True, name: str = "run"):
        task = any(o.split("=")[0] == "data" and o.split("=")[1] in ("copy", "reverse", "sort", "addition")
                   for o in overrides)
        cfg = compose_cfg(((TINY_TASK if task else TINY) if tiny else []) + overrides)
        run_dir = tmp_path / name
        return run(cfg, run_dir=run_dir), run_dir

    return _train
