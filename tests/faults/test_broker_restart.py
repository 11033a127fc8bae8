"""Redis restarted under the nodes' Celery workers in the middle of their rounds (real processes).

Two nodes (one committee member, one trainer) run every round action, local training included
(a cluster task), on a Celery worker whose broker is a Redis server of the test's own (the
machine's shared one serves other tests), kept in memory only: a restart loses every message
queued in it, the harder case. Redis is stopped and started again on the same port twice: while
round 1 trains (the trainer's worker inside its task) and once round 2 is past training
(restarts.py).

The job completes; no task is lost (every action row ends done, each round's update is on chain,
each training task succeeded) or run twice (one attempt per training task, no call sent twice
on chain, one training release a round locally).
"""

from __future__ import annotations

import pytest
from faultnet import REAL_PROCESS_FAULT_MARKS
from restarts import (
    ROUNDS,
    PairFederation,
    assert_no_claim_lost,
    assert_nothing_done_twice,
    assert_the_job_completed,
    run_with_restarts,
)
from services import PrivateRedis, available

from devnet.localnet import NodeSpec

pytestmark = [*REAL_PROCESS_FAULT_MARKS, pytest.mark.skipif(bool(available()), reason=available() or "-")]


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults-redis")
    with PrivateRedis(root / "redis") as broker:
        specs = [NodeSpec("org-a", celery=True), NodeSpec("org-b", celery=True)]
        with PairFederation(root / "fed", specs, redis_url=broker.url, log=lambda _line: None) as fed:
            result = run_with_restarts(fed, broker.restart)
        result["restarts_s"] = list(broker.restarts)
        yield result


def test_the_job_completes_across_the_restarts(restarted):
    assert_the_job_completed(restarted)


def test_no_task_is_lost(restarted):
    assert_no_claim_lost(restarted)
    trained = [row for tasks in restarted["tasks"].values() for row in tasks]
    assert sorted(r for r, _kind, _state, _attempts in trained) == list(range(1, ROUNDS + 1)), trained
    assert {state for _r, _kind, state, _attempts in trained} == {"succeeded"}, trained


def test_no_task_is_run_twice(restarted):
    trained = [row for tasks in restarted["tasks"].values() for row in tasks]
    assert all(attempts == 1 for _r, _kind, _state, attempts in trained), trained
    assert_nothing_done_twice(restarted)
