"""FederatedLearning.spendPrivacy: a participant's own charge, within the job's plan, before its update
or its scores, against its dataset's budget source and its grant.

Datasets of the fixture: member i owns dataset i + 1 (100 + i samples, cap 3_000_000 micro-epsilon),
each in member i's shared source.
"""

from __future__ import annotations

import pytest
from conftest import salt

from backend.ledger import errors
from backend.ledger.resources import RoundPhase, SpendKind

UPDATE, SCORES, WITHHELD = SpendKind.UPDATE, SpendKind.SCORES, SpendKind.WITHHELD

REF, HASH, MODEL = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32
BOUND = 1_000_000  # the job's maxSpendPerRound: epsilon 1.0 per release


def _dp_job(fed, **overrides):
    return fed.running_job(**{"max_spend_per_round": BOUND, **overrides})


def _finish_round(fed, job, round_, committee, trainers):
    """Every trainer spends and submits (unless it did), every member scores, the new committee
    fixes a model. Returns (committee, trainers) of the next round."""
    for t in trainers:
        info = fed.member(t).fl.get_participant(job, fed.address(t))
        if info.update_round == round_:
            continue
        if info.spend_round != round_:
            fed.member(t).fl.spend_privacy(job, round_, 1, UPDATE, 10)
        fed.member(t).fl.submit_update(job, round_, bytes([t]) * 32, bytes([t + 100]) * 32, 10)
    for m in committee:
        fed.member(m).fl.spend_privacy(job, round_, 1, SCORES)
    fed.score(job, round_, {m: {fed.address(t): 5000 + t for t in trainers} for m in committee})
    addresses = fed.member(0).fl.committee(job)
    new = [next(i for i in range(12) if fed.address(i) == a) for a in addresses]
    for m in new[:2]:
        fed.member(m).fl.vote_global_model(job, round_, REF, MODEL)
    everyone = set(committee) | set(trainers)
    return new, sorted(everyone - set(new))


def test_spend_is_recorded_against_the_dataset_the_participant_joined_with(fed):
    job, committee, trainers = _dp_job(fed)
    t = trainers[0]
    receipt = fed.member(t).fl.spend_privacy(job, 1, 400_000, UPDATE, 12)
    event = receipt.event("PrivacySpent")
    assert event.contract == "DataRegistry"
    assert event.args == {
        "datasetId": t + 1,
        "jobId": job,
        "spender": fed.address(t),
        "round": 1,
        "amount": 400_000,
        "jobTotal": 400_000,
        "sourceTotal": 400_000,
        "kind": 0,
        "steps": 12,
    }
    data = fed.member(0).data
    assert data.get_source(data.source_of(t + 1)).spent == 400_000
    assert data.privacy_spent_by_job(t + 1, job) == 400_000
    info = fed.member(0).fl.get_participant(job, fed.address(t))
    assert (info.spend_round, info.spends, info.samples) == (1, 1, 100 + t)
    # a committee member records its score release in its round too
    scored = fed.member(committee[0]).fl.spend_privacy(job, 1, 5, SCORES)
    assert scored.event("PrivacySpent").args["kind"] == 1
    assert data.get_source(data.source_of(committee[0] + 1)).spent == 5
    assert fed.member(0).fl.get_participant(job, fed.address(committee[0])).score_spend_round == 1
    with pytest.raises(errors.InvalidDataset):  # no kind beyond the three
        fed.member(t).fl.client.transact(fed.member(t).fl.encode("spendPrivacy", job, 1, 1, 3, 0))


def _granted_job(fed, cap):
    """Member 5 joins a DP job with member 1's dataset (granted with ``cap``); the others with theirs."""
    job = fed.member(0).fl.propose_job(fed.spec(max_spend_per_round=BOUND))
    fed.member(1).data.grant(2, fed.address(5), b"wrapped", cap)
    fed.join(job, 5, 2)
    for i in (0, 2, 3, 4):
        fed.join(job, i, i + 1)
    fed.member(0).fl.start_job(job)
    fed.reveal_all(job, (5, 0, 2, 3, 4))
    return job


def test_a_granted_dataset_is_charged_not_the_grantees_own(fed):
    job = _granted_job(fed, 2_000_000)
    fed.member(5).fl.spend_privacy(job, 1, 700_000, UPDATE)
    data = fed.member(0).data
    assert data.get_source(data.source_of(2)).spent == 700_000
    assert data.get_source(data.source_of(6)).spent == 0
    assert data.get_grant(2, fed.address(5)).spent == 700_000


def test_a_grant_has_its_own_cap_and_ends_at_revocation(fed):
    """The grantee spends at most its grant's cap (inside the owner's), and nothing after the owner
    revokes: its job's releases from the dataset stop on chain."""
    job = _granted_job(fed, 1_200_000)
    grantee = fed.member(5).fl
    grantee.spend_privacy(job, 1, 1_000_000, UPDATE)
    with pytest.raises(errors.PrivacyBudgetExceeded) as caught:
        grantee.spend_privacy(job, 1, 300_000, UPDATE)  # within the source's cap, past the grant's
    assert caught.value.args_["cap"] == 1_200_000
    grantee.spend_privacy(job, 1, 200_000, UPDATE)
    fed.member(1).data.revoke(2, fed.address(5))
    snapshot_round = fed.member(0).fl.get_job(job).round
    with pytest.raises(errors.GrantRevoked):
        grantee.spend_privacy(job, snapshot_round, 1, WITHHELD)
    seated = fed.address(5) in fed.member(0).fl.committee(job)
    with pytest.raises(errors.GrantRevoked):  # its release of the round: scores, or an update's folded spend
        if seated:
            grantee.spend_privacy(job, 1, 1, SCORES)
        else:
            grantee.submit_update(job, 1, REF, HASH, 10, spend=1)
    # granted again (a re-wrapped key after rotation): the cap never drops below what was spent
    with pytest.raises(errors.InvalidDataset):
        fed.member(1).data.grant(2, fed.address(5), b"wrapped", 1_000_000)


def test_spend_amount_is_bounded_by_the_plan(fed):
    job, _, trainers = _dp_job(fed)
    fl = fed.member(trainers[0]).fl
    with pytest.raises(errors.SpendOutOfBounds) as caught:
        fl.spend_privacy(job, 1, BOUND + 1, UPDATE)
    assert caught.value.args_ == {"jobId": job, "amount": BOUND + 1, "bound": BOUND}
    with pytest.raises(errors.SpendOutOfBounds):
        fl.spend_privacy(job, 1, 0, UPDATE)  # a zero spend would satisfy submitUpdate for free
    fl.spend_privacy(job, 1, BOUND, UPDATE)
    # a job without DP plans no spend: none is accepted
    plain, _, plain_trainers = fed.running_job(participants=5)
    with pytest.raises(errors.SpendOutOfBounds) as caught:
        fed.member(plain_trainers[0]).fl.spend_privacy(plain, 1, 1, UPDATE)
    assert caught.value.args_["bound"] == 0


def test_only_a_participant_of_a_running_job_spends(fed):
    job, _, _ = _dp_job(fed)
    with pytest.raises(errors.NotMember):
        fed.outsider().fl.spend_privacy(job, 1, 1, UPDATE)
    with pytest.raises(errors.NotDrawn):
        fed.member(10).fl.spend_privacy(job, 1, 1, UPDATE)  # a member that did not join
    with pytest.raises(errors.UnknownJob):
        fed.member(1).fl.spend_privacy(2**200, 1, 1, UPDATE)  # the id that overflowed the mirrors
    open_job = fed.member(0).fl.propose_job(fed.spec(max_spend_per_round=BOUND))
    fed.join(open_job, 1, 2)
    with pytest.raises(errors.JobNotRunning):
        fed.member(1).fl.spend_privacy(open_job, 1, 1, UPDATE)
    fed.member(0).fl.cancel(job)
    with pytest.raises(errors.JobIsCancelled):
        fed.member(1).fl.spend_privacy(job, 1, 1, UPDATE)


def test_spend_rounds_and_the_per_round_limit(fed):
    job, committee, trainers = _dp_job(fed, rounds=2)
    t = trainers[0]
    fl = fed.member(t).fl
    with pytest.raises(errors.WrongRound):
        fl.spend_privacy(job, 2, 1, UPDATE)  # the next round only once the current one aggregates
    with pytest.raises(errors.WrongRound):
        fl.spend_privacy(job, 0, 1, UPDATE)
    fl.spend_privacy(job, 1, 1, WITHHELD)  # a speculative update discarded unpublished
    fl.spend_privacy(job, 1, 1, UPDATE)  # its retrain
    fl.spend_privacy(job, 1, 1, WITHHELD)  # an attempt lost to a crash
    with pytest.raises(errors.TooManySpends) as caught:
        fl.spend_privacy(job, 1, 1, UPDATE)
    assert caught.value.args_ == {"jobId": job, "round": 1, "participant": fed.address(t)}
    # the round finalizes: trainers may charge round 2 (speculative training) before it opens
    for i in trainers:
        if i != t:
            fed.member(i).fl.spend_privacy(job, 1, 1, UPDATE)
        fed.member(i).fl.submit_update(job, 1, REF, bytes([i + 1]) * 32, 10)
    for m in committee:
        fed.member(m).fl.spend_privacy(job, 1, 1, SCORES)
    fed.score(job, 1, {m: {fed.address(i): 5000 + i for i in trainers} for m in committee})
    assert fed.member(0).fl.get_job(job).phase is RoundPhase.AGGREGATING
    with pytest.raises(errors.WrongRound):
        fl.spend_privacy(job, 3, 1, UPDATE)
    fl.spend_privacy(job, 2, 1, UPDATE)
    with pytest.raises(errors.WrongRound):  # the round it spent for last is 2: no going back
        fl.spend_privacy(job, 1, 1, UPDATE)
    info = fed.member(0).fl.get_participant(job, fed.address(t))
    assert (info.spend_round, info.spends) == (2, 1)


def test_no_spend_past_the_last_round(fed):
    job, committee, trainers = _dp_job(fed, rounds=1)
    for i in trainers:
        fed.member(i).fl.spend_privacy(job, 1, 1, UPDATE)
        fed.member(i).fl.submit_update(job, 1, REF, bytes([i + 1]) * 32, 10)
    for m in committee:
        fed.member(m).fl.spend_privacy(job, 1, 1, SCORES)
    fed.score(job, 1, {m: {fed.address(i): 5000 + i for i in trainers} for m in committee})
    with pytest.raises(errors.WrongRound):
        fed.member(trainers[0]).fl.spend_privacy(job, 2, 1, UPDATE)


def test_spend_past_the_dataset_cap_is_refused(fed):
    job, _, trainers = _dp_job(fed, max_spend_per_round=2_000_000)
    t = trainers[0]
    fed.member(t).fl.spend_privacy(job, 1, 2_000_000, UPDATE)
    with pytest.raises(errors.PrivacyBudgetExceeded) as caught:
        fed.member(t).fl.spend_privacy(job, 1, 1_000_001, UPDATE)
    assert caught.value.args_ == {
        "datasetId": t + 1,
        "spent": 2_000_000,
        "requested": 1_000_001,
        "cap": 3_000_000,
    }
    # the refused spend did not count as one of the round's
    fed.member(t).fl.spend_privacy(job, 1, 1_000_000, UPDATE)
    data = fed.member(0).data
    assert data.get_source(data.source_of(t + 1)).spent == 3_000_000


def test_a_providers_second_dataset_spends_from_the_same_budget(fed):
    """A copy registered by the same provider (not declared disjoint) cannot reset the budget: a
    spend through it counts against the source its first dataset already spent from."""
    job, _, trainers = _dp_job(fed, max_spend_per_round=2_000_000)
    t = trainers[0]
    fed.member(t).fl.spend_privacy(job, 1, 2_000_000, UPDATE)
    copy = fed.member(t).data.register_dataset(b"\x99" * 32, b"\x02" * 32, b"\x05" * 32, 100, 3_000_000)
    job2 = fed.member(0).fl.propose_job(fed.spec(max_spend_per_round=2_000_000))
    fed.join(job2, t, copy)
    others = [i for i in range(8) if i != t][:4]
    for i in others:
        fed.join(job2, i)
    fed.member(0).fl.start_job(job2)
    fed.reveal_all(job2, [t, *others])
    with pytest.raises(errors.PrivacyBudgetExceeded):
        fed.member(t).fl.spend_privacy(job2, 1, 1_500_000, UPDATE)


def test_a_reveal_of_scores_needs_the_members_score_spend_in_a_dp_job(fed):
    """Scores are a release: a committee member that recorded no score spend cannot reveal them
    (nor commit-and-reveal), so no round finalizes on unaccounted scores."""
    job, committee, trainers = _dp_job(fed, participants=6)
    for t in trainers:
        fed.member(t).fl.submit_update(job, 1, bytes([t]) * 32, bytes([t + 100]) * 32, 10, spend=1)
    scores = {fed.address(t): 6000 for t in trainers}
    for m in committee:
        fed.member(m).fl.commit_scores(job, 1, scores, 5000, salt(m))
    with pytest.raises(errors.SpendMissing) as caught:
        fed.member(committee[0]).fl.reveal_scores(job, 1, scores, 5000, salt(committee[0]))
    assert caught.value.args_["trainer"] == fed.address(committee[0])
    fed.member(committee[0]).fl.spend_privacy(job, 1, 1, UPDATE)
    with pytest.raises(errors.SpendMissing):  # an update spend is not a score spend
        fed.member(committee[0]).fl.reveal_scores(job, 1, scores, 5000, salt(committee[0]))
    for m in committee:
        fed.member(m).fl.spend_privacy(job, 1, 1, SCORES)
    receipts = [fed.member(m).fl.reveal_scores(job, 1, scores, 5000, salt(m)) for m in committee]
    assert receipts[-1].event("RoundFinalized").args["round"] == 1


def test_submit_update_requires_the_rounds_spend_in_a_dp_job(fed):
    job, committee, trainers = _dp_job(fed, rounds=2)
    t = trainers[0]
    fl = fed.member(t).fl
    with pytest.raises(errors.SpendMissing) as caught:
        fl.submit_update(job, 1, REF, HASH, 10)
    assert caught.value.args_ == {"jobId": job, "round": 1, "trainer": fed.address(t)}
    fl.spend_privacy(job, 1, 1, UPDATE)
    fl.submit_update(job, 1, REF, HASH, 10)
    committee, trainers = _finish_round(fed, job, 1, committee, trainers)
    assert fed.member(0).fl.get_job(job).round == 2
    # round 1's spend does not cover round 2
    t2 = next(i for i in trainers if fed.member(0).fl.get_participant(job, fed.address(i)).spend_round == 1)
    with pytest.raises(errors.SpendMissing):
        fed.member(t2).fl.submit_update(job, 2, REF, HASH, 10)
    fed.member(t2).fl.spend_privacy(job, 2, 1, UPDATE)
    fed.member(t2).fl.submit_update(job, 2, REF, HASH, 10)


def test_submit_update_in_a_job_without_dp_needs_no_spend(fed):
    job, _, trainers = fed.running_job(participants=5)
    fed.member(trainers[0]).fl.submit_update(job, 1, REF, HASH, 10)


def test_update_samples_are_bounded_by_the_registered_dataset(fed):
    job, _, trainers = fed.running_job(participants=5)
    t = trainers[0]  # dataset t + 1 holds 100 + t samples
    with pytest.raises(errors.SamplesAboveDataset) as caught:
        fed.member(t).fl.submit_update(job, 1, REF, HASH, 101 + t)
    assert caught.value.args_ == {"samples": 101 + t, "registered": 100 + t}
    with pytest.raises(errors.SamplesAboveDataset):
        fed.member(t).fl.submit_update(job, 1, REF, HASH, 2**64 - 1)
    receipt = fed.member(t).fl.submit_update(job, 1, REF, HASH, 100 + t)
    assert receipt.event("UpdateSubmitted").args["samples"] == 100 + t
