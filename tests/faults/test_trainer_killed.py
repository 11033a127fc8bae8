"""A trainer SIGKILLed in the middle of a round (real processes: anvil and four nodes).

The round it was training in finalizes at its deadline without it, and the job completes.
Brought back with the same database, key and chunk store, the node catches up from the chain,
trains (or scores, where the draw seats it) in a later round, and its privacy budget is charged once per round at most: the crash
neither loses a charge (a reservation left behind stays counted) nor adds one (no round is
charged twice, on chain or in its own records). No transaction is sent twice.
"""

from __future__ import annotations

from collections import Counter

import pytest
from faultnet import REAL_PROCESS_FAULT_MARKS, duplicates
from scenarios import KILL_ROUNDS, run_kill_a_trainer

from devnet.localnet import LocalFederation, NodeSpec

pytestmark = REAL_PROCESS_FAULT_MARKS


@pytest.fixture(scope="module")
def killed_trainer(tmp_path_factory):
    specs = [NodeSpec("org-a"), NodeSpec("org-b"), NodeSpec("org-c"), NodeSpec("org-d")]
    with LocalFederation(tmp_path_factory.mktemp("faults-kill"), specs, log=lambda _line: None) as federation:
        yield run_kill_a_trainer(federation)


def test_the_job_completes_without_the_killed_trainer(killed_trainer):
    job = killed_trainer["job"]
    assert job["status"] == "finished", job
    first_round = [
        e.args["trainer"].lower()
        for e in killed_trainer["events"]
        if e.name == "UpdateSubmitted" and e.args["round"] == 1
    ]
    assert killed_trainer["victim"] not in first_round, first_round
    events = killed_trainer["events"]
    finalized = {e.args["round"]: e.args for e in events if e.name == "RoundFinalized"}
    fixed = {e.args["round"] for e in events if e.name == "GlobalModelFixed"}
    skipped = {e.args["round"] for e in events if e.name == "AggregationSkipped"}
    assert 1 in finalized and set(finalized) <= set(range(1, KILL_ROUNDS + 1)), sorted(finalized)
    # Each finalized round is fixed, or skipped where the draw gave its one aggregating seat to the
    # victim while it was down (committees are drawn uniformly, the victim included).
    assert fixed and not fixed & skipped and fixed | skipped == set(finalized), (fixed, skipped)
    for number in skipped:
        assert [a.lower() for a in finalized[number]["nextCommittee"]] == [killed_trainer["victim"]], number


def test_the_trainer_catches_up_and_works_in_a_later_round(killed_trainer):
    """It trains again, or scores: each round's committee is drawn uniformly from the participants,
    so the restarted node may sit on every later one (then it scores and cannot train)."""
    assert killed_trainer["victim_worked_later"], "the restarted node neither trained nor scored again"


def test_no_round_charges_the_restarted_trainer_twice(killed_trainer):
    victim = killed_trainer["victim"]
    on_chain = Counter(
        e.args["round"]
        for e in killed_trainer["events"]
        if e.name == "PrivacySpent" and e.args["spender"].lower() == victim
    )
    assert all(count == 1 for count in on_chain.values()), on_chain
    # Locally: one training release per round at most, whatever its status. The round it was
    # killed in keeps the release it reserved before training (counted against its budget, never
    # released twice); the restarted node does not train that round again.
    for round_ in killed_trainer["victim_rounds"]:
        trained = [r for r in round_["privacy"] if r["kind"] == "dp_sgd"]
        assert len(trained) <= 1, (round_["round"], round_["privacy"])


def test_the_killed_rounds_reservation_is_settled_not_left_open(killed_trainer):
    # The round closed without the victim: its reservation is withheld (still counted) once the
    # node is back, not left "reserved" for good (the job's privacy could never be final).
    statuses = {
        (round_["round"], r["kind"]): r["status"]
        for round_ in killed_trainer["victim_rounds"]
        for r in round_["privacy"]
    }
    assert statuses.get((1, "dp_sgd")) == "withheld", statuses
    assert "reserved" not in statuses.values(), statuses


def test_no_transaction_is_sent_twice(killed_trainer):
    assert duplicates(killed_trainer["calls"]) == {}
