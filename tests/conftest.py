import collections
import os

import pytest
import torch

# The suite runs in pytest-xdist workers (pyproject's addopts): each worker, and every command it starts, gets
# its share of the cores, so two workers on two cores do not fight over both.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`--dist loadgroup` (pyproject's addopts) keeps each test file on one worker, as `--dist loadfile` would, so
    a file's module fixtures are built once; tests/test_docs.py instead groups its commands by page, and runs a
    training command that reads nothing apart, so the pages run side by side.

    The workers take the groups in this order (`--no-loadscope-reorder`): the docs test's first, the longest work
    in the fewest tests (a shrunk study is one test of a minute), then the files by their number of tests, largest
    first, as pytest-xdist would order them. Many small groups at the end are meant to even out the two workers'
    finish (one study at the end would leave one worker idle for its minute); a file's test count is not its cost,
    though, and the last 2.5 minutes still leave a core idle at times (docs/benchmarks.md, "The test suite")."""
    def group(item: pytest.Item) -> str:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.relative_to(item.config.rootpath).as_posix()))
        marker = item.get_closest_marker("xdist_group")
        assert marker is not None
        return str(marker.args[0] if marker.args else marker.kwargs["name"])

    sizes = collections.Counter(group(item) for item in items)

    def order(item: pytest.Item) -> tuple[int, int]:
        return (0, 0) if item.path.name == "test_docs.py" else (1, -sizes[group(item)])

    items.sort(key=order)  # stable: a group's tests keep their order


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _started_by_nobody(monkeypatch):
    """Each test starts as a plain `python -m` process would: a test that ran `zoo <command>` in this process
    (zoo.commands.run_as) must not change the hints a later test reads."""
    from zoo import commands

    monkeypatch.setattr(commands, "_command", None)
    monkeypatch.delenv(commands.COMMAND_ENV, raising=False)
