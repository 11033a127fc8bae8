"""The event indexer: typed tables from events, resume after restart, idempotent replay, confirmations."""

from __future__ import annotations

import pytest

from backend.ledger import models
from backend.ledger.indexer import EventIndexer
from backend.ledger.resources import JobSpec, SpendKind

REF, HASH, MODEL = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32


def _run_one_round_job(ledgers) -> tuple[int, list[int]]:
    """5 members: datasets, a grant, a 1-round job with committee 2 (drawn by the contract) and 3
    trainers. Returns (job, role): role[0], role[1] the drawn members' indexes in seat order,
    role[2..4] the trainers' ("trainer 2" below is ledgers[role[2]])."""
    for i, ledger in enumerate(ledgers):
        ledger.data.register_dataset(bytes([i + 1]) * 32, bytes([i + 9]) * 32, b"\x05" * 32, 50, 5_000_000)
    ledgers[0].data.grant(1, ledgers[1].client.address, b"\xaa" * 113, 1_000_000)
    ledgers[0].data.revoke(1, ledgers[1].client.address)
    # spends are recorded through the jobs contract, by a participant in a round (trainers below)
    w3 = ledgers[0].client.w3
    deadline = w3.eth.get_block("latest")["timestamp"] + 3600
    spec = JobSpec(b"\x01" * 32, REF, HASH, 1, 2, 2, 2, deadline, 600, 600, max_spend_per_round=1_250_000)
    job = ledgers[0].fl.propose_job(spec)
    for i in range(5):
        ledgers[i].fl.join(job, i + 1)
    ledgers[0].fl.start_job(job)
    for ledger in ledgers:  # the last reveal draws the committee
        ledger.fl.reveal_draw_secret(job)
    everyone = [ledger.client.address for ledger in ledgers]
    drawn = [everyone.index(a) for a in ledgers[0].fl.committee(job)]
    role = drawn + sorted(set(range(5)) - set(drawn))
    fl = [ledgers[r].fl for r in role]
    for i in (2, 3, 4):
        fl[i].spend_privacy(job, 1, 1_250_000 if i == 2 else 1, SpendKind.UPDATE, 7)
        fl[i].submit_update(job, 1, bytes([i]) * 64, bytes([i]) * 32, 10 * i)
    for i in (0, 1):
        fl[i].spend_privacy(job, 1, 3, SpendKind.SCORES)
    addr = [everyone[r] for r in role]
    first, second = {addr[2]: 9000, addr[3]: 7000, addr[4]: 0}, {addr[2]: 8000, addr[3]: 7100, addr[4]: 0}
    fl[0].commit_scores(job, 1, first, 0, b"\x01" * 32)
    fl[1].commit_scores(job, 1, second, 0, b"\x02" * 32)
    fl[0].reveal_scores(job, 1, first, 0, b"\x01" * 32)
    # the last member's scores finalize the round in the same transaction
    last = fl[1].reveal_scores(job, 1, second, 0, b"\x02" * 32)
    outcome = last.event("RoundFinalized").args
    drawn = [addr.index(a) for a in outcome["nextCommittee"]]
    fl[drawn[0]].vote_global_model(job, 1, b"\x44" * 64, MODEL)
    fl[drawn[1]].vote_global_model(job, 1, b"\x44" * 64, MODEL)
    return job, role


@pytest.fixture(scope="module")
def finished_job(federation):
    return _run_one_round_job(federation)


def _indexer(ledgers, **kw) -> EventIndexer:
    return EventIndexer(ledgers[0].client, ledgers[0].deployment, **kw)


@pytest.mark.django_db
def test_indexer_builds_typed_tables(federation, finished_job):
    job_id, role = finished_job
    result = _indexer(federation).sync()
    assert result.new_events == result.events > 30
    assert models.Node.objects.filter(status="member").count() == 5
    job = models.Job.objects.get(job_id=job_id)
    assert job.status == "finished" and job.model_hash == "0x" + "33" * 32
    assert job.participants.count() == 5
    round_ = models.Round.objects.get(job=job, number=1)
    assert round_.status == "done" and round_.base_model_hash == "0x" + "22" * 32
    addr = [federation[r].client.address for r in role]  # by role: the committee first
    assert list(models.AcceptedUpdate.objects.filter(job=job).values_list("trainer", flat=True)) == [
        addr[2],
        addr[3],
    ]
    update = models.Update.objects.get(job=job, trainer=addr[2])
    assert (update.median, update.rank, update.accepted, update.reference) == (
        8000,
        0,
        True,
        "0x" + "02" * 64,
    )
    assert models.Update.objects.get(job=job, trainer=addr[4]).accepted is False
    assert models.Score.objects.filter(job=job).count() == 6
    seats = models.CommitteeSeat.objects.filter(job=job, round=1).order_by("seat")
    assert [s.member for s in seats] == addr[:2]
    finalized_args = models.ChainEvent.objects.get(name="RoundFinalized").args
    next_seats = models.CommitteeSeat.objects.filter(job=job, round=2).order_by("seat")
    assert [s.member for s in next_seats] == finalized_args["nextCommittee"]
    assert models.Round.objects.get(job=job, number=1).seed == finalized_args["seed"]
    assert job.participants.filter(drawn=True).count() == 5
    model = models.GlobalModel.objects.get(job=job, round=1)
    assert model.reference == "0x" + "44" * 64
    assert models.GlobalModelProposal.objects.get(job=job).votes == 2
    grant = models.Grant.objects.get(dataset__dataset_id=1)
    assert grant.active is False and grant.wrapped_key == "0x" + "aa" * 113
    spent = role[2] + 1  # trainer 2's dataset
    assert models.Dataset.objects.get(dataset_id=spent).privacy_spent == 1_250_000
    assert models.BudgetSource.objects.get(datasets__dataset_id=spent).spent == 1_250_000
    assert models.PrivacySpend.objects.get(dataset__dataset_id=spent, job_id=1).spent == 1_250_000
    records = models.PrivacyRecord.objects.filter(job_id=job_id)
    assert sorted(records.values_list("kind", flat=True)) == [0, 0, 0, 1, 1]
    assert set(records.filter(kind=0).values_list("steps", flat=True)) == {7}
    assert models.ChainEvent.objects.filter(name="UpdateSubmitted").count() == 3
    # contribution accounting, derived from the events: trainers 2 and 3 accepted (medians 8000
    # and 7000), members 0 and 1 revealed once each (each agreed with every decision), the drawn
    # members voted once each for the fixed pair
    from backend.ledger.contributions import contributions

    rows = {row["node"]: row for row in contributions(job)}
    assert [rows[a]["accepted_updates"] for a in addr] == [0, 0, 1, 1, 0]
    assert [rows[a]["updates"] for a in addr] == [0, 0, 1, 1, 1]
    assert rows[addr[2]]["accepted_median_sum"] == 8000 and rows[addr[3]]["accepted_median_sum"] == 7000
    assert [rows[a]["reveals"] for a in addr] == [1, 1, 0, 0, 0]
    drawn = finalized_args["nextCommittee"]
    assert [rows[a]["votes"] for a in addr] == [int(a in drawn[:2]) for a in addr]
    unit = (8000 + 7000) / 2  # a committee action counts as the mean accepted median
    total = 8000 + 7000 + 4 * unit  # two reveals, two votes
    for a in addr:
        work = rows[a]["accepted_median_sum"] + unit * (rows[a]["reveals"] + rows[a]["votes"])
        assert rows[a]["share"] == round(work / total, 6)
    assert rows[addr[0]]["share"] > 0 and rows[addr[4]]["share"] == round(
        unit * rows[addr[4]]["votes"] / total, 6
    )
    # the last scores and the round's finalization: one transaction, in that order
    last_scores = models.ChainEvent.objects.filter(name="ScoresSubmitted").last()
    finalized = models.ChainEvent.objects.get(name="RoundFinalized")
    assert finalized.tx_hash == last_scores.tx_hash and finalized.log_index > last_scores.log_index


@pytest.mark.django_db
def test_replay_is_idempotent_and_restart_resumes(federation, finished_job):
    first = _indexer(federation).sync()
    counts = {m: m.objects.count() for m in (models.ChainEvent, models.Score, models.Update, models.Node)}
    models.IndexerCursor.objects.all().delete()  # forget the position: everything is replayed
    replay = _indexer(federation).sync()
    assert replay.events == first.events and replay.new_events == 0
    assert {m: m.objects.count() for m in counts} == counts
    # a new indexer (a restarted process) resumes after the last block
    federation[2].nodes.update_endpoint("http://moved.test")
    resumed = _indexer(federation).sync()
    assert resumed.from_block == replay.to_block + 1 and resumed.new_events == 1
    assert models.Node.objects.get(address=federation[2].client.address).endpoint == "http://moved.test"


@pytest.mark.django_db
def test_confirmations_hold_back_recent_blocks(federation, finished_job):
    head = federation[0].client.block_number()
    result = _indexer(federation, confirmations=3).sync()
    assert result.to_block == head - 3
    assert models.IndexerCursor.objects.get().last_block == head - 3
    federation[0].client.w3.provider.ethereum_tester.mine_blocks(3)
    assert _indexer(federation, confirmations=3).sync().to_block == head
