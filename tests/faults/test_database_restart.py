"""MariaDB restarted under the nodes in the middle of their rounds (real processes).

Two nodes (one committee member, one trainer) keep their databases on a MariaDB server of the
test's own (the machine's shared server serves other tests), so every action of a round meets
the restart. The server is stopped and started again on the same data directory and port twice:
while round 1 trains and once round 2 is past training (restarts.py). Every connection of the
nodes' web servers, agents and their threads is cut each time.

The job completes; no claimed action is lost (every action row ends done: one the restart cut
is recorded failed and offered again, a past round's measure included; each round's update is
on chain) or done twice (no call sent twice on chain; one training release a round: a training
attempt cut between its reservation and its training takes that reservation over).
"""

from __future__ import annotations

import pytest
from faultnet import REAL_PROCESS_FAULT_MARKS
from restarts import (
    PairFederation,
    assert_no_claim_lost,
    assert_nothing_done_twice,
    assert_the_job_completed,
    run_with_restarts,
)
from services import PrivateMariaDB, available

from devnet.localnet import NodeSpec

pytestmark = [*REAL_PROCESS_FAULT_MARKS, pytest.mark.skipif(bool(available()), reason=available() or "-")]


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults-mariadb")
    with PrivateMariaDB(root / "mariadb") as database:
        specs = [NodeSpec("org-a", database="mariadb"), NodeSpec("org-b", database="mariadb")]
        with PairFederation(root / "fed", specs, mariadb_url=database.url, log=lambda _line: None) as fed:
            result = run_with_restarts(fed, database.restart)
        result["restarts_s"] = list(database.restarts)
        yield result


def test_the_job_completes_across_the_restarts(restarted):
    assert_the_job_completed(restarted)


def test_no_claimed_action_is_lost(restarted):
    assert_no_claim_lost(restarted)


def test_nothing_is_done_twice(restarted):
    assert_nothing_done_twice(restarted)
