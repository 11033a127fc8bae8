"""The contract's committee rule equals fl_node.committee.decide_round, bit for bit.

Hundreds of drawn rounds go through CommitteeRuleHarness (the same library the contract runs)
with eth_call; a few drawn rounds go through submitUpdate / commitScores / revealScores /
finalizeRound (the last reveal finalizes the round itself; finalizeRound runs when no member
revealed).
Both draw the members' scores of the base model and the job's margin: accepted iff the median
beats the base scores' median by more than the margin.
"""

from __future__ import annotations

import pytest
from eth_utils import to_checksum_address
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.ledger.contracts import pack_scores
from fl_node.committee import MAX_SCORE, decide_round, draw_committee

# Hundreds of EVM calls (py-evm runs ~100k opcodes/s): minutes on 2 cores, so `make test` only.
pytestmark = pytest.mark.slow

MARGINS = st.one_of(st.just(0), st.sampled_from([1, 100, 5000, MAX_SCORE]), st.integers(0, MAX_SCORE))
# Few distinct values make ties (equal medians, even-count midpoints) frequent.
SCORES = st.one_of(st.sampled_from([0, 1, 2, 5000, 5001, 9999, MAX_SCORE]), st.integers(0, MAX_SCORE))


@st.composite
def rounds(draw):
    # mostly small rounds (py-evm runs ~100k opcodes/s), sometimes the full 15 seats
    committee_size = draw(st.one_of(st.integers(1, 5), st.integers(1, 15)))
    n_trainers = draw(st.one_of(st.integers(0, 8), st.integers(0, 20)))
    ids = draw(
        st.lists(
            st.integers(1, 2**160 - 1),
            min_size=n_trainers + committee_size,
            max_size=n_trainers + committee_size,
            unique=True,
        )
    )
    addresses = [to_checksum_address(f"0x{i:040x}") for i in ids]
    trainers, committee = addresses[:n_trainers], addresses[n_trainers:]
    scores = {}
    for member in committee:
        if draw(st.booleans()) and draw(st.booleans()):
            continue  # this member never submitted
        chosen = draw(st.lists(st.sampled_from(trainers), unique=True)) if trainers else []
        if draw(st.booleans()):
            chosen = trainers  # scored every update
        scores[member] = {t: draw(SCORES) for t in chosen}
    # the base model's scores: from the members who scored (each gives one on chain)
    base = {m: draw(SCORES) for m in scores if draw(st.integers(0, 5))}
    top_k = draw(st.integers(1, 26))
    seed = draw(st.one_of(st.just(bytes(32)), st.binary(min_size=32, max_size=32)))
    return trainers, committee, scores, top_k, base, draw(MARGINS), seed


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds())
def test_rule_harness_equals_reference(federation_base, drawn):
    trainers, committee, scores, top_k, base, margin, seed = drawn
    expected = decide_round(trainers, scores, top_k=top_k, base_scores=base, margin=margin, seed=seed)
    packed = [
        pack_scores({seat: scores[m][t] for seat, m in enumerate(committee) if t in scores.get(m, {})})
        for t in trainers
    ]
    packed_base = pack_scores({seat: base[m] for seat, m in enumerate(committee) if m in base})
    got = federation_base.rule.decide(trainers, packed, top_k, len(committee), packed_base, margin, seed)
    assert got.base_median == expected.base_median
    assert got.medians == [expected.medians[t] for t in trainers]
    assert got.accepted == expected.accepted


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    committee_size=st.integers(1, 3),
    trainers=st.integers(1, 5),
    top_k=st.integers(1, 4),
    margin=MARGINS,
    data=st.data(),
)
def test_onchain_rounds_equal_reference(fed, committee_size, trainers, top_k, margin, data):
    tester = fed.tester
    snapshot = tester.take_snapshot()
    try:
        participants = committee_size + trainers
        job, committee, trainer_ids = fed.running_job(
            participants=participants,
            committee_size=committee_size,
            top_k=top_k,
            min_trainers=1,
            margin=margin,
        )
        submitted = [t for t in trainer_ids if data.draw(st.booleans(), label=f"submits {t}")] or trainer_ids[
            :1
        ]
        for t in submitted:
            fed.member(t).fl.submit_update(job, 1, bytes([t]) * 32, bytes([t + 1]) * 32, 10)
        fed.advance(601)  # close training so that scoring opens even with missing updates
        given, base_by_index = {}, {}
        for m in committee:
            if data.draw(st.booleans(), label=f"member {m} silent"):
                continue
            given[m] = {fed.address(t): data.draw(SCORES, label=f"{m}->{t}") for t in submitted}
            base_by_index[m] = data.draw(SCORES, label=f"{m}->base")
            fed.member(m).fl.commit_scores(job, 1, given[m], base_by_index[m], bytes([m + 1]) * 32)
        if len(given) < committee_size:  # a member was silent: reveals open at the commit deadline
            fed.advance(301)
        receipt = None
        for m in given:
            receipt = fed.member(m).fl.reveal_scores(job, 1, given[m], base_by_index[m], bytes([m + 1]) * 32)
        if not given:  # nobody committed: anyone finalizes once the commit deadline passed
            receipt = fed.member(11).fl.finalize_round(job, 1)
        scores = {fed.address(m): v for m, v in given.items()}
        base = {fed.address(m): v for m, v in base_by_index.items()}
        outcome = receipt.event("RoundFinalized").args
        seed = bytes.fromhex(outcome["seed"].removeprefix("0x"))  # from the revealed salts
        expected = decide_round(
            [fed.address(t) for t in submitted],
            scores,
            top_k=top_k,
            base_scores=base,
            margin=margin,
            seed=seed,
        )
        assert outcome["baseMedian"] == expected.base_median and outcome["margin"] == margin
        assert outcome["trainers"] == [fed.address(t) for t in submitted]
        assert outcome["accepted"] == expected.accepted
        assert outcome["nextCommittee"] == draw_committee(
            seed, [fed.address(i) for i in range(participants)], committee_size
        )
        assert outcome["medians"] == [expected.medians[fed.address(t)] for t in submitted]
    finally:
        tester.revert_to_snapshot(snapshot)
        for ledger in fed.ledgers:
            ledger.client.nonces.reset()
