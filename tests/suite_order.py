"""The order in which ``pytest -n 2 --dist loadfile`` hands out the test files: longest first.

pytest-xdist's loadfile scheduler hands a file to whichever worker runs low, in the order of its
queue, which it sorts by the number of tests in a file. The real-process files (a federation of
node processes, minutes each) hold few tests, so they came last and ran one after another at the
end of one worker while the other sat idle. tests/conftest.py has each worker order its
collection by the files' expected seconds, longest first (FILE_SECONDS, else a guess from the
file's marks), and the controller keep that order (no reorder by count): the long files start at
once, spread over both workers, and the many short files fill the gaps at the end. Nothing about
a test changes, only when it starts.
"""

from __future__ import annotations

import pytest

# Seconds a file took (setup, calls and teardown) on the 2-core machine: a run of the README's
# command (pytest --durations, two workers) on 2026-12-06. Only the order depends on them: a stale
# figure costs balance, not correctness (tests/test_suite_order.py checks that every file named
# here exists).
FILE_SECONDS = {
    "tests/adversarial/test_hostile_production.py": 295,
    "tests/e2e/test_consortium.py": 280,
    "tests/browser/test_federation_browser.py": 280,
    # the draws decide: each round the hostile key is seated in waits for its deadlines (120 s)
    "tests/adversarial/test_hostile_federation.py": 250,
    "tests/devnet/test_clique.py": 225,  # two Clique networks of its own
    "tests/faults/test_member_faults.py": 220,  # two federations
    "tests/adversarial/test_hostile_protocol.py": 200,  # the draws decide (160-240 s)
    "tests/faults/test_trainer_killed.py": 135,
    "tests/e2e/test_federation.py": 80,
    "tests/browser/test_dashboard_faults.py": 85,
    "tests/faults/test_restore_mid_job.py": 85,
    "tests/faults/test_rpc_outage.py": 65,
    "tests/faults/test_database_restart.py": 60,
    "tests/e2e/test_cli_and_metrics.py": 50,
    "tests/faults/test_broker_restart.py": 50,
    "tests/e2e/test_sparse_federation.py": 45,
}
# A file not in FILE_SECONDS: a guess from its marks (its longest), else a second a test.
MARK_SECONDS = {"e2e": 150.0, "browser": 60.0, "slow": 30.0}


def expected_seconds(path: str, items: list[pytest.Item]) -> float:
    """How long the file at ``path`` (relative to the rootdir) is expected to run."""
    if path in FILE_SECONDS:
        return float(FILE_SECONDS[path])
    marks = {mark.name for item in items for mark in item.iter_markers()}
    return max([MARK_SECONDS[m] for m in marks if m in MARK_SECONDS], default=float(len(items)))


def longest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` grouped by file, the files by expected seconds (longest first, ties in the
    order pytest collected them), each file's tests in their collected order."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ranked = sorted(files.items(), key=lambda entry: -expected_seconds(*entry))
    return [item for _path, tests in ranked for item in tests]
