"""FederatedLearning: every rule and every custom error, on the in-process chain."""

from __future__ import annotations

import pytest

from backend.ledger import errors
from backend.ledger.resources import JobStatus, RoundPhase
from fl_node.committee import decide_round

REF, HASH, MODEL = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32  # as in conftest.Federation.spec


def _train(fed, job, round_, trainers, samples=10):
    for t in trainers:
        fed.member(t).fl.submit_update(job, round_, bytes([t]) * 32, bytes([t + 100]) * 32, samples)


def _score_all(fed, job, round_, committee, trainers, score=lambda m, t: 5000 + 100 * t - m):
    """Every member scores; returns the receipts in order (the last one finalized the round)."""
    return [
        fed.member(m).fl.submit_scores(job, round_, {fed.address(t): score(m, t) for t in trainers})
        for m in committee
    ]


def _expected(fed, committee, trainers, top_k, score=lambda m, t: 5000 + 100 * t - m):
    return decide_round(
        [fed.address(t) for t in trainers],
        {fed.address(m): {fed.address(t): score(m, t) for t in trainers} for m in committee},
        top_k=top_k,
        committee_size=len(committee),
        current_committee=[fed.address(m) for m in committee],
    )


def test_propose_job_validates_spec_and_membership(fed):
    with pytest.raises(errors.NotMember):
        fed.outsider().fl.propose_job(fed.spec())
    for field, value in [
        ("rounds", 0),
        ("committee_size", 0),
        ("committee_size", 17),
        ("top_k", 0),
        ("min_trainers", 0),
        ("train_period", 0),
        ("join_deadline", 1),
        ("config_hash", b"\x00" * 32),
    ]:
        with pytest.raises(errors.InvalidJobSpec):
            fed.member(0).fl.propose_job(fed.spec(**{field: value}))
    with pytest.raises(errors.InvalidReference):
        fed.member(0).fl.propose_job(fed.spec(initial_model_ref=b"\x01" * 33))
    job = fed.member(0).fl.propose_job(fed.spec(initial_model_ref=b"\x07" * 64))
    state = fed.member(0).fl.get_job(job)
    assert state.status is JobStatus.OPEN and state.model_hash == HASH and state.proposer == fed.address(0)


def test_join_rules(fed):
    fl = fed.member(1).fl
    job = fed.member(0).fl.propose_job(fed.spec())
    with pytest.raises(errors.UnknownJob):
        fl.join(999, 2)
    with pytest.raises(errors.NotMember):
        fed.outsider().fl.join(job, 1)
    with pytest.raises(errors.DatasetNotUsable):
        fl.join(job, 1)  # member 0's dataset
    fl.join(job, 2)
    with pytest.raises(errors.AlreadyJoined):
        fl.join(job, 2)
    # a granted dataset may be used
    fed.member(0).data.grant(1, fed.address(2), b"wrapped")
    fed.member(2).fl.join(job, 1)
    fed.advance(3601)
    with pytest.raises(errors.DeadlinePassed):
        fed.member(3).fl.join(job, 4)


def test_start_rules(fed):
    job = fed.member(0).fl.propose_job(fed.spec(committee_size=2, min_trainers=2))
    for i in range(3):
        fed.member(i).fl.join(job, i + 1)
    committee = [fed.address(0), fed.address(1)]
    with pytest.raises(errors.NotJobProposer):
        fed.member(1).fl.start_job(job, committee)
    with pytest.raises(errors.NotEnoughParticipants):
        fed.member(0).fl.start_job(job, committee)
    fed.member(3).fl.join(job, 4)
    with pytest.raises(errors.LengthMismatch):
        fed.member(0).fl.start_job(job, committee[:1])
    with pytest.raises(errors.InvalidCommittee):
        fed.member(0).fl.start_job(job, [fed.address(0), fed.address(0)])
    with pytest.raises(errors.InvalidCommittee):
        fed.member(0).fl.start_job(job, [fed.address(0), fed.address(9)])  # not a participant
    receipt = fed.member(0).fl.start_job(job, committee)
    assert [e.name for e in receipt.events] == ["JobStarted", "RoundOpened"]
    with pytest.raises(errors.JobNotOpen):
        fed.member(4).fl.join(job, 5)
    state = fed.member(0).fl.get_job(job)
    assert state.status is JobStatus.RUNNING and state.round == 1 and state.phase is RoundPhase.TRAINING
    assert fed.member(0).fl.committee(job) == committee


def test_submit_update_rules(fed):
    job, committee, trainers = fed.running_job()
    t = trainers[0]
    fl = fed.member(t).fl
    with pytest.raises(errors.WrongRound):
        fl.submit_update(job, 2, REF, HASH, 1)
    with pytest.raises(errors.CommitteeCannotTrain):
        fed.member(committee[0]).fl.submit_update(job, 1, REF, HASH, 1)
    with pytest.raises(errors.NotParticipant):
        fed.member(10).fl.submit_update(job, 1, REF, HASH, 1)
    with pytest.raises(errors.NotMember):
        fed.outsider().fl.submit_update(job, 1, REF, HASH, 1)
    with pytest.raises(errors.InvalidReference):
        fl.submit_update(job, 1, b"\x01" * 31, HASH, 1)
    with pytest.raises(errors.InvalidUpdate):
        fl.submit_update(job, 1, REF, HASH, 0)
    receipt = fl.submit_update(job, 1, b"\x09" * 64, HASH, 7)
    event = receipt.event("UpdateSubmitted")
    assert event.args["modelRef"] == "0x" + "09" * 64 and event.args["samples"] == 7
    with pytest.raises(errors.DuplicateUpdate):
        fl.submit_update(job, 1, REF, HASH, 1)
    with pytest.raises(errors.ScoringNotOpen):  # updates still missing, deadline not reached
        fed.member(committee[0]).fl.submit_scores(job, 1, {fed.address(t): 1})
    fed.advance(601)
    with pytest.raises(errors.DeadlinePassed):
        fed.member(trainers[1]).fl.submit_update(job, 1, REF, HASH, 1)


def test_submit_scores_rules(fed):
    job, committee, trainers = fed.running_job(participants=6)
    _train(fed, job, 1, trainers)
    member = fed.member(committee[0]).fl
    t0, t1 = fed.address(trainers[0]), fed.address(trainers[1])
    with pytest.raises(errors.NotCommitteeMember):
        fed.member(trainers[0]).fl.submit_scores(job, 1, {t1: 10})
    with pytest.raises(errors.UnknownUpdate):
        member.submit_scores(job, 1, {fed.address(committee[1]): 10})
    with pytest.raises(errors.ScoreOutOfRange):
        member.submit_scores(job, 1, {t0: 10_001})
    with pytest.raises(errors.LengthMismatch):
        member.client.transact(member.encode("submitScores", job, 1, [t0, t1], [1]))
    with pytest.raises(errors.DuplicateScores):  # one trainer twice in one call
        member.client.transact(member.encode("submitScores", job, 1, [t0, t0], [1, 2]))
    member.submit_scores(job, 1, {t0: 9000, t1: 8000})
    with pytest.raises(errors.DuplicateScores):
        member.submit_scores(job, 1, {t0: 9000})
    with pytest.raises(errors.RoundNotFinalizable):
        fed.member(11).fl.finalize_round(job, 1)
    fed.advance(1201)
    with pytest.raises(errors.DeadlinePassed):
        fed.member(committee[1]).fl.submit_scores(job, 1, {t0: 1})
    # after the scoring deadline anyone may finalize with the scores that are in
    receipt = fed.member(11).fl.finalize_round(job, 1)
    assert receipt.event("RoundFinalized").args["accepted"] == [t0, t1]


def test_full_job_matches_reference_rule(fed):
    job, committee, trainers = fed.running_job(participants=8, top_k=2, rounds=2)
    for round_ in (1, 2):
        _train(fed, job, round_, trainers)
        receipt = _score_all(fed, job, round_, committee, trainers)[-1]  # the last scores finalize
        outcome = receipt.event("RoundFinalized").args
        expected = _expected(fed, committee, trainers, top_k=2)
        assert outcome["accepted"] == expected.accepted
        assert outcome["nextCommittee"] == expected.next_committee
        assert outcome["ranking"] == expected.ranking
        assert outcome["medians"] == [expected.medians[a] for a in expected.ranking]
        new_committee = [
            fed.ledgers.index(next(lg for lg in fed.ledgers if lg.client.address == a))
            for a in expected.next_committee
        ]
        assert fed.member(0).fl.committee(job) == expected.next_committee
        # the new committee aggregates: one proposes, a majority (2 of 3) fixes the model
        proposer, confirmer, late = new_committee
        with pytest.raises(errors.NotCommitteeMember):
            fed.member(committee[0]).fl.propose_global_model(job, round_, REF, MODEL)
        with pytest.raises(errors.ProposalMismatch):
            fed.member(confirmer).fl.confirm_global_model(job, round_, MODEL)
        fed.member(proposer).fl.propose_global_model(job, round_, b"\x44" * 64, MODEL)
        with pytest.raises(errors.AlreadyVoted):
            fed.member(proposer).fl.confirm_global_model(job, round_, MODEL)
        with pytest.raises(errors.ProposalExists):
            fed.member(confirmer).fl.propose_global_model(job, round_, REF, MODEL)
        receipt = fed.member(confirmer).fl.confirm_global_model(job, round_, MODEL)
        names = [e.name for e in receipt.events]
        assert names[:2] == ["GlobalModelConfirmed", "GlobalModelFixed"]
        with pytest.raises((errors.WrongRound, errors.JobNotRunning)):
            fed.member(late).fl.confirm_global_model(job, round_, MODEL)
        committee, trainers = new_committee, sorted(set(range(8)) - set(new_committee))
        if round_ == 1:
            assert names[2] == "RoundOpened"
    assert names[-1] == "JobFinished"
    state = fed.member(0).fl.get_job(job)
    assert state.status is JobStatus.FINISHED and state.model_hash == MODEL


def test_no_node_stays_on_the_committee(fed):
    job, committee, trainers = fed.running_job(participants=6, rounds=3)
    seen = []
    for round_ in (1, 2, 3):
        seen.append(set(committee))
        _train(fed, job, round_, trainers)
        _score_all(fed, job, round_, committee, trainers)  # the last scores finalize the round
        addresses = fed.member(0).fl.committee(job)
        new = [next(i for i in range(12) if fed.address(i) == a) for a in addresses]
        for i, member in enumerate(new):
            fn = fed.member(member).fl
            (
                fn.propose_global_model(job, round_, REF, MODEL)
                if i == 0
                else fn.confirm_global_model(job, round_, MODEL)
            )
            if fed.member(0).fl.get_job(job).phase is RoundPhase.TRAINING or round_ == 3:
                break
        assert not set(new) & set(committee)  # 3 trainers fill all 3 seats: the old committee steps down
        committee, trainers = new, sorted(set(range(6)) - set(new))
    assert seen[0] != seen[1]


def test_last_scores_finalize_the_round(fed):
    job, committee, trainers = fed.running_job(participants=7, top_k=2)
    _train(fed, job, 1, trainers)
    first, second, last = _score_all(fed, job, 1, committee, trainers)
    # the earlier members' scores do not finalize: the round stays in training
    for receipt in (first, second):
        assert [e.name for e in receipt.events] == ["ScoresSubmitted"]
    # the scores that complete the set finalize it in the same transaction, after ScoresSubmitted
    assert [e.name for e in last.events] == ["ScoresSubmitted", "RoundFinalized"]
    outcome = last.event("RoundFinalized").args
    expected = _expected(fed, committee, trainers, top_k=2)
    assert outcome["round"] == 1
    assert outcome["ranking"] == expected.ranking
    assert outcome["medians"] == [expected.medians[a] for a in expected.ranking]
    assert outcome["accepted"] == expected.accepted
    assert outcome["nextCommittee"] == expected.next_committee
    state = fed.member(0).fl.get_job(job)
    assert state.status is JobStatus.RUNNING and state.round == 1 and state.phase is RoundPhase.AGGREGATING
    assert fed.member(0).fl.committee(job) == expected.next_committee


def test_earlier_scores_do_not_finalize(fed):
    job, committee, trainers = fed.running_job(participants=6)
    _train(fed, job, 1, trainers)
    for m in committee[:-1]:
        receipt = fed.member(m).fl.submit_scores(job, 1, {fed.address(t): 5000 for t in trainers})
        assert [e.name for e in receipt.events] == ["ScoresSubmitted"]
    assert fed.member(0).fl.get_job(job).phase is RoundPhase.TRAINING
    with pytest.raises(errors.RoundNotFinalizable):  # a score still due, deadline not passed
        fed.member(11).fl.finalize_round(job, 1)


def test_finalize_after_the_last_scores_reverts(fed):
    job, committee, trainers = fed.running_job(participants=6)
    _train(fed, job, 1, trainers)
    _score_all(fed, job, 1, committee, trainers)
    with pytest.raises(errors.WrongPhase):  # finalized already, by the last scores
        fed.member(11).fl.finalize_round(job, 1)
    fed.advance(1201)  # past the score deadline as well: still finalized once only
    with pytest.raises(errors.WrongPhase):
        fed.member(0).fl.finalize_round(job, 1)


def test_last_scores_with_too_few_updates_fail_the_job(fed):
    # Scoring opens with updates missing only after the update deadline; if every member then
    # scores, the last scores fail the job exactly as finalizeRound would.
    job, committee, trainers = fed.running_job(participants=6, min_trainers=3)
    _train(fed, job, 1, trainers[:2])
    fed.advance(601)
    receipts = _score_all(fed, job, 1, committee, trainers[:2])
    assert all([e.name for e in r.events] == ["ScoresSubmitted"] for r in receipts[:-1])
    assert [e.name for e in receipts[-1].events] == ["ScoresSubmitted", "JobFailed"]
    failed = receipts[-1].event("JobFailed").args
    assert (failed["round"], failed["updates"], failed["minTrainers"]) == (1, 2, 3)
    assert fed.member(0).fl.get_job(job).status is JobStatus.FAILED
    with pytest.raises(errors.JobNotRunning):
        fed.member(0).fl.finalize_round(job, 1)


def test_too_few_updates_fail_the_job(fed):
    job, committee, trainers = fed.running_job(participants=6, min_trainers=3)
    _train(fed, job, 1, trainers[:2])
    fed.advance(1201)
    receipt = fed.member(0).fl.finalize_round(job, 1)
    assert receipt.event("JobFailed").args["updates"] == 2
    assert fed.member(0).fl.get_job(job).status is JobStatus.FAILED
    with pytest.raises(errors.JobNotRunning):
        fed.member(trainers[2]).fl.submit_update(job, 1, REF, HASH, 1)


def test_wrong_phase_and_cancel(fed):
    job, committee, trainers = fed.running_job(participants=5)
    with pytest.raises(errors.WrongPhase):
        fed.member(trainers[0]).fl.propose_global_model(job, 1, REF, MODEL)
    with pytest.raises(errors.NotJobProposer):
        fed.member(1).fl.cancel(job)
    fed.member(0).fl.cancel(job)
    with pytest.raises(errors.JobIsCancelled):
        fed.member(trainers[0]).fl.submit_update(job, 1, REF, HASH, 1)
    with pytest.raises(errors.JobIsCancelled):
        fed.member(0).fl.cancel(job)
    with pytest.raises(errors.JobIsCancelled):
        fed.member(0).fl.finalize_round(job, 1)
    open_job = fed.member(0).fl.propose_job(fed.spec())
    fed.member(0).fl.cancel(open_job)
    with pytest.raises(errors.JobIsCancelled):
        fed.member(1).fl.join(open_job, 2)


def test_deadlines_in_blocks(fed):
    block = fed.w3.eth.block_number
    job = fed.member(0).fl.propose_job(fed.spec(use_blocks=True, join_deadline=block + 3))
    fed.member(1).fl.join(job, 2)
    fed.tester.mine_blocks(3)
    with pytest.raises(errors.DeadlinePassed):
        fed.member(2).fl.join(job, 3)
