"""Issue 14's contract rules: the first committee drawn on chain, committees odd and at least 3 on a
production deployment, and proposals that bind the model hash AND its reference."""

from __future__ import annotations

import pytest
from eth_abi import encode
from eth_utils import keccak

from backend.ledger import errors
from backend.ledger.artifacts import load_artifact
from backend.ledger.contracts import FederatedLearning
from backend.ledger.resources import JobStatus

REF, HASH, MODEL = b"\x11" * 32, b"\x22" * 32, b"\x33" * 32  # as in conftest.Federation.spec
BOGUS = b"\x66" * 64  # another reference (an encrypted-length one: a blob nobody can read)


def _drawn(seed: bytes, participants: list[str], size: int) -> list[str]:
    """_drawCommittee: the participants with the smallest keccak256(abi.encode(seed, address))."""
    return sorted(participants, key=lambda a: keccak(encode(["bytes32", "address"], [seed, a])))[:size]


def _start_seed(fed, receipt, job: int) -> bytes:
    """keccak256(abi.encode(block.prevrandao, blockhash(block.number - 1), jobId)) of the start block.

    eth-tester runs a transaction in a pending block whose prevrandao (mixHash) is 0 and gives the
    block its mixHash only when it mines it; a real chain runs it with the mixHash the block keeps.
    """
    block = fed.w3.eth.get_block(receipt.block_number)
    parent = fed.w3.eth.get_block(receipt.block_number - 1)
    seed = receipt.event("JobStarted").args["seed"]
    candidates = [
        keccak(encode(["uint256", "bytes32", "uint256"], [prevrandao, bytes(parent["hash"]), job]))
        for prevrandao in (int.from_bytes(bytes(block["mixHash"]), "big"), 0)
    ]
    assert seed in ["0x" + c.hex() for c in candidates], "the seed is not the start block's"
    return bytes.fromhex(seed.removeprefix("0x"))


# ------------------------------------------------------------------ the first committee is drawn


def test_start_draws_the_committee_from_the_participants_with_the_block_seed(fed):
    """Not chosen by the proposer: the committee is the participants with the smallest
    keccak(seed, address), the seed a function of the start block and the job; only participants."""
    job = fed.member(0).fl.propose_job(fed.spec(committee_size=5, min_trainers=2))
    joined = [1, 3, 4, 6, 7, 8, 10]  # not the proposer, and not members 2, 5, 9, 11
    for i in joined:
        fed.member(i).fl.join(job, i + 1)
    receipt = fed.member(0).fl.start_job(job)
    started = receipt.event("JobStarted").args
    seed = _start_seed(fed, receipt, job)
    participants = [fed.address(i) for i in joined]
    assert started["committee"] == _drawn(seed, participants, 5)  # seat order: the draw's order
    assert set(started["committee"]) <= set(participants) and len(set(started["committee"])) == 5
    fl = fed.member(0).fl
    assert fl.committee(job) == started["committee"]
    for seat, address in enumerate(started["committee"]):
        info = fl.get_participant(job, address)
        assert (info.committee_round, info.seat) == (1, seat)
    for address in set(participants) - set(started["committee"]):
        assert fl.get_participant(job, address).committee_round == 0  # trains round 1
    # the first round runs with the drawn committee: a drawn member cannot train, the others can
    member = fed.index(started["committee"][0])
    with pytest.raises(errors.CommitteeCannotTrain):
        fed.member(member).fl.submit_update(job, 1, REF, HASH, 1)


def test_the_draw_changes_with_the_block_and_the_job_not_with_the_proposer(fed):
    """Same participants, started in different blocks: different committees, each the one its
    block's seed gives (the proposer only picks when to start, not whom)."""
    committees = set()
    for proposer in (0, 1, 2, 0, 1, 2):
        job = fed.member(proposer).fl.propose_job(fed.spec(committee_size=3, min_trainers=2))
        for i in range(6):
            fed.member(i).fl.join(job, i + 1)
        fed.tester.mine_blocks(1)  # another parent block hash
        receipt = fed.member(proposer).fl.start_job(job)
        drawn = receipt.event("JobStarted").args["committee"]
        assert drawn == _drawn(_start_seed(fed, receipt, job), [fed.address(i) for i in range(6)], 3)
        committees.add(tuple(drawn))
    # six draws of 3 of 6 (20 committees) all alike would mean no randomness (p < 1e-6)
    assert len(committees) > 1


# ------------------------------------------------------------------ committee size


@pytest.fixture
def production_fl(fed):
    """A FederatedLearning deployed without the development flag, on the fixture's registries."""
    deployer = fed.member(0)
    registry = deployer.deployment.address("NodeRegistry")
    data = deployer.deployment.address("DataRegistry")
    address = deployer.client.deploy(
        load_artifact("FederatedLearning"), registry, data, False
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


# ------------------------------------------------------------------ verified proposals


def _aggregating(fed, rounds: int = 1):
    """A job of committee 3 whose round 1 is finalized; (job, elected member indexes by seat)."""
    job, committee, trainers = fed.running_job(participants=7, rounds=rounds)
    for t in trainers:
        fed.member(t).fl.submit_update(job, 1, bytes([t]) * 32, bytes([t + 100]) * 32, 10)
    given = {m: {fed.address(t): 6000 + t for t in trainers} for m in committee}
    elected = fed.score(job, 1, given, {m: 5000 for m in committee})[-1].event("RoundFinalized").args
    return job, [fed.index(a) for a in elected["nextCommittee"]]


def test_a_hijacked_proposal_right_hash_wrong_reference_is_never_fixed_by_honest_votes(fed):
    """A member proposes the right model hash with a bogus reference. An honest member's vote for
    (hash, its own recomputed reference) does not count toward it; the honest pair is proposed and
    fixed, and the chain records the honest reference's digest."""
    job, (hostile, honest1, honest2) = _aggregating(fed)
    fed.member(hostile).fl.propose_global_model(job, 1, BOGUS, MODEL)
    # confirming the hash with the recomputed (right) reference: no such proposal
    with pytest.raises(errors.ProposalMismatch):
        fed.member(honest1).fl.confirm_global_model(job, 1, MODEL, REF)
    # the right pair is a proposal of its own (the hash alone being taken does not block it)
    fed.member(honest1).fl.propose_global_model(job, 1, REF, MODEL)
    fl = fed.member(0).fl
    assert fl.get_proposal(job, 1, MODEL, BOGUS).votes == 1
    assert fl.get_proposal(job, 1, MODEL, REF).votes == 1
    assert fl.get_job(job).model_hash == HASH  # nothing fixed: 1 vote each, quorum 2
    receipt = fed.member(honest2).fl.confirm_global_model(job, 1, MODEL, REF)
    confirmed = receipt.event("GlobalModelConfirmed").args
    assert confirmed["referenceDigest"] == "0x" + keccak(REF).hex() and confirmed["votes"] == 2
    fixed = receipt.event("GlobalModelFixed").args
    assert fixed["referenceDigest"] == "0x" + keccak(REF).hex() and fixed["proposer"] == fed.address(honest1)
    state = fl.get_job(job)
    assert state.status is JobStatus.FINISHED
    assert state.model_hash == MODEL and state.model_ref_digest == keccak(REF)
    assert fl.get_proposal(job, 1, MODEL, BOGUS).votes == 1  # the hijacked pair got no vote


def test_a_confirmation_counts_only_toward_its_own_pair(fed):
    """Votes for (hash, bogus reference) and (hash, reference) never add up: with one vote each
    nothing is fixed, and an oversized or malformed reference is refused outright."""
    job, (first, second, third) = _aggregating(fed)
    with pytest.raises(errors.InvalidReference):
        fed.member(first).fl.propose_global_model(job, 1, b"\x66" * 65, MODEL)
    with pytest.raises(errors.InvalidReference):
        fed.member(first).fl.propose_global_model(job, 1, b"\x66" * 1024, MODEL)
    fed.member(first).fl.propose_global_model(job, 1, BOGUS, MODEL)
    with pytest.raises(errors.ProposalExists):  # the same pair twice
        fed.member(second).fl.propose_global_model(job, 1, BOGUS, MODEL)
    with pytest.raises(errors.ProposalMismatch):  # a pair nobody proposed: no vote spent
        fed.member(second).fl.confirm_global_model(job, 1, MODEL, b"\x67" * 64)
    fed.member(second).fl.propose_global_model(job, 1, REF, MODEL)
    fl = fed.member(0).fl
    assert fl.get_job(job).model_hash == HASH  # 1 + 1 votes for one hash: not a quorum
    # the third member recomputes REF: that pair is fixed, with its reference
    fed.member(third).fl.confirm_global_model(job, 1, MODEL, REF)
    assert fl.get_job(job).model_ref_digest == keccak(REF)


def test_equal_medians_are_ordered_by_the_finalizing_blocks_seed(fed):
    """Ties go by keccak(tieSeed, trainer), tieSeed = keccak(prevrandao, parent hash, job, round) of
    the block that finalizes: not by address, and unknown while updates are sent."""
    job, committee, trainers = fed.running_job(participants=8, top_k=2)
    for t in trainers:
        fed.member(t).fl.submit_update(job, 1, bytes([t]) * 32, bytes([t + 100]) * 32, 10)
    receipt = fed.score(job, 1, {m: {fed.address(t): 7000 for t in trainers} for m in committee})[-1]
    outcome = receipt.event("RoundFinalized").args
    block = fed.w3.eth.get_block(receipt.block_number)
    parent = bytes(fed.w3.eth.get_block(receipt.block_number - 1)["hash"])
    candidates = [  # see _start_seed: eth-tester runs the transaction with prevrandao 0
        "0x" + keccak(encode(["uint256", "bytes32", "uint256", "uint16"], [r, parent, job, 1])).hex()
        for r in (int.from_bytes(bytes(block["mixHash"]), "big"), 0)
    ]
    assert outcome["tieSeed"] in candidates
    seed = bytes.fromhex(outcome["tieSeed"].removeprefix("0x"))
    everyone = [fed.address(t) for t in trainers]
    order = sorted(everyone, key=lambda a: keccak(encode(["bytes32", "address"], [seed, a])))
    assert outcome["ranking"] == order and outcome["accepted"] == order[:2]
    assert outcome["nextCommittee"] == order[:3]
