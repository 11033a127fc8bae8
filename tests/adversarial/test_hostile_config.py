"""A hostile member proposes jobs whose configs would exhaust or mislead the honest nodes.

Two node identities on one in-process chain (tests/jobs/jobs_helpers.py): the hostile member
stores a crafted config in the swarm store and proposes a job with it, with its own key, as
any member may. The honest node's agent must decline each job with a reason (logged, and the
409 sentence its API gives for the job), never build the model, and keep working: an honest
job proposed afterwards is discovered and joined as usual.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
from rest_framework.test import APIClient

from backend.identity.roles import Role
from backend.jobs import blobs, chain
from backend.jobs.driver import agent
from backend.jobs.models import JobRecord
from backend.ledger.resources import JobSpec
from backend.nodes.accounts import api_token, create_or_update_user
from fl_node.job import training
from fl_node.job.config import DPConfig, JobConfig
from fl_node.job.plan import planned_spend_bound
from tests.builders import job_config
from tests.jobs.jobs_helpers import acting_as, add_dataset, digits_parts, job_request, make_nodes

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


@pytest.fixture(autouse=True)
def node_settings(settings, tmp_path):
    from backend.identity.key import node_account
    from backend.swarm import factory

    settings.DEFL_NODE_KEY = "0x" + "6e" * 32  # test-only
    settings.DEFL_CHUNK_DIR = str(tmp_path / "chunks")
    settings.DEFL_SWARM_FSYNC = False
    settings.DEFL_PEERS = []
    settings.DEFL_REPLICATION = 1

    def clear():
        node_account.cache_clear()
        for cached in (factory.node_swarm, factory.local_store, factory.peer_directory):
            cached.cache_clear()

    clear()
    yield settings
    clear()


@pytest.fixture
def federation(monkeypatch):
    honest, hostile = make_nodes(2, seed="hostile-config")
    parts = digits_parts(2)
    datasets = [
        add_dataset(node, monkeypatch, x, y, name=f"digits-{i}")
        for i, (node, (x, y)) in enumerate(zip((honest, hostile), parts, strict=True))
    ]
    return honest, hostile, datasets


def _config(schema_hash: str, **changes) -> JobConfig:
    """An honest DP job on the digits' schema; ``changes`` make it hostile."""
    honest = job_config(
        name="crafted",
        input_shape=(1, 8, 8),
        num_classes=10,
        schema_hash=schema_hash,
        local_epochs=1,
        batch_size=32,
        dp=DPConfig(mode="sgd", target_epsilon=20.0),
        committee_size=1,
        top_k=1,
        min_trainers=1,
        round_timeout_s=600,
        score_timeout_s=300,
        join_timeout_s=3600,
    )
    return dataclasses.replace(honest, **changes)


def _propose(node, config: JobConfig, **spec_changes) -> int:
    """What a hostile member's own client does: store the config, propose a spec of its choosing."""
    config_ref = blobs.put(node.ctx, config.to_bytes())
    model_ref = blobs.put(node.ctx, b"not even a model")
    spec = dict(
        config_hash=bytes.fromhex(config_ref),
        initial_model_ref=bytes.fromhex(model_ref),
        initial_model_hash=b"\x01" * 32,
        rounds=config.rounds,
        committee_size=config.committee_size,
        top_k=config.top_k,
        min_trainers=config.min_trainers,
        join_deadline=chain.chain_time(node.ctx) + config.join_timeout_s,
        train_period=config.round_timeout_s,
        score_period=config.score_timeout_s,
    )
    if "max_spend_per_round" in {f.name for f in dataclasses.fields(JobSpec)}:
        spec["max_spend_per_round"] = planned_spend_bound(config)
    receipt = chain.propose_job(node.ctx, JobSpec(**(spec | spec_changes)))
    return receipt.event("JobProposed").args["jobId"]


def _operator(monkeypatch) -> APIClient:
    user, _ = create_or_update_user("honest-operator", Role.OPERATOR)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return client


ATTACKS = {
    # attack class: resource exhaustion through model size (10^9 hidden units: 7.4e10 parameters)
    "huge_model_options": ({"model_options": {"hidden": 10**9}}, {}, "model_options.hidden = 1000000000"),
    # attack class: resource exhaustion through training work (10^9 local epochs)
    "epochs_1e9": ({"local_epochs": 10**9}, {}, "1000000000 local epochs is more than this node's limit"),
    # attack class: resource exhaustion through one huge batch
    "batch_1e8": ({"batch_size": 10**8}, {}, "batch size 100000000 is more than this node's limit"),
    # attack class: schema confusion (a model for inputs this node's data does not have)
    "input_shape_mismatch": ({"input_shape": (3, 224, 224)}, {}, "differs from this node's datasets"),
    # attack class: class-count confusion (labels outside the model's range)
    "num_classes_mismatch": ({"num_classes": 1000}, {}, "it has 1000 classes where this node's datasets"),
    # attack class: spec/config divergence (nodes plan rounds the contract does not enforce)
    "rounds_differ_from_chain": (
        {},
        {"rounds": 5},
        "its config says rounds 2 where the on-chain job spec says 5",
    ),
    "committee_differs_from_chain": ({}, {"committee_size": 2}, "committee_size 1 where the on-chain"),
    "periods_differ_from_chain": ({}, {"train_period": 30}, "train_period 600 where the on-chain"),
    # a margin the committee members would not apply (the contract accepts by its own margin)
    "margin_differs_from_chain": ({}, {"margin": 500}, "margin 0 where the on-chain job spec says 500"),
    # attack class: type confusion in options a factory receives as keyword arguments
    "nested_option": (
        {"model_options": {"hidden": {"$ref": "x"}}},
        {},
        "is not a number, a flag or a short text",
    ),
    # attack class: a privacy bound the chain would enforce that the config's DP does not imply
    # (a spend far above what the job planned would pass the chain's check)
    "spend_bound_inflated": ({}, {"max_spend_per_round": 90_000_000}, "max_spend_per_round"),
    # attack class: oversized strings that the node would store (its name column holds 200)
    "long_name": ({"name": "n" * 5000}, {}, "its name is longer than 200 characters"),
}


def test_hostile_configs_are_declined_with_a_reason_and_the_node_keeps_working(
    federation, monkeypatch, caplog
):
    """Attack classes: resource exhaustion, schema confusion and spec/config divergence through a
    member's job proposal (see ATTACKS); then liveness: an honest job still goes through."""
    honest, hostile, datasets = federation
    schema_hash = datasets[0].schema_hash
    proposed = {
        name: _propose(hostile, _config(schema_hash, **config_changes), **spec_changes)
        for name, (config_changes, spec_changes, _) in ATTACKS.items()
    }
    built = []
    monkeypatch.setattr(training, "build_model", _recording(training.build_model, built))

    chain.sync_mirror(honest.ctx)
    with caplog.at_level(logging.WARNING, logger="backend.jobs.driver.agent"):
        agent.discover_configs(honest.ctx)

    for name, (_, _, reason) in ATTACKS.items():
        job_id = proposed[name]
        declined = honest.ctx.memory.agent.declined
        assert reason in declined.get(job_id, ""), f"{name}: {declined.get(job_id)!r}"
        assert not JobRecord.objects.filter(onchain_id=job_id).exists(), f"{name} was accepted"
        assert any(f"this node declines job {job_id}: " in r.getMessage() for r in caplog.records)
    # Only on the meta device: the node never allocated a hostile model's weights.
    assert all(device == "meta" for device in built), built

    # The API says why, with the job's sentence, where the operator looks (409).
    operator = _operator(monkeypatch)
    with acting_as(honest, monkeypatch):
        response = operator.post(
            f"/api/jobs/{proposed['epochs_1e9']}/join", {"dataset": datasets[0].pk}, format="json"
        )
    assert response.status_code == 409
    assert "this node declines job" in response.json()["detail"]
    assert "local epochs" in response.json()["detail"]

    # A declined job is not fetched again on every tick.
    fetched = []
    monkeypatch.setattr(blobs, "get", _recording(blobs.get, fetched))
    agent.discover_configs(honest.ctx)
    assert fetched == []

    # Liveness: the same member now proposes an honest job; the honest node discovers and joins it.
    with acting_as(hostile, monkeypatch):
        request = job_request(datasets[1].pk, rounds=2, committee_size=1, min_trainers=1)  # two can start it
        created = operator.post("/api/jobs", request, format="json")
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    JobRecord.objects.filter(onchain_id=job_id).delete()  # as if only the proposer had it
    chain.sync_mirror(honest.ctx)
    agent.discover_configs(honest.ctx)
    assert JobRecord.objects.filter(onchain_id=job_id).exists()
    with acting_as(honest, monkeypatch):
        joined = operator.post(f"/api/jobs/{job_id}/join", {"dataset": datasets[0].pk}, format="json")
    assert joined.status_code == 200, joined.content


def _recording(function, calls: list):
    def wrapper(*args, **kwargs):
        result = function(*args, **kwargs)
        if function.__name__ == "build_model":
            calls.append(str(next(result.parameters()).device))
        else:
            calls.append(args[1:2])
        return result

    return wrapper


def test_an_oversized_config_reference_is_declined_for_good(federation, monkeypatch):
    """Attack class: resource exhaustion through the config reference itself (a blob far past the
    64 KiB a config may be). The honest node refuses it from the root chunk, declines the job and
    never fetches that reference again (it names immutable bytes)."""
    honest, hostile, datasets = federation
    oversized = blobs.put(hostile.ctx, b"{" + b" " * (256 * 1024) + b"}")
    job_id = _propose(hostile, _config(datasets[0].schema_hash), config_hash=bytes.fromhex(oversized))
    chain.sync_mirror(honest.ctx)

    fetched = []
    monkeypatch.setattr(blobs, "get", _recording(blobs.get, fetched))
    agent.discover_configs(honest.ctx)
    assert "configuration reference is unusable" in honest.ctx.memory.agent.declined.get(job_id, "")
    assert not JobRecord.objects.filter(onchain_id=job_id).exists()
    honest.ctx.memory.agent.discovery_attempts.clear()  # even once the retry interval passed
    before = len(fetched)
    agent.discover_configs(honest.ctx)
    assert len(fetched) == before
