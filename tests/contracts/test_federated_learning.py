"""FederatedLearning: every rule and every custom error, on the in-process chain."""

from __future__ import annotations

import pytest

from backend.ledger import errors
from backend.ledger.resources import JobStatus, RoundPhase
from fl_node.committee import decide_round, draw_committee

REF, HASH, MODEL = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32  # as in conftest.Federation.spec


def salt(member: int) -> bytes:
    return bytes([member + 1]) * 32  # as conftest.Federation.score uses


def _train(fed, job, round_, trainers, samples=10):
    for t in trainers:
        fed.member(t).fl.submit_update(job, round_, bytes([t]) * 32, bytes([t + 100]) * 32, samples)


def _score_all(fed, job, round_, committee, trainers, score=lambda m, t: 5000 + 100 * t - m):
    """Every member commits, then reveals; the reveal receipts in order (the last finalized the round)."""
    return fed.score(job, round_, {m: {fed.address(t): score(m, t) for t in trainers} for m in committee})


def _expected(fed, committee, trainers, top_k, score=lambda m, t: 5000 + 100 * t - m, seed=bytes(32)):
    return decide_round(
        [fed.address(t) for t in trainers],
        {fed.address(m): {fed.address(t): score(m, t) for t in trainers} for m in committee},
        top_k=top_k,
        seed=seed,
    )


def _seed(outcome) -> bytes:
    return bytes.fromhex(outcome["seed"].removeprefix("0x"))


def _vote(fed, job, round_, members, ref=REF, model=MODEL):
    """Each member votes for (model, ref); the receipts (the quorum's fixes the model)."""
    return [fed.member(m).fl.vote_global_model(job, round_, ref, model) for m in members]


def test_propose_job_validates_spec_and_membership(fed):
    with pytest.raises(errors.NotMember):
        fed.outsider().fl.propose_job(fed.spec())
    for field, value in [
        ("rounds", 0),
        ("committee_size", 0),
        ("committee_size", 16),  # 15 seats fit a score slot with its round tag
        ("margin", 10_001),
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
        fed.join(999, 1, 2)
    with pytest.raises(errors.NotMember):
        fed.outsider().fl.join(job, 1, b"\x01" * 32)
    with pytest.raises(errors.DatasetNotUsable):
        fed.join(job, 1, 1)  # member 0's dataset
    with pytest.raises(errors.InvalidUpdate):  # a draw commitment must commit to something
        fl.client.transact(fl.encode("join", job, 2, b"\x00" * 32))
    fed.join(job, 1, 2)
    with pytest.raises(errors.AlreadyJoined):
        fed.join(job, 1, 2)
    # a granted dataset may be used
    fed.member(0).data.grant(1, fed.address(2), b"wrapped", 1_000_000)
    fed.join(job, 2, 1)
    fed.advance(3601)
    with pytest.raises(errors.DeadlinePassed):
        fed.join(job, 3, 4)


def test_start_rules(fed):
    job = fed.member(0).fl.propose_job(fed.spec(committee_size=2, min_trainers=2))
    for i in range(3):
        fed.join(job, i, i + 1)
    with pytest.raises(errors.NotJobProposer):
        fed.member(1).fl.start_job(job)
    with pytest.raises(errors.NotEnoughParticipants):
        fed.member(0).fl.start_job(job)
    fed.join(job, 3, 4)
    opened = fed.member(0).fl.start_job(job)
    assert [e.name for e in opened.events] == ["DrawOpened"]
    with pytest.raises(errors.JobNotOpen):
        fed.join(job, 4, 5)
    with pytest.raises(errors.JobNotOpen):
        fed.member(0).fl.start_job(job)
    assert fed.member(0).fl.get_job(job).status is JobStatus.DRAWING
    receipts = fed.reveal_all(job, range(4))
    assert [e.name for e in receipts[0].events] == ["DrawSecretRevealed"]
    receipt = receipts[-1]  # the reveal that completes the set draws the committee
    assert [e.name for e in receipt.events] == ["DrawSecretRevealed", "JobStarted", "RoundOpened"]
    state = fed.member(0).fl.get_job(job)
    assert state.status is JobStatus.RUNNING and state.round == 1 and state.phase is RoundPhase.TRAINING
    started = receipt.event("JobStarted").args
    assert (
        fed.member(0).fl.committee(job)
        == started["committee"]
        == receipt.event("RoundOpened").args["committee"]
    )


def test_submit_update_rules(fed):
    job, committee, trainers = fed.running_job()
    t = trainers[0]
    fl = fed.member(t).fl
    with pytest.raises(errors.WrongRound):
        fl.submit_update(job, 2, REF, HASH, 1)
    with pytest.raises(errors.CommitteeCannotTrain):
        fed.member(committee[0]).fl.submit_update(job, 1, REF, HASH, 1)
    with pytest.raises(errors.NotDrawn):  # not a participant (none that revealed a draw secret)
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
    # a copy of another trainer's update (its content hash, any reference) is refused, not scored
    copier = fed.member(trainers[1]).fl
    with pytest.raises(errors.DuplicateContent) as caught:
        copier.submit_update(job, 1, REF, HASH, 7)
    assert caught.value.args_["firstTrainer"] == fed.address(t)
    assert copier.content_owner(job, 1, HASH) == fed.address(t)
    assert copier.get_job(job).update_count == 1
    with pytest.raises(errors.ScoringNotOpen):  # updates still missing, deadline not reached
        fed.member(committee[0]).fl.commit_scores(job, 1, {fed.address(t): 1}, 0, salt(0))
    fed.advance(601)
    with pytest.raises(errors.DeadlinePassed):
        fed.member(trainers[1]).fl.submit_update(job, 1, REF, HASH, 1)


def test_commit_reveal_rules(fed):
    """Each member commits to its scores, reveals only once every member committed (or the commit
    deadline passed), and only what it committed; a reveal's contents are checked as scores."""
    job, committee, trainers = fed.running_job(participants=8, committee_size=5)
    _train(fed, job, 1, trainers)
    t0, t1 = fed.address(trainers[0]), fed.address(trainers[1])
    fl = [fed.member(m).fl for m in committee]  # by seat; salt(seat) as each seat's salt
    good = {t0: 9000, t1: 8000}
    with pytest.raises(errors.NotCommitteeMember):
        fed.member(trainers[0]).fl.commit_scores(job, 1, {t1: 10}, 0, salt(0))
    with pytest.raises(errors.InvalidUpdate):
        fl[0].client.transact(fl[0].encode("commitScores", job, 1, b"\x00" * 32))
    fl[0].commit_scores(job, 1, good, 5000, salt(0))
    with pytest.raises(errors.DuplicateScores):
        fl[0].commit_scores(job, 1, good, 5000, salt(0))
    with pytest.raises(errors.RevealNotOpen):  # members may still commit: nobody sees scores yet
        fl[0].reveal_scores(job, 1, good, 5000, salt(0))
    with pytest.raises(errors.NotCommitted):
        fl[1].reveal_scores(job, 1, good, 5000, salt(1))
    # four members commit to payloads that each break one rule when revealed
    unknown = {fed.address(committee[1]): 10}
    fl[1].commit_scores(job, 1, unknown, 0, salt(1))
    fl[2].commit_scores(job, 1, {t0: 10_001}, 0, salt(2))
    raw = {3: ([t0, t0], [1, 2]), 4: ([t0, t1], [1])}  # one trainer twice; lengths differ

    def raw_commitment(m):
        from eth_abi import encode
        from eth_utils import keccak

        trainers_, scores_ = raw[m]
        types = ["uint256", "uint16", "address", "address[]", "uint16[]", "uint16", "bytes32"]
        return keccak(encode(types, [job, 1, fed.address(committee[m]), trainers_, scores_, 0, salt(m)]))

    for m in (3, 4):
        fl[m].client.transact(fl[m].encode("commitScores", job, 1, raw_commitment(m)))
    assert fed.member(0).fl.get_job(job).commit_count == 5
    with pytest.raises(errors.CommitmentMismatch):  # not what it committed to
        fl[0].reveal_scores(job, 1, {t0: 9001, t1: 8000}, 5000, salt(0))
    with pytest.raises(errors.CommitmentMismatch):
        fl[0].reveal_scores(job, 1, good, 5000, salt(9))
    receipt = fl[0].reveal_scores(job, 1, good, 5000, salt(0))
    assert receipt.event("ScoresSubmitted").args["scores"] == [9000, 8000]
    with pytest.raises(errors.DuplicateScores):
        fl[0].reveal_scores(job, 1, good, 5000, salt(0))
    with pytest.raises(errors.UnknownUpdate):
        fl[1].reveal_scores(job, 1, unknown, 0, salt(1))
    with pytest.raises(errors.ScoreOutOfRange):
        fl[2].reveal_scores(job, 1, {t0: 10_001}, 0, salt(2))
    with pytest.raises(errors.DuplicateScores):  # one trainer twice in one reveal
        fl[3].client.transact(fl[3].encode("revealScores", job, 1, *raw[3], 0, salt(3)))
    with pytest.raises(errors.LengthMismatch):
        fl[4].client.transact(fl[4].encode("revealScores", job, 1, *raw[4], 0, salt(4)))
    with pytest.raises(errors.RoundNotFinalizable):  # four committed members have not revealed
        fed.member(11).fl.finalize_round(job, 1)
    fed.advance(1201)
    with pytest.raises(errors.DeadlinePassed):
        fl[1].reveal_scores(job, 1, unknown, 0, salt(1))
    # after the scoring deadline anyone may finalize with the reveals that are in
    receipt = fed.member(11).fl.finalize_round(job, 1)
    assert receipt.event("RoundFinalized").args["accepted"] == [t0, t1]


def test_the_last_commitment_is_revealed_in_the_same_transaction(fed):
    """commitAndRevealScores: only the commitment that completes the set may carry its reveal
    (before, a reveal would show scores to members still free to choose theirs); it counts as
    both, and the reveal that completes the scores finalizes the round as usual."""
    job, committee, trainers = fed.running_job(participants=7, committee_size=3)
    _train(fed, job, 1, trainers)
    scores = {fed.address(t): 7000 + t for t in trainers}
    fl = [fed.member(m).fl for m in committee]
    with pytest.raises(errors.RevealNotOpen):  # two commitments still due
        fl[2].commit_and_reveal_scores(job, 1, scores, 5000, salt(9))
    fl[0].commit_scores(job, 1, scores, 5000, salt(0))
    with pytest.raises(errors.RevealNotOpen):  # one still due
        fl[2].commit_and_reveal_scores(job, 1, scores, 5000, salt(9))
    fl[1].commit_scores(job, 1, scores, 5000, salt(1))
    with pytest.raises(errors.DuplicateScores):  # a committed member reveals with its salt instead
        fl[1].commit_and_reveal_scores(job, 1, scores, 5000, salt(9))
    with pytest.raises(errors.NotCommitteeMember):
        fed.member(trainers[0]).fl.commit_and_reveal_scores(job, 1, scores, 5000, salt(9))
    both = fl[2].commit_and_reveal_scores(job, 1, scores, 5000, salt(9))
    assert both.event("ScoresCommitted").args["member"] == fed.address(committee[2])
    assert both.event("ScoresSubmitted").args["scores"] == list(scores.values())
    assert "RoundFinalized" not in {e.name for e in both.events}  # two reveals still due
    state = fed.member(0).fl.get_job(job)
    assert (state.commit_count, state.score_count) == (3, 1)
    with pytest.raises(errors.DuplicateScores):
        fl[2].commit_and_reveal_scores(job, 1, scores, 5000, salt(9))
    fl[0].reveal_scores(job, 1, scores, 5000, salt(0))
    last = fl[1].reveal_scores(job, 1, scores, 5000, salt(1))
    assert last.event("RoundFinalized").args["round"] == 1


def test_a_combined_reveal_gets_the_reveals_checks_and_a_refused_one_changes_nothing(fed):
    """The worst a last member can send in commitAndRevealScores: the same refusals as a reveal,
    and the commitment it tried to record is not recorded (it may then send a good one)."""
    job, committee, trainers = fed.running_job(participants=4, committee_size=1, top_k=2)
    _train(fed, job, 1, trainers)
    fl = fed.member(committee[0]).fl
    t0, t1 = fed.address(trainers[0]), fed.address(trainers[1])
    with pytest.raises(errors.ScoreOutOfRange):
        fl.commit_and_reveal_scores(job, 1, {t0: 10_001}, 5000, salt(9))
    with pytest.raises(errors.UnknownUpdate):  # a committee member is no trainer of the round
        fl.commit_and_reveal_scores(job, 1, {fed.address(committee[0]): 1}, 5000, salt(9))
    with pytest.raises(errors.LengthMismatch):
        fl.client.transact(fl.encode("commitAndRevealScores", job, 1, [t0, t1], [1], 0, salt(9)))
    with pytest.raises(errors.DuplicateScores):  # one trainer twice
        fl.client.transact(fl.encode("commitAndRevealScores", job, 1, [t0, t0], [1, 2], 0, salt(9)))
    assert fed.member(0).fl.get_job(job).commit_count == 0
    assert "RoundFinalized" in {
        e.name for e in fl.commit_and_reveal_scores(job, 1, {t0: 9000}, 5000, salt(9)).events
    }


def test_a_committee_of_one_scores_in_one_transaction(fed):
    job, committee, trainers = fed.running_job(participants=4, committee_size=1, top_k=2)
    _train(fed, job, 1, trainers)
    (member,) = committee
    receipt = fed.member(member).fl.commit_and_reveal_scores(
        job, 1, {fed.address(t): 9000 for t in trainers}, 5000, salt(9)
    )
    assert {"ScoresCommitted", "ScoresSubmitted", "RoundFinalized"} <= {e.name for e in receipt.events}


def test_the_combined_commitment_keeps_the_commit_deadline(fed):
    job, committee, trainers = fed.running_job(participants=4, committee_size=1, top_k=2)
    _train(fed, job, 1, trainers)
    fed.advance(600 + 301)  # past the update deadline and half the score period
    with pytest.raises(errors.DeadlinePassed):
        fed.member(committee[0]).fl.commit_and_reveal_scores(
            job, 1, {fed.address(trainers[0]): 1}, 0, salt(9)
        )


def test_commit_deadline_makes_a_silent_member_absent(fed):
    """A member that does not commit by the commit deadline is absent: the others reveal after the
    deadline, and the last of them finalizes the round without waiting for the score deadline."""
    job, committee, trainers = fed.running_job(participants=6)
    _train(fed, job, 1, trainers)
    given = {m: {fed.address(t): 6000 + t for t in trainers} for m in committee[:2]}
    for m, scores in given.items():
        fed.member(m).fl.commit_scores(job, 1, scores, 5000, salt(m))
    with pytest.raises(errors.RevealNotOpen):
        fed.member(committee[0]).fl.reveal_scores(job, 1, given[committee[0]], 5000, salt(committee[0]))
    fed.advance(601 + 301)  # past the update deadline and the commit deadline (half the score period)
    with pytest.raises(errors.DeadlinePassed):
        fed.member(committee[2]).fl.commit_scores(job, 1, given[committee[0]], 5000, salt(committee[2]))
    first = fed.member(committee[0]).fl.reveal_scores(job, 1, given[committee[0]], 5000, salt(committee[0]))
    assert [e.name for e in first.events] == ["ScoresSubmitted"]
    last = fed.member(committee[1]).fl.reveal_scores(job, 1, given[committee[1]], 5000, salt(committee[1]))
    assert last.event("RoundFinalized").args["accepted"]


def test_margin_rule_needs_updates_to_beat_the_base_model(fed):
    """Accepted iff median > median(base scores) + margin, as fl_node.committee.decide_round says;
    a member cannot carry an update alone, and a model no better than the base never passes."""
    job, committee, trainers = fed.running_job(participants=7, margin=150, top_k=4)
    _train(fed, job, 1, trainers)
    # trainer k's scores: the base (5000) plus 0, 100, 151, 400 from the honest pair; one member
    # (seat 2) inflates every update to 10000 and gives the base 0
    gain = dict(zip(trainers, (0, 100, 151, 400), strict=True))
    scores = {m: {t: (10_000 if m == committee[2] else 5000 + gain[t]) for t in trainers} for m in committee}
    base = {m: (0 if m == committee[2] else 5000) for m in committee}
    receipts = fed.score(
        job, 1, {m: {fed.address(t): v for t, v in scores[m].items()} for m in committee}, base
    )
    assert receipts[0].event("ScoresSubmitted").args["baseScore"] == 5000
    outcome = receipts[-1].event("RoundFinalized").args
    expected = decide_round(
        [fed.address(t) for t in trainers],
        {fed.address(m): {fed.address(t): v for t, v in scores[m].items()} for m in committee},
        top_k=4,
        base_scores={fed.address(m): v for m, v in base.items()},
        margin=150,
        seed=_seed(outcome),
    )
    assert expected.base_median == 5000 and outcome["baseMedian"] == 5000 and outcome["margin"] == 150
    # medians are 5000+gain (two honest values and 10000 around them): only +151 and +400 pass
    assert outcome["accepted"] == expected.accepted == [fed.address(trainers[3]), fed.address(trainers[2])]
    assert outcome["trainers"] == [fed.address(t) for t in trainers]
    assert outcome["medians"] == [expected.medians[fed.address(t)] for t in trainers]
    assert fed.member(0).fl.get_base_scores(job, 1) == {0: 5000, 1: 5000, 2: 0}
    assert fed.member(0).fl.get_job(job).margin == 150


def test_score_slots_are_reused_across_rounds(fed):
    """Round 2's scores start empty although round 1 wrote the same slots (round tag)."""
    job, committee, trainers = fed.running_job(participants=6, rounds=2)
    _train(fed, job, 1, trainers)
    last = _score_all(fed, job, 1, committee, trainers)[-1]
    elected = last.event("RoundFinalized").args["nextCommittee"]
    by_address = {fed.address(i): i for i in range(len(fed.ledgers))}
    new_committee = [by_address[a] for a in elected]
    _vote(fed, job, 1, new_committee[:2])
    assert fed.member(0).fl.get_update(job, 2, 0).trainer == "0x" + "0" * 40  # no round-2 update yet
    trainers2 = sorted(set(range(6)) - set(new_committee))
    _train(fed, job, 2, trainers2)
    first = fed.member(0).fl.get_update(job, 2, 0)
    assert first.trainer == fed.address(trainers2[0]) and first.packed_scores == 0
    assert fed.member(0).fl.get_base_scores(job, 2) == {}
    fed.score(
        job, 2, {new_committee[0]: {fed.address(trainers2[0]): 7}, new_committee[1]: {}, new_committee[2]: {}}
    )
    assert fed.member(0).fl.get_update(job, 2, 0).scores_by_seat() == {0: 7}
    assert fed.member(0).fl.get_update(job, 1, 0).trainer == "0x" + "0" * 40  # round 1 is gone


def test_full_job_matches_reference_rule(fed):
    job, committee, trainers = fed.running_job(participants=8, top_k=2, rounds=2)
    drawn = [fed.address(i) for i in range(8)]
    for round_ in (1, 2):
        _train(fed, job, round_, trainers)
        receipt = _score_all(fed, job, round_, committee, trainers)[-1]  # the last scores finalize
        outcome = receipt.event("RoundFinalized").args
        expected = _expected(fed, committee, trainers, top_k=2, seed=_seed(outcome))
        assert outcome["accepted"] == expected.accepted
        assert outcome["trainers"] == [fed.address(t) for t in trainers]
        assert outcome["medians"] == [expected.medians[fed.address(t)] for t in trainers]
        # the next committee is drawn with the round's seed, whatever anyone scored
        assert outcome["nextCommittee"] == draw_committee(_seed(outcome), drawn, 3)
        new_committee = [fed.index(a) for a in outcome["nextCommittee"]]
        assert fed.member(0).fl.committee(job) == outcome["nextCommittee"]
        # the new committee votes: a majority (2 of 3) for one (hash, reference) pair fixes it
        first, second, late = new_committee
        outsider_seat = next(i for i in range(8) if i not in new_committee)
        with pytest.raises(errors.NotCommitteeMember):
            fed.member(outsider_seat).fl.vote_global_model(job, round_, REF, MODEL)
        voted = fed.member(first).fl.vote_global_model(job, round_, b"\x44" * 64, MODEL)
        assert voted.event("GlobalModelVoted").args["votes"] == 1
        with pytest.raises(errors.AlreadyVoted):
            fed.member(first).fl.vote_global_model(job, round_, b"\x44" * 64, MODEL)
        assert fed.member(0).fl.get_vote(job, round_, MODEL, b"\x44" * 64).votes == 1
        receipt = fed.member(second).fl.vote_global_model(job, round_, b"\x44" * 64, MODEL)
        names = [e.name for e in receipt.events]
        assert names[:2] == ["GlobalModelVoted", "GlobalModelFixed"]
        assert receipt.event("GlobalModelFixed").args["proposer"] == fed.address(first)
        with pytest.raises((errors.WrongRound, errors.JobNotRunning)):
            fed.member(late).fl.vote_global_model(job, round_, b"\x44" * 64, MODEL)
        committee, trainers = new_committee, sorted(set(range(8)) - set(new_committee))
        if round_ == 1:
            assert names[2] == "RoundOpened"
    assert names[-1] == "JobFinished"
    state = fed.member(0).fl.get_job(job)
    assert state.status is JobStatus.FINISHED and state.model_hash == MODEL


def test_votes_count_per_pair_and_a_split_committee_fixes_nothing(fed):
    """A right hash with another reference is another pair: its votes do not add up."""
    job, committee, trainers = fed.running_job(participants=6, rounds=2)
    _train(fed, job, 1, trainers)
    elected = [
        fed.index(a)
        for a in _score_all(fed, job, 1, committee, trainers)[-1]
        .event("RoundFinalized")
        .args["nextCommittee"]
    ]
    a = fed.member(elected[0]).fl.vote_global_model(job, 1, REF, MODEL)
    b = fed.member(elected[1]).fl.vote_global_model(job, 1, b"\x55" * 32, MODEL)
    assert [e.name for e in a.events] == [e.name for e in b.events] == ["GlobalModelVoted"]
    assert fed.member(0).fl.get_job(job).phase is RoundPhase.AGGREGATING
    fixed = fed.member(elected[2]).fl.vote_global_model(job, 1, REF, MODEL)
    assert fixed.event("GlobalModelFixed").args["proposer"] == fed.address(elected[0])


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
    expected = _expected(fed, committee, trainers, top_k=2, seed=_seed(outcome))
    assert outcome["round"] == 1
    assert outcome["medians"] == [expected.medians[fed.address(t)] for t in trainers]
    assert outcome["accepted"] == expected.accepted
    state = fed.member(0).fl.get_job(job)
    assert state.status is JobStatus.RUNNING and state.round == 1 and state.phase is RoundPhase.AGGREGATING
    assert fed.member(0).fl.committee(job) == outcome["nextCommittee"]


def test_earlier_scores_do_not_finalize(fed):
    job, committee, trainers = fed.running_job(participants=6)
    _train(fed, job, 1, trainers)
    for m in committee:
        fed.member(m).fl.commit_scores(job, 1, {fed.address(t): 5000 for t in trainers}, 0, salt(m))
    for m in committee[:-1]:
        receipt = fed.member(m).fl.reveal_scores(job, 1, {fed.address(t): 5000 for t in trainers}, 0, salt(m))
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
        fed.member(trainers[0]).fl.vote_global_model(job, 1, REF, MODEL)
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
        fed.join(open_job, 1, 2)


def test_deadlines_in_blocks(fed):
    block = fed.w3.eth.block_number
    job = fed.member(0).fl.propose_job(fed.spec(use_blocks=True, join_deadline=block + 3))
    fed.join(job, 1, 2)
    fed.tester.mine_blocks(3)
    with pytest.raises(errors.DeadlinePassed):
        fed.join(job, 2, 3)


def _drawn(seed: str, participants: list[str], size: int) -> list[str]:
    """The committee JobLogic._drawCommittee seats with ``seed`` (fl_node.committee.draw_committee)."""
    return draw_committee(bytes.fromhex(seed.removeprefix("0x")), participants, size)


def test_overdue_aggregation_is_skipped_and_the_job_never_hangs(fed):
    """A silent drawn committee: after the aggregation deadline anyone skips; the round keeps the
    previous model, the next round is void (its early updates were trained on a model never
    fixed), a committee drawn with a seed fixed at finalization takes the round after it, and a
    skip with no round left finishes the job."""
    job, committee, trainers = fed.running_job(participants=8, rounds=4)
    _train(fed, job, 1, trainers)
    finalized = _score_all(fed, job, 1, committee, trainers)[-1].event("RoundFinalized").args
    assert finalized["aggregateDeadline"] == fed.member(0).fl.get_job(job).score_deadline
    # a trainer of round 2 sends its update early, on its own aggregate of round 1
    early_trainer = next(i for i in range(8) if fed.address(i) not in finalized["nextCommittee"])
    fed.member(early_trainer).fl.submit_update(job, 2, REF, b"\x77" * 32, 10)
    with pytest.raises(errors.AggregationNotOverdue):
        fed.member(11).fl.skip_aggregation(job, 1)
    fed.advance(601)  # the aggregation deadline: one score period after the round finalized
    with pytest.raises(errors.NotMember):
        fed.outsider().fl.skip_aggregation(job, 1)
    receipt = fed.member(11).fl.skip_aggregation(job, 1)  # any member, not only a participant
    skipped = receipt.event("AggregationSkipped").args
    opened = receipt.event("RoundOpened").args
    everyone = [fed.address(i) for i in range(8)]
    assert skipped["modelHash"] == opened["modelHash"] == "0x" + HASH.hex()  # the model carried forward
    assert opened["round"] == 3 and opened["committee"] == skipped["committee"]  # round 2 is void
    drawn = skipped["committee"]
    assert len(set(drawn)) == 3 and set(drawn) <= set(everyone)
    assert drawn == _drawn(skipped["seed"], everyone, 3)
    fl = fed.member(0).fl
    assert fl.committee(job) == drawn and fl.get_job(job).update_count == 0  # the early update voided
    for address in everyone:
        info = fl.get_participant(job, address)
        assert (info.committee_round == 3) == (address in drawn), address
    # the skip's draw is fixed by the round's seed (nobody chooses it by when it calls)
    from fl_node.committee import skip_seed

    assert skipped["seed"] == "0x" + skip_seed(_seed(finalized)).hex()
    # round 3 runs with the drawn committee; its aggregation is skipped too: round 4 is void and
    # none is left, so the job finishes with the model it had
    index = {fed.address(i): i for i in range(8)}
    members3 = [index[a] for a in drawn]
    trainers3 = [i for i in range(8) if i not in members3]
    _train(fed, job, 3, trainers3)
    _score_all(fed, job, 3, members3, trainers3)
    with pytest.raises(errors.AggregationNotOverdue):
        fl.skip_aggregation(job, 3)
    fed.advance(601)
    finished = fl.skip_aggregation(job, 3).event("JobFinished").args
    assert finished["modelHash"] == "0x" + HASH.hex()
    state = fl.get_job(job)
    assert state.status is JobStatus.FINISHED and state.model_hash == HASH
    with pytest.raises(errors.JobNotRunning):
        fl.skip_aggregation(job, 3)


def test_updates_sent_early_count_when_the_round_opens(fed):
    """While round 1 aggregates, round 2's trainers send their updates at once (trained on their
    own aggregate): they are round 2's first updates when the vote opens it, so round 2 can be
    scored in the next block. The committee drawn for round 2 cannot send one; nothing beyond the
    next round is accepted."""
    job, committee, trainers = fed.running_job(participants=7, rounds=2)
    _train(fed, job, 1, trainers)
    finalized = _score_all(fed, job, 1, committee, trainers)[-1].event("RoundFinalized").args
    seated = [fed.index(a) for a in finalized["nextCommittee"]]
    trainers2 = [i for i in range(7) if i not in seated]
    with pytest.raises(errors.CommitteeCannotTrain):
        fed.member(seated[0]).fl.submit_update(job, 2, REF, b"\x70" * 32, 10)
    with pytest.raises(errors.WrongRound):
        fed.member(trainers2[0]).fl.submit_update(job, 3, REF, b"\x70" * 32, 10)
    for t in trainers2:
        fed.member(t).fl.submit_update(job, 2, REF, bytes([t + 0x50]) * 32, 10)
    with pytest.raises(errors.DuplicateUpdate):
        fed.member(trainers2[0]).fl.submit_update(job, 2, REF, b"\x71" * 32, 10)
    state = fed.member(0).fl.get_job(job)
    assert (state.round, state.phase, state.early_count) == (1, RoundPhase.AGGREGATING, len(trainers2))
    _vote(fed, job, 1, seated[:2])  # fixes round 1's model and opens round 2 with its updates in
    state = fed.member(0).fl.get_job(job)
    assert (state.round, state.phase, state.update_count, state.early_count) == (
        2,
        RoundPhase.TRAINING,
        len(trainers2),
        0,
    )
    # every update is in: scoring is open at once, and the round finalizes as any other
    receipt = _score_all(fed, job, 2, seated, trainers2)[-1]
    assert receipt.event("RoundFinalized").args["trainers"] == [fed.address(t) for t in trainers2]


def test_a_model_fixed_in_time_cannot_be_skipped(fed):
    job, committee, trainers = fed.running_job(participants=6, rounds=2)
    _train(fed, job, 1, trainers)
    elected = _score_all(fed, job, 1, committee, trainers)[-1].event("RoundFinalized").args["nextCommittee"]
    index = {fed.address(i): i for i in range(6)}
    _vote(fed, job, 1, [index[elected[0]], index[elected[1]]])
    fed.advance(601)
    with pytest.raises(errors.WrongPhase):  # round 2 is training: nothing to skip
        fed.member(0).fl.skip_aggregation(job, 2)
    with pytest.raises(errors.WrongRound):
        fed.member(0).fl.skip_aggregation(job, 1)
