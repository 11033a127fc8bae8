"""Shared test set-up: single-threaded torch so parallel workers do not fight over two cores, and
under xdist the longest test files first (tests/suite_order.py); ``-n 0`` keeps pytest's order."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from suite_order import longest_files_first  # noqa: E402

torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    # The controller: hand the files out in the order the workers collected them (longest first),
    # not sorted by their number of tests.
    if getattr(config.option, "dist", "no") in ("loadfile", "loadscope"):
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)  # after pytest-django's reorder, which interleaves files
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: its order is the schedule's queue
        items[:] = longest_files_first(items)
