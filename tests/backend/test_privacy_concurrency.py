"""Charges that race for the last of a budget: the group's row lock lets exactly one through.

Real transactions on the configured database (SQLite by default; MariaDB with DATABASE_URL),
each charge on its own thread and connection, all released at once by a barrier.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from django.db import OperationalError, connection

from backend.api.errors import BudgetExceeded
from backend.datasets import budget
from backend.datasets.models import BudgetGroup, Dataset, PrivacyRelease
from fl_node.privacy import PrivacyHistory, ReleasePlan, rdp_epsilon
from tests.builders import stored_dataset

TRAIN = ReleasePlan("dp_sgd", noise_multiplier=1.1, sample_rate=0.05, steps=60)
DELTA = 1e-5
RACERS = 4


def _epsilon(times: int) -> float:
    history = PrivacyHistory()
    for _ in range(times):
        history.record(
            noise_multiplier=TRAIN.noise_multiplier, sample_rate=TRAIN.sample_rate, steps=TRAIN.steps
        )
    return rdp_epsilon(history, delta=DELTA)


def _reserve_waiting_for_sqlite(dataset: Dataset, job: int) -> None:
    """The tests' SQLite database is in memory with a shared cache, where a writer that meets a
    table lock fails at once instead of waiting as a node's file database does (busy timeout):
    wait here. MariaDB waits on the row lock itself."""
    for _ in range(500):
        try:
            budget.reserve_release(dataset, job, 1, TRAIN)
            return
        except OperationalError as exc:
            if connection.vendor != "sqlite" or "locked" not in str(exc):
                raise
            time.sleep(0.01)
    raise AssertionError("the SQLite table stayed locked")


@pytest.mark.django_db(transaction=True)
def test_racing_charges_on_two_members_of_one_group_pass_the_cap_once():
    group = BudgetGroup.objects.create()
    cap = (_epsilon(1) + _epsilon(2)) / 2  # room for one release, not two
    members = [
        stored_dataset(name, content=name, budget_group=group, epsilon_cap=cap, delta=DELTA) for name in "ab"
    ]
    barrier = threading.Barrier(RACERS)
    outcomes: list[str] = []

    def charge(i: int) -> None:
        try:
            barrier.wait()
            _reserve_waiting_for_sqlite(members[i % 2], i)
            outcomes.append("charged")
        except BudgetExceeded:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=charge, args=(i,)) for i in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["charged"] + ["refused"] * (RACERS - 1)
    assert PrivacyRelease.objects.count() == 1
    assert budget.budget_summary(members[1])["epsilon_reserved"] == pytest.approx(_epsilon(1))


def _overlapping_uploads() -> list:
    import io

    from backend.datasets import services

    rng = np.random.default_rng(21)
    x, y = rng.random((30, 6)).astype(np.float32), rng.integers(0, 3, 30)
    uploads = []
    for name, rows in (("first", slice(0, 20)), ("second", slice(10, 30))):  # 10 records in common
        buffer = io.BytesIO()
        np.savez(buffer, x=x[rows], y=y[rows])
        uploads.append(
            services.Upload(
                name=name,
                format="npz",
                data=buffer.getvalue(),
                epsilon_cap=5.0,
                delta=1e-3,
                classes=("0", "1", "2"),
            )
        )
    return uploads


@pytest.mark.django_db(transaction=True)
def test_the_first_two_uploads_racing_with_shared_records_end_in_one_budget_group():
    from backend.datasets import services

    assert not BudgetGroup.objects.exists()  # a fresh node: no group row to queue on yet
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def upload(one) -> None:
        try:
            barrier.wait()
            for _ in range(500):
                try:
                    services.create_dataset(one)
                    return
                except OperationalError as exc:  # the in-memory SQLite's table lock, as above
                    if connection.vendor != "sqlite" or "locked" not in str(exc):
                        raise
                    time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001 (reported by the assertion below)
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=upload, args=(one,)) for one in _overlapping_uploads()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    groups = set(Dataset.objects.values_list("budget_group_id", flat=True))
    assert Dataset.objects.count() == 2 and len(groups) == 1 and None not in groups
