import os

import pytest
import torch

# The suite runs in pytest-xdist workers (pyproject's addopts): each worker, and every command it starts, gets
# its share of the cores, so two workers on two cores do not fight over both.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
