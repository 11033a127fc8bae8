"""The Python side of the on-chain plan and bounds: what a node sends before the chain refuses it."""

from __future__ import annotations

import math

import pytest

from backend.api.errors import InvalidInput
from backend.datasets import chain as datasets_chain
from fl_node.job.config import DPConfig, JobConfig
from fl_node.job.plan import planned_spend_bound


def _config(**dp) -> JobConfig:
    return JobConfig(
        name="plan",
        model="mlp",
        input_shape=(8,),
        num_classes=2,
        schema_hash="00" * 32,
        rounds=3,
        dp=DPConfig(**dp),
    )


def test_planned_spend_bound_follows_the_config():
    assert planned_spend_bound(_config(mode="none")) == 0  # no DP: no spend accepted or needed
    assert planned_spend_bound(_config(mode="sgd", target_epsilon=3.0)) == 6_000_000
    assert planned_spend_bound(_config(mode="update", target_epsilon=0.1234567)) == math.ceil(
        2 * 0.1234567 * 1_000_000
    )
    # never above what the contract accepts (FederatedLearning.MAX_SPEND_PER_ROUND: epsilon 100)
    assert planned_spend_bound(_config(mode="sgd", target_epsilon=1e13)) == 100_000_000


@pytest.mark.parametrize("cap", [1e13, 100.000001, 0.0, -1.0, float("nan"), float("inf")])
def test_register_dataset_refuses_a_cap_the_chain_would_refuse(cap):
    with pytest.raises(InvalidInput) as caught:
        datasets_chain.register_dataset(
            commitment="11" * 32, swarm_root=b"\x22" * 32, schema_hash="33" * 32, samples=5, epsilon_cap=cap
        )
    assert "epsilon_cap" in str(caught.value)
