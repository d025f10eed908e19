import collections
import json
import os
from pathlib import Path

import pytest
import torch

# The suite runs in pytest-xdist workers (pyproject's addopts): each worker, and every command it starts, gets
# its share of the cores, so two workers on two cores do not fight over both.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    threads = max(1, (os.cpu_count() or 1) // workers)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# Each test file's seconds in the last recorded run (`python -m pytest --record-durations`): the order below.
DURATIONS = Path(__file__).with_name("durations.json")
UNMEASURED_S = 0.09  # a file not in DURATIONS yet: 90 ms a test, the mean outside the docs in the last record


def _group(item: pytest.Item) -> str:
    if item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(item.path.relative_to(item.config.rootpath).as_posix()))
    marker = item.get_closest_marker("xdist_group")
    assert marker is not None
    return str(marker.args[0] if marker.args else marker.kwargs["name"])


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`--dist loadgroup` (pyproject's addopts) keeps each test file on one worker, as `--dist loadfile` would, so
    a file's module fixtures are built once; tests/test_docs.py instead groups its commands by page, and runs a
    training command that reads nothing apart, so the pages run side by side.

    The workers take the groups in this order (`--no-loadscope-reorder`): the docs test's first, in the docs' order
    (a page's commands may wait on a run another page makes first), then the files by their seconds in the last
    recorded run, longest first, so that the last groups either worker takes are short and both finish together (a
    file's number of tests is not its cost: a few tests that train or wait on a server outlast thousands of small
    ones)."""
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    sizes = collections.Counter(_group(item) for item in items)

    def order(item: pytest.Item) -> tuple[int, float]:
        group = _group(item)
        return (0, 0) if item.path.name == "test_docs.py" else (1, -seconds.get(group, UNMEASURED_S * sizes[group]))

    items.sort(key=order)  # stable: a group's tests keep their order


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-durations", action="store_true",
                     help=f"write each test file's seconds to {DURATIONS.name} (the order the workers take them in)")


_seconds: collections.Counter[str] = collections.Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test file's setup, call and teardown seconds (summed by xdist's controller, which writes them)."""
    if not report.nodeid.startswith("tests/test_docs.py"):
        _seconds[report.nodeid.partition("::")[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.getoption("--record-durations") and not hasattr(session.config, "workerinput") and \
            exitstatus == 0:
        DURATIONS.write_text(json.dumps({g: round(s, 1) for g, s in sorted(_seconds.items())}, indent=0) + "\n")


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
