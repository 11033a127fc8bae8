"""The contracts' limits are fl_node.job.limits': read from the deployed contracts through their ABI.

The Solidity constants cannot take their values at deployment (the committee is a fixed-size
array in storage), so this test is what keeps the two sources equal: change one without the
other and it fails.
"""

from __future__ import annotations

import pytest

from backend.ledger import errors
from backend.ledger.artifacts import load_artifact
from backend.ledger.resources import JobSpec
from fl_node.job import limits


def _constant(contract, name: str) -> int:
    return int(contract._call(name)[0])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_ROUNDS", limits.MAX_ROUNDS),
        ("MAX_COMMITTEE", limits.MAX_COMMITTEE),
        ("MAX_PARTICIPANTS", limits.MAX_PARTICIPANTS),
        ("MAX_SCORE", limits.MAX_MARGIN_BP),
        ("MAX_PERIOD", limits.MAX_PERIOD_S),
        ("MAX_JOIN_WINDOW", limits.MAX_JOIN_WINDOW_S),
        ("MAX_SPEND_PER_ROUND", limits.MAX_SPEND_PER_ROUND_MICRO),
    ],
)
def test_federated_learning_constants_are_the_python_limits(fed, name, value):
    assert _constant(fed.member(0).fl, name) == value


def test_data_registry_cap_is_the_python_limit(fed):
    assert _constant(fed.member(0).data, "MAX_PRIVACY_CAP") == limits.MAX_PRIVACY_CAP_MICRO


def test_top_k_is_bounded_by_the_contract_type():
    # proposeJob's spec stores topK as an unsigned integer of some width: its largest value is the limit.
    (propose,) = [e for e in load_artifact("FederatedLearning").abi if e.get("name") == "proposeJob"]
    (top_k,) = [c for c in propose["inputs"][0]["components"] if c["name"] == "topK"]
    assert top_k["type"].startswith("uint")
    assert 2 ** int(top_k["type"].removeprefix("uint")) - 1 == limits.MAX_TOP_K


def _at_limits(fed, **overrides) -> JobSpec:
    values = dict(
        rounds=limits.MAX_ROUNDS,
        committee_size=limits.MAX_COMMITTEE,
        top_k=limits.MAX_TOP_K,
        min_trainers=limits.MAX_PARTICIPANTS - limits.MAX_COMMITTEE,
        train_period=limits.MAX_PERIOD_S,
        score_period=limits.MAX_PERIOD_S,
        join_deadline=fed.now() + limits.MAX_JOIN_TIMEOUT_S,
        max_spend_per_round=limits.MAX_SPEND_PER_ROUND_MICRO,
    )
    return fed.spec(**(values | overrides))


def test_the_chain_takes_a_job_at_every_python_limit(fed):
    fl = fed.member(0).fl
    state = fl.get_job(fl.propose_job(_at_limits(fed)))
    assert (state.rounds, state.committee_size, state.top_k) == (
        limits.MAX_ROUNDS,
        limits.MAX_COMMITTEE,
        limits.MAX_TOP_K,
    )


@pytest.mark.parametrize(
    "past",
    [
        {"rounds": limits.MAX_ROUNDS + 1},
        {"committee_size": limits.MAX_COMMITTEE + 1, "min_trainers": 2},
        {"min_trainers": limits.MAX_PARTICIPANTS - limits.MAX_COMMITTEE + 1},
        {"train_period": limits.MAX_PERIOD_S + 1},
        {"max_spend_per_round": limits.MAX_SPEND_PER_ROUND_MICRO + 1},
    ],
)
def test_the_chain_refuses_a_job_one_past_a_python_limit(fed, past):
    with pytest.raises(errors.InvalidJobSpec):
        fed.member(0).fl.propose_job(_at_limits(fed, **past))
