"""The order in which ``pytest -n 2 --dist loadfile`` (the README's command) hands out test files:
the longest first (tests/conftest.py), so the real-process files do not queue at the end of one
worker while the other is idle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from suite_order import FILE_SECONDS

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

RECORD_START = """

@pytest.fixture(autouse=True)
def _record_start(request):
    with open(os.environ["ORDER_LOG"], "a") as log:
        log.write(f"{os.environ['PYTEST_XDIST_WORKER']} {request.node.nodeid}\\n")
"""


def test_every_file_with_a_measured_duration_exists():
    missing = [path for path in FILE_SECONDS if not (REPO / path).is_file()]
    assert missing == [], f"tests/conftest.py FILE_SECONDS names files that are gone: {missing}"


@pytest.mark.slow  # a pytest run of its own: three interpreters importing torch
def test_the_two_workers_start_with_the_two_longest_files(tmp_path):
    # A suite of its own, with this repository's conftest and suite_order: a file FILE_SECONDS names (one quick
    # test), a file marked e2e, and two unmarked files with more tests (xdist's own order, by
    # number of tests, would start with those).
    files = {
        "tests/conftest.py": (TESTS / "conftest.py").read_text() + RECORD_START,
        "tests/suite_order.py": (TESTS / "suite_order.py").read_text(),
        next(iter(FILE_SECONDS)): "def test_listed():\n    pass\n",
        "tests/test_marked.py": "import pytest\n\n\n@pytest.mark.e2e\ndef test_marked():\n    pass\n",
        "tests/test_many.py": "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(6)),
        "tests/test_few.py": "def test_a():\n    pass\n\n\ndef test_b():\n    pass\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    e2e: real processes\n")
    log = tmp_path / "order.log"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:django",
        ],
        cwd=tmp_path,
        env=os.environ | {"ORDER_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    started = [line.split(" ", 1) for line in log.read_text().splitlines()]
    assert len(started) == 10, started
    first = {}
    for worker, nodeid in started:
        first.setdefault(worker, nodeid.split("::", 1)[0])
    assert sorted(first.values()) == sorted([next(iter(FILE_SECONDS)), "tests/test_marked.py"]), started
