import pytest

from tests.helpers import FLOAT32, TINY, TINY_TASK, compose_cfg


@pytest.fixture
def train(tmp_path):
    """Run zoo.training.run on composed overrides in a fresh directory; returns (exit code, run dir)."""
    from zoo.training import run

    def _train(overrides: list[str], tiny: bool = True, name: str = "run"):
        task = any(o.split("=")[0] == "data" and o.split("=")[1] in ("copy", "reverse", "sort", "addition")
                   for o in overrides)
        cfg = compose_cfg(((TINY_TASK if task else TINY) if tiny else FLOAT32) + overrides)
        run_dir = tmp_path / name
        return run(cfg, run_dir=run_dir), run_dir

    return _train
