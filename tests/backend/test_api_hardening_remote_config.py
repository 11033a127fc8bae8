"""backend.jobs.remote_config: a config from another node is bounded by this node's limits and must
say what the on-chain spec says, or the job is declined with a sentence."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from backend.jobs.remote_config import (
    LocalSchema,
    NodeLimits,
    RemoteConfigRejected,
    check_remote_config,
)
from fl_node.job.config import DPConfig, JobConfig
from fl_node.job.plan import planned_spend_bound
from tests.builders import job_config

LIMITS = NodeLimits(
    max_model_params=2_000_000, max_batch_size=1024, max_local_epochs=20, max_rounds=100, max_period_s=86_400
)
SCHEMA = LocalSchema(feature_shape=(64,), num_classes=10)
NOW = 1_000_000


def honest_config(**changes) -> JobConfig:
    base = job_config(
        name="digits",
        input_shape=(64,),
        num_classes=10,
        schema_hash="ab" * 32,
        rounds=3,
        local_epochs=1,
        batch_size=32,
        dp=DPConfig(mode="sgd", target_epsilon=5.0),
        committee_size=2,
        top_k=2,
        min_trainers=2,
        round_timeout_s=300,
        score_timeout_s=120,
        join_timeout_s=3600,
    )
    return dataclasses.replace(base, **changes)


def spec_of(config: JobConfig, **changes) -> SimpleNamespace:
    """The on-chain job as services.create_job proposes it for ``config``."""

    job = dict(
        job_id=7,
        rounds=config.rounds,
        committee_size=config.committee_size,
        top_k=config.top_k,
        min_trainers=config.min_trainers,
        use_blocks=False,
        join_deadline=NOW - 10 + config.join_timeout_s,
        train_period=config.round_timeout_s,
        score_period=config.score_timeout_s,
        margin=config.margin_bp,
    )
    job["max_spend_per_round"] = planned_spend_bound(config)
    return SimpleNamespace(**(job | changes))


def decline_reason(config: JobConfig, job=None, schema=SCHEMA) -> str:
    with pytest.raises(RemoteConfigRejected) as declined:
        check_remote_config(job or spec_of(config), config, limits=LIMITS, schema=schema, now=NOW)
    assert str(declined.value).startswith("this node declines job 7: ")
    return declined.value.reason


def test_an_honest_config_passes():
    config = honest_config()
    check_remote_config(spec_of(config), config, limits=LIMITS, schema=SCHEMA, now=NOW)
    check_remote_config(spec_of(config), config, limits=LIMITS, schema=None, now=None)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"local_epochs": 10**9}, "1000000000 local epochs is more than this node's limit of 20"),
        ({"batch_size": 10**7}, "batch size 10000000 is more than this node's limit of 1024"),
        ({"rounds": 5000}, "5000 rounds is more than this node's limit of 100"),
        ({"round_timeout_s": 10**12}, "round_timeout_s 1000000000000 is longer than"),
        ({"model_options": {"hidden": 10**9}}, "model_options.hidden = 1000000000 is outside [1, 65536]"),
        ({"model_options": {f"k{i}": 1 for i in range(40)}}, "model_options has more than 16 entries"),
        ({"model_options": {"hidden": [1] * 100}}, "lists more than 8 values"),
        ({"model_options": {"hidden": {"nested": 1}}}, "is not a number, a flag or a short text"),
        ({"model_options": {"hidden": 60_000}}, "more than this node's limit of 2000000"),
        ({"input_shape": (1, 8, 8)}, "differs from this node's datasets of the job's schema ([64])"),
        ({"num_classes": 11}, "it has 11 classes where this node's datasets of the job's schema have 10"),
        ({"name": "x" * 500}, "its name is longer than 200 characters"),
        ({"seed": 2**70}, "its seed is not an integer"),
        ({"model_options": {"act": "no-such-activation"}}, "its model cannot be built: ValueError"),
        ({"schema_hash": "x" * 70_000}, "its schema hash is not 64 hex digits"),
        ({"lr": 1e300}, "its learning rate is not a number up to 1000.0"),
        ({"dp": DPConfig(mode="sgd", target_epsilon=1e12)}, "dp.target_epsilon 1000000000000.0 is above"),
        ({"dp": DPConfig(mode="sgd", target_epsilon=5.0, delta=1e-300)}, "dp.delta 1e-300 is below"),
    ],
)
def test_a_config_outside_this_nodes_limits_is_declined_with_the_reason(changes, reason):
    assert reason in decline_reason(honest_config(**changes))


def test_a_huge_model_is_measured_without_allocating_it():
    # 64 x 4M + 4M x 10 weights would be 1.2 GB of float32; on the meta device they cost nothing.
    limits = dataclasses.replace(LIMITS, max_model_params=10**12)
    config = honest_config(model="text", input_shape=(50,), model_options={"vocab_size": 4_000_000})
    check_remote_config(spec_of(config), config, limits=limits, schema=None)
    assert "more than this node's limit of 2000000" in decline_reason(config, schema=None)


def test_without_a_local_dataset_the_shape_is_only_bounded():
    config = honest_config(input_shape=(4096, 4096, 4))
    assert "has more than 16777216 elements" in decline_reason(config, schema=None)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("rounds", 4, "its config says rounds 3 where the on-chain job spec says 4"),
        ("committee_size", 3, "committee_size 2 where the on-chain job spec says 3"),
        ("top_k", 1, "top_k 2 where the on-chain job spec says 1"),
        ("min_trainers", 9, "min_trainers 2 where the on-chain job spec says 9"),
        ("train_period", 30, "train_period 300 where the on-chain job spec says 30"),
        ("score_period", 5, "score_period 120 where the on-chain job spec says 5"),
        ("use_blocks", True, "its on-chain deadlines count blocks"),
        ("join_deadline", NOW + 10**9, "join deadline is later than the config's join_timeout_s"),
    ],
)
def test_a_config_that_differs_from_the_on_chain_spec_is_declined(field, value, reason):
    config = honest_config()
    assert reason in decline_reason(config, spec_of(config, **{field: value}))


def test_a_privacy_bound_that_differs_from_the_config_is_declined():
    config = honest_config()
    job = spec_of(config, max_spend_per_round=planned_spend_bound(config) * 10)
    assert "max_spend_per_round" in decline_reason(config, job)


def test_the_decline_is_a_409_for_the_api():
    from backend.api.errors import Conflict

    assert issubclass(RemoteConfigRejected, Conflict)
    assert RemoteConfigRejected.status_code == 409


@pytest.mark.parametrize(
    ("dp", "reason"),
    [
        ({"target_epsilon": None}, "a private job needs a positive target epsilon"),
        ({"mode": "update", "target_epsilon": None}, "a private job needs a positive target epsilon"),
        ({"target_epsilon": 0.0}, "a private job needs a positive target epsilon"),
        ({"delta": None}, "not supported between instances of 'int' and 'NoneType'"),
        ({"max_grad_norm": None}, "must be a positive number"),
    ],
)
def test_a_private_config_without_its_privacy_terms_never_reaches_the_bounds(dp, reason):
    # check_remote_config compares a private job's epsilon, delta and clip norm with bounds: a
    # fetched configuration without them is refused as it is read (ConfigError: discover's 409).
    from fl_node.job.config import ConfigError

    data = honest_config().as_dict()
    data["dp"] |= dp
    with pytest.raises(ConfigError) as refused:
        JobConfig.from_bytes(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    assert reason in str(refused.value)
