"""Committees nobody chooses, committees odd and at least 3 on a production deployment, and votes
that bind the model hash AND its reference (issues 14 and 32)."""

from __future__ import annotations

import pytest
from conftest import draw_secret, salt
from eth_utils import keccak

from backend.ledger import errors
from backend.ledger.artifacts import load_artifact
from backend.ledger.contracts import FederatedLearning
from backend.ledger.resources import JobStatus
from fl_node.committee import draw_committee, first_seed, mix_in, round_seed

REF, HASH, MODEL = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32  # as in conftest.Federation.spec
BOGUS = b"\x66" * 64  # another reference (an encrypted-length one: a blob nobody can read)


def _mix(pairs) -> bytes:
    """The XOR mix of (value, address) reveals, as the contract keeps it."""
    mix = bytes(32)
    for value, address in pairs:
        mix = mix_in(mix, value, address)
    return mix


def _started(fed, job, members):
    """Start ``job`` and reveal the draw secrets of ``members``; the receipt that drew the committee."""
    fed.member(fed.index(fed.member(0).fl.get_job(job).proposer)).fl.start_job(job)
    return fed.reveal_all(job, members)[-1]


# ------------------------------------------------------------------ the first committee is drawn


def test_the_first_committee_is_drawn_from_the_revealed_secrets(fed):
    """Not chosen by the proposer: the committee is the participants with the smallest
    keccak(seed, 1, address), the seed the XOR of the draw secrets every participant committed to
    at join; only participants sit."""
    job = fed.member(0).fl.propose_job(fed.spec(committee_size=5, min_trainers=2))
    joined = [1, 3, 4, 6, 7, 8, 10]  # not the proposer, and not members 2, 5, 9, 11
    for i in joined:
        fed.join(job, i, i + 1)
    receipt = _started(fed, job, joined)
    started = receipt.event("JobStarted").args
    participants = [fed.address(i) for i in joined]
    seed = first_seed(_mix((draw_secret(i, job), fed.address(i)) for i in joined), job)
    assert started["seed"] == "0x" + seed.hex()
    assert started["committee"] == draw_committee(seed, participants, 5)  # seat order: the draw's order
    fl = fed.member(0).fl
    assert fl.committee(job) == started["committee"]
    for seat, address in enumerate(started["committee"]):
        info = fl.get_participant(job, address)
        assert (info.committee_round, info.seat) == (1, seat)
    for address in set(participants) - set(started["committee"]):
        assert fl.get_participant(job, address).committee_round == 0  # trains round 1
    member = fed.index(started["committee"][0])
    with pytest.raises(errors.CommitteeCannotTrain):
        fed.member(member).fl.submit_update(job, 1, REF, HASH, 1)


def test_a_grinding_proposer_cannot_choose_the_committee(fed):
    """The proposer (or a contract it delegates to) may start in any block it likes: the draw is the
    same in every one, because no block value enters it. Six starts in six blocks, three proposers."""
    committees = set()
    for attempt, proposer in enumerate((0, 1, 2, 0, 1, 2)):
        fed.tester.mine_blocks(attempt + 1)  # another block, timestamp, parent hash and prevrandao
        snapshot = fed.tester.take_snapshot()
        job = fed.member(proposer).fl.propose_job(fed.spec(committee_size=3, min_trainers=2))
        for i in range(6):
            fed.join(job, i, i + 1)
        committees.add(tuple(_started(fed, job, range(6)).event("JobStarted").args["committee"]))
        fed.tester.revert_to_snapshot(snapshot)
        for ledger in fed.ledgers:
            ledger.client.nonces.reset()
    assert len(committees) == 1  # job ids are equal after the revert: the same secrets, one draw


def test_the_draw_secrets_are_checked_and_a_participant_that_withholds_takes_no_part(fed):
    """A secret other than the committed one is refused; after the reveal deadline anyone draws
    from those that revealed, and a participant that withheld neither sits nor trains."""
    job = fed.member(0).fl.propose_job(fed.spec(committee_size=3, min_trainers=2))
    for i in range(7):
        fed.join(job, i, i + 1)
    fl = fed.member(0).fl
    with pytest.raises(errors.DrawNotOpen):  # the draw opens with the start
        fed.member(1).fl.reveal_draw_secret(job, draw_secret(1, job))
    fl.start_job(job)
    with pytest.raises(errors.DrawSecretMismatch):
        fed.member(1).fl.reveal_draw_secret(job, draw_secret(2, job))  # another member's secret
    with pytest.raises(errors.NotParticipant):
        fed.member(9).fl.reveal_draw_secret(job, draw_secret(9, job))
    fed.reveal_all(job, range(6))  # member 6 withholds its reveal
    with pytest.raises(errors.AlreadyRevealed):
        fed.member(1).fl.reveal_draw_secret(job, draw_secret(1, job))
    with pytest.raises(errors.DrawNotOverdue):
        fed.member(11).fl.draw_committee(job)
    fed.advance(601)  # past the reveal deadline (a score period after the start)
    with pytest.raises(errors.DeadlinePassed):
        fed.member(6).fl.reveal_draw_secret(job, draw_secret(6, job))
    started = fed.member(11).fl.draw_committee(job).event("JobStarted").args
    revealed = [fed.address(i) for i in range(6)]
    seed = first_seed(_mix((draw_secret(i, job), fed.address(i)) for i in range(6)), job)
    assert started["committee"] == draw_committee(seed, revealed, 3)
    assert fed.address(6) not in started["committee"]
    with pytest.raises(errors.NotDrawn):
        fed.member(6).fl.submit_update(job, 1, REF, HASH, 1)
    assert fl.get_job(job).reveal_count == 6 and not fl.get_participant(job, fed.address(6)).drawn


def test_too_few_reveals_fail_the_job(fed):
    job = fed.member(0).fl.propose_job(fed.spec(committee_size=3, min_trainers=2))
    for i in range(5):
        fed.join(job, i, i + 1)
    fed.member(0).fl.start_job(job)
    fed.reveal_all(job, range(4))  # one short of a committee of 3 and 2 trainers
    fed.advance(601)
    failed = fed.member(11).fl.draw_committee(job).event("JobFailed").args
    assert (failed["round"], failed["updates"], failed["minTrainers"]) == (0, 4, 2)
    assert fed.member(0).fl.get_job(job).status is JobStatus.FAILED


# ------------------------------------------------------------------ committee size


@pytest.fixture
def production_fl(fed):
    """A FederatedLearning deployed without the development flag, on the fixture's registries."""
    deployer = fed.member(0)
    registry = deployer.deployment.address("NodeRegistry")
    data = deployer.deployment.address("DataRegistry")
    logic = deployer.deployment.address("JobLogic")
    address = deployer.client.deploy(
        load_artifact("FederatedLearning"), registry, data, False, logic, 0
    ).contract_address
    return lambda i: FederatedLearning(address, fed.member(i).client)


def test_a_production_deployment_refuses_small_and_even_committees(fed, production_fl):
    fl = production_fl(0)
    assert fl.allow_small_committees() is False
    assert fed.member(0).fl.allow_small_committees() is True  # the test deployment is a development one
    for size in (1, 2, 4, 6, 14):
        with pytest.raises(errors.InvalidJobSpec) as caught:
            fl.propose_job(fed.spec(committee_size=size))
        assert "odd and at least 3" in str(caught.value)
    for size in (0, 16):
        with pytest.raises(errors.InvalidJobSpec):
            fl.propose_job(fed.spec(committee_size=size))
    for size in (3, 5, 15):
        job = fl.propose_job(fed.spec(committee_size=size))
        assert fl.get_job(job).committee_size == size


def test_the_development_flag_allows_small_committees(fed):
    for size in (1, 2, 4):
        job = fed.member(0).fl.propose_job(fed.spec(committee_size=size))
        assert fed.member(0).fl.get_job(job).committee_size == size


# ------------------------------------------------------------------ verified votes


def _aggregating(fed, rounds: int = 1):
    """A job of committee 3 whose round 1 is finalized; (job, drawn member indexes by seat)."""
    job, committee, trainers = fed.running_job(participants=7, rounds=rounds)
    for t in trainers:
        fed.member(t).fl.submit_update(job, 1, bytes([t]) * 32, bytes([t + 100]) * 32, 10)
    given = {m: {fed.address(t): 6000 + t for t in trainers} for m in committee}
    drawn = fed.score(job, 1, given, {m: 5000 for m in committee})[-1].event("RoundFinalized").args
    return job, [fed.index(a) for a in drawn["nextCommittee"]]


def test_a_hijacked_pair_right_hash_wrong_reference_is_never_fixed_by_honest_votes(fed):
    """A member votes the right model hash with a bogus reference. The honest members' votes for
    (hash, their own recomputed reference) count toward that pair only, which is fixed, and the
    chain records the honest reference's digest."""
    job, (hostile, honest1, honest2) = _aggregating(fed)
    fed.member(hostile).fl.vote_global_model(job, 1, BOGUS, MODEL)
    fed.member(honest1).fl.vote_global_model(job, 1, REF, MODEL)
    fl = fed.member(0).fl
    assert fl.get_vote(job, 1, MODEL, BOGUS).votes == 1
    assert fl.get_vote(job, 1, MODEL, REF).votes == 1
    assert fl.get_job(job).model_hash == HASH  # nothing fixed: 1 vote each, quorum 2
    receipt = fed.member(honest2).fl.vote_global_model(job, 1, REF, MODEL)
    assert receipt.event("GlobalModelVoted").args["votes"] == 2
    fixed = receipt.event("GlobalModelFixed").args
    assert fixed["referenceDigest"] == "0x" + keccak(REF).hex() and fixed["proposer"] == fed.address(honest1)
    state = fl.get_job(job)
    assert state.status is JobStatus.FINISHED
    assert state.model_hash == MODEL and state.model_ref_digest == keccak(REF)
    assert fl.get_vote(job, 1, MODEL, BOGUS).votes == 1  # the hijacked pair got no other vote


def test_a_malformed_reference_is_refused_and_a_member_votes_once(fed):
    job, (first, second, _third) = _aggregating(fed)
    for reference in (b"\x66" * 65, b"\x66" * 1024, b""):
        with pytest.raises(errors.InvalidReference):
            fed.member(first).fl.vote_global_model(job, 1, reference, MODEL)
    with pytest.raises(errors.InvalidUpdate):
        fed.member(first).fl.vote_global_model(job, 1, REF, b"\x00" * 32)
    fed.member(first).fl.vote_global_model(job, 1, BOGUS, MODEL)
    with pytest.raises(errors.AlreadyVoted):  # not even for another pair
        fed.member(first).fl.vote_global_model(job, 1, REF, MODEL)
    fed.member(second).fl.vote_global_model(job, 1, REF, MODEL)
    assert fed.member(0).fl.get_job(job).model_hash == HASH  # 1 + 1 votes for one hash: not a quorum


# ------------------------------------------------------------------ ties and the next seats


def test_equal_medians_are_ordered_by_the_rounds_seed_from_the_revealed_salts(fed):
    """Ties go by keccak(seed, 0, trainer), seed = keccak(previous seed, mix, round) with the
    committee's revealed salts XORed into the mix: not by address, not by block, unknown while the
    updates are sent, and not chosen by whoever sends the finalizing reveal."""
    job, committee, trainers = fed.running_job(participants=8, top_k=2)
    for t in trainers:
        fed.member(t).fl.submit_update(job, 1, bytes([t]) * 32, bytes([t + 100]) * 32, 10)
    start_seed = bytes.fromhex(fed.member(0).fl.get_job(job).seed.hex())
    receipt = fed.score(job, 1, {m: {fed.address(t): 7000 for t in trainers} for m in committee})[-1]
    outcome = receipt.event("RoundFinalized").args
    mix = _mix(
        [(draw_secret(i, job), fed.address(i)) for i in range(8)]
        + [(salt(m), fed.address(m)) for m in committee]
    )
    seed = round_seed(start_seed, mix, 1)
    assert outcome["seed"] == "0x" + seed.hex()
    everyone = [fed.address(t) for t in trainers]
    order = sorted(everyone, key=lambda a: keccak(seed + bytes(32) + bytes(12) + bytes.fromhex(a[2:])))
    assert outcome["accepted"] == order[:2]
    assert outcome["nextCommittee"] == draw_committee(seed, [fed.address(i) for i in range(8)], 3)
