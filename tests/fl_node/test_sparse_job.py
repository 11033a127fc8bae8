"""The job's sparse policy (fl_node.job.config.SparseConfig, plain Python): validated, canonical, compatible."""

from __future__ import annotations

import json

import pytest
import torch

from fl_node.job import training
from fl_node.job.config import ConfigError, DPConfig, JobConfig, SparseConfig
from fl_node.job.plan import planned_spend_bound
from fl_node.sparse import SparsePolicy, round_public_rows
from tests.builders import job_config as config


def test_default_policy_is_auto_and_omitted_so_older_configurations_keep_their_bytes():
    plain = config()
    assert plain.sparse.policy() == SparsePolicy(encoding="auto", link_bytes_per_s=12.5e6)
    assert "sparse" not in json.loads(plain.to_bytes())
    assert JobConfig.from_bytes(plain.to_bytes()) == plain


def test_a_chosen_policy_round_trips_and_reaches_the_trainer():
    chosen = config(sparse=SparseConfig(encoding="delta", link_mbit=1000.0))
    again = JobConfig.from_bytes(chosen.to_bytes())
    assert again.sparse == SparseConfig("delta", 1000.0)
    assert again.sparse.policy().link_bytes_per_s == 125e6


def test_a_spelled_out_default_is_not_canonical():
    data = json.loads(config().to_bytes())
    data["sparse"] = {"encoding": "auto", "link_mbit": 100.0}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(ConfigError, match="canonical"):
        JobConfig.from_bytes(blob)


@pytest.mark.parametrize(
    "sparse, field",
    [
        ({"encoding": "zip"}, "sparse.encoding"),
        ({"link_mbit": 0}, "sparse.link_mbit"),
        ({"link_mbit": float("nan")}, "sparse.link_mbit"),
        ({"link_mbit": 1e9}, "sparse.link_mbit"),
    ],
)
def test_bad_policies_name_their_field(sparse, field):
    with pytest.raises(ConfigError) as error:
        config(sparse=SparseConfig(**sparse))
    assert error.value.field == field


def test_a_hostile_sparse_entry_is_a_config_error():
    data = json.loads(config().to_bytes())
    for hostile in (["auto"], "auto", {"encoding": "auto", "extra": 1}):
        blob = json.dumps(data | {"sparse": hostile}, sort_keys=True, separators=(",", ":")).encode()
        with pytest.raises(ConfigError):
            JobConfig.from_bytes(blob)


def test_hybrid_row_rule_is_validated_with_the_strategy():
    ok = config(strategy="hybrid", strategy_params={"sparse_names": ["0.weight"], "rows": "all"})
    assert JobConfig.from_bytes(ok.to_bytes()).strategy_params["rows"] == "all"
    with pytest.raises(ConfigError) as error:
        config(strategy="hybrid", strategy_params={"rows": "some"})
    assert error.value.field == "strategy"


def test_tables_and_public_rows_round_trip_and_default_away():
    chosen = config(sparse=SparseConfig(tables=("0.weight",), public_rows=3))
    again = JobConfig.from_bytes(chosen.to_bytes())
    assert again == chosen and again.sparse.policy().tables == frozenset({"0.weight"})
    # A non-default encoding alone keeps the bytes it had before tables and public_rows existed.
    assert json.loads(config(sparse=SparseConfig("delta")).to_bytes())["sparse"] == {
        "encoding": "delta",
        "link_mbit": 100.0,
    }


@pytest.mark.parametrize(
    "sparse, field",
    [
        ({"tables": ("b", "a")}, "sparse.tables"),
        ({"tables": ("a", "a")}, "sparse.tables"),
        ({"tables": ("",)}, "sparse.tables"),
        ({"tables": ("x" * 201,)}, "sparse.tables"),
        ({"tables": tuple(f"t{i:03}" for i in range(65))}, "sparse.tables"),
        ({"tables": "0.weight"}, "sparse.tables"),
        ({"public_rows": 5}, "sparse.public_rows"),
        ({"tables": ("a",), "public_rows": -1}, "sparse.public_rows"),
        ({"tables": ("a",), "public_rows": 1 << 25}, "sparse.public_rows"),
        ({"tables": ("a",), "public_rows": 2.5}, "sparse.public_rows"),
        ({"tables": ("a",), "public_rows": True}, "sparse.public_rows"),
    ],
)
def test_bad_tables_and_public_rows_name_their_field(sparse, field):
    with pytest.raises(ConfigError) as error:
        config(sparse=SparseConfig(**sparse))
    assert error.value.field == field


def test_a_hostile_tables_entry_from_another_node_is_a_config_error():
    data = json.loads(config().to_bytes())
    for hostile in ({"tables": [["a"]]}, {"tables": {"a": 1}}, {"tables": [1]}, {"public_rows": "9"}):
        blob = json.dumps(data | {"sparse": hostile}, sort_keys=True, separators=(",", ":")).encode()
        with pytest.raises(ConfigError):
            JobConfig.from_bytes(blob)


def test_public_rows_are_kept_only_for_private_jobs():
    state = {"0.weight": torch.zeros(100, 4), "0.bias": torch.zeros(100)}
    public = SparseConfig(tables=("0.weight",), public_rows=10)
    assert training.kept_rows(config(sparse=public), state, 1) is None  # dp none: nothing is noised
    private = config(sparse=public, dp=DPConfig("update", target_epsilon=5.0))
    one, again, two = (
        training.kept_rows(private, state, 1),
        training.kept_rows(private, state, 1),
        training.kept_rows(private, state, 2),
    )
    assert torch.equal(one["0.weight"], again["0.weight"]) and not torch.equal(
        one["0.weight"], two["0.weight"]
    )
    assert one["0.weight"][:5].tolist() == [0, 1, 2, 3, 4]  # the head of the vocabulary, then a draw
    # The simulator's rule (fl_node.simulate) is the node's, round for round.
    for round_, kept in ((1, one), (2, two)):
        simulated = round_public_rows(
            state, ("0.weight",), 10, private=True, seed=private.seed, round_=round_
        )
        assert torch.equal(simulated["0.weight"], kept["0.weight"])
    assert round_public_rows(state, ("0.weight",), 10, private=False, seed=0, round_=1) is None
    assert round_public_rows(state, ("0.weight",), 0, private=True, seed=0, round_=1) is None


def test_a_remote_config_whose_tables_are_not_matrices_of_its_model_is_declined():
    """Another node's config names the tables: the trainer draws their rows each round, so check them first."""
    from types import SimpleNamespace

    from backend.jobs.remote_config import NodeLimits, RemoteConfigRejected, check_remote_config

    limits = NodeLimits(
        max_model_params=2_000_000,
        max_batch_size=1024,
        max_local_epochs=20,
        max_rounds=100,
        max_period_s=86_400,
    )

    def check(sparse: SparseConfig) -> None:
        job_config = config(
            input_shape=(64,),
            num_classes=10,
            schema_hash="ab" * 32,
            dp=DPConfig(mode="sgd", target_epsilon=5.0),
            sparse=sparse,
            round_timeout_s=300,
            score_timeout_s=120,
        )
        spec = SimpleNamespace(
            job_id=7,
            rounds=job_config.rounds,
            committee_size=job_config.committee_size,
            top_k=job_config.top_k,
            min_trainers=job_config.min_trainers,
            use_blocks=False,
            join_deadline=0,
            train_period=300,
            score_period=120,
            margin=job_config.margin_bp,
            max_spend_per_round=planned_spend_bound(job_config),
        )
        check_remote_config(spec, job_config, limits=limits, schema=None, now=None)

    check(SparseConfig(tables=("1.weight",), public_rows=8))  # mlp: Flatten, Linear(64, 128), ...
    for tables in (("1.bias",), ("no.such",)):
        with pytest.raises(RemoteConfigRejected, match="sparse.tables"):
            check(SparseConfig(tables=tables, public_rows=8))


def test_the_public_rule_round_trips_defaults_away_and_reaches_the_trainer():
    state = {"0.weight": torch.zeros(50, 3)}
    private = DPConfig("sgd", target_epsilon=5.0)
    head = config(sparse=SparseConfig(tables=("0.weight",), public_rows=10, public_rule="head"), dp=private)
    assert json.loads(head.to_bytes())["sparse"]["public_rule"] == "head"
    assert JobConfig.from_bytes(head.to_bytes()) == head
    assert training.kept_rows(head, state, 3)["0.weight"].tolist() == list(range(10))
    rotate = config(sparse=SparseConfig(tables=("0.weight",), public_rows=10), dp=private)
    # The default is left out, so configurations from before the field keep their bytes.
    assert "public_rule" not in json.loads(rotate.to_bytes())["sparse"]
    assert training.kept_rows(rotate, state, 3)["0.weight"].tolist() != list(range(10))


@pytest.mark.parametrize("rule", ["frequent", "", ["head"], 1, None])
def test_a_bad_public_rule_names_its_field(rule):
    with pytest.raises(ConfigError) as caught:
        config(sparse=SparseConfig(tables=("0.weight",), public_rows=10, public_rule=rule))
    assert caught.value.field == "sparse.public_rule"
