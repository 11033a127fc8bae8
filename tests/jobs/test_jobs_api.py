"""Job creation and joining through the REST API: validation, chain records, budget refusals."""

from __future__ import annotations

import pytest
from jobs_helpers import acting_as, add_dataset, digits_parts, job_request, make_nodes

from backend.jobs.config import JobConfig
from fl_node.codec import content_hash, encode_model

pytestmark = pytest.mark.django_db


@pytest.fixture
def pair(db, monkeypatch):
    nodes = make_nodes(2, seed="jobs-api")
    (x0, y0), (x1, y1) = digits_parts(2)
    datasets = [
        add_dataset(nodes[0], monkeypatch, x0, y0, name="digits-a"),
        add_dataset(nodes[1], monkeypatch, x1, y1, name="digits-b", epsilon_cap=1.0),
    ]
    return nodes, datasets


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"model": "resnet9000"}, "model"),
        ({"rounds": 0}, "rounds"),
        ({"lr": 0}, "lr"),
        ({"strategy": "magic"}, "strategy"),
        ({"committee_size": 0}, "committee_size"),
        ({"committee_size": 17}, "committee_size"),
        ({"margin_bp": 10_001}, "margin_bp"),
        ({"margin_bp": -1}, "margin_bp"),
        ({"margin_bp": "x"}, "margin_bp"),
        ({"adaptive_work": True, "max_local_steps": 2}, "max_local_steps"),
        ({"adaptive_work": True}, "max_local_steps"),
        ({"max_local_steps": 8}, "max_local_steps"),
        ({"adaptive_work": True, "max_local_steps": 100_001}, "max_local_steps"),
        ({"adaptive_work": True, "max_local_steps": 8, "strategy": "median"}, "strategy"),
        ({"dp": {"mode": "sgd"}}, "dp"),
        ({"dp": {"mode": "sgd", "target_epsilon": 3, "delta": 1.5}}, "dp"),
        ({"dp": {"mode": "laplace", "target_epsilon": 3}}, "dp"),
        ({"dataset": 999_999}, "dataset"),
        ({"name": ""}, "name"),
    ],
)
def test_create_job_rejects_bad_input(pair, operator_client, monkeypatch, overrides, field):
    nodes, datasets = pair
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post("/api/jobs", job_request(datasets[0].pk, **overrides), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["detail"]
    assert field in body["errors"], body


def test_create_job_puts_config_and_initial_model_on_chain(pair, operator_client, viewer_client, monkeypatch):
    nodes, datasets = pair
    node = nodes[0]
    with acting_as(node, monkeypatch):
        assert viewer_client.post("/api/jobs", job_request(datasets[0].pk), format="json").status_code == 403
        response = operator_client.post("/api/jobs", job_request(datasets[0].pk), format="json")
        assert response.status_code == 201, response.content
        job = response.json()
        assert [j["id"] for j in viewer_client.get("/api/jobs").json()] == [job["id"]]

    assert job["status"] == "open" and job["tx_hash"].startswith("0x")
    assert job["input_shape"] == [1, 8, 8] and job["num_classes"] == 10
    state = node.ctx.ledger.fl.get_job(job["id"])
    # The config hash on chain is the swarm reference of the canonical config: fetchable by anyone.
    config = JobConfig.from_bytes(node.ctx.swarm.read(bytes(state.config_hash).hex(), max_bytes=1 << 20))
    assert config.name == "digits-dp" and config.schema_hash == datasets[0].schema_hash
    # The initial model is create_model(seed from the config), encoded canonically.
    initial = encode_model(config.build_model().state_dict())
    assert bytes(state.model_hash).hex() == content_hash(initial)


def test_create_job_with_adaptive_work_puts_the_flag_in_the_config(pair, operator_client, monkeypatch):
    nodes, datasets = pair
    node = nodes[0]
    with acting_as(node, monkeypatch):
        request = job_request(datasets[0].pk, adaptive_work=True, max_local_steps=40)
        response = operator_client.post("/api/jobs", request, format="json")
    assert response.status_code == 201, response.content
    state = node.ctx.ledger.fl.get_job(response.json()["id"])
    config = JobConfig.from_bytes(node.ctx.swarm.read(bytes(state.config_hash).hex(), max_bytes=1 << 20))
    assert config.adaptive_work is True and config.max_local_steps == 40


def test_join_refuses_a_budget_overrun_and_a_schema_mismatch(pair, operator_client, monkeypatch):
    nodes, datasets = pair
    with acting_as(nodes[0], monkeypatch):
        job = operator_client.post("/api/jobs", job_request(datasets[0].pk), format="json").json()
    with acting_as(nodes[1], monkeypatch):
        # digits-b has a cap of epsilon 1; the job targets epsilon 20.
        response = operator_client.post(
            f"/api/jobs/{job['id']}/join", {"dataset": datasets[1].pk}, format="json"
        )
        assert response.status_code == 400, response.content
        assert "exceed the privacy budget" in response.json()["detail"]
        assert response.json()["errors"]["dataset"]
        assert not nodes[1].ctx.ledger.fl.get_participant(job["id"], nodes[1].ctx.address).joined

        other = add_dataset(nodes[1], monkeypatch, *_other_schema(), name="wide")
        response = operator_client.post(f"/api/jobs/{job['id']}/join", {"dataset": other.pk}, format="json")
        assert response.status_code == 400 and "schema" in response.json()["detail"]

    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post(
            f"/api/jobs/{job['id']}/join", {"dataset": datasets[0].pk}, format="json"
        )
        assert response.status_code == 200, response.content
        assert response.json()["joined"]["tx_hash"].startswith("0x")
        assert (
            operator_client.post(f"/api/jobs/{job['id']}/join", {"dataset": datasets[0].pk}).status_code
            == 409
        )
        # Two participants are too few for a committee of 2 plus 2 trainers.
        response = operator_client.post(f"/api/jobs/{job['id']}/start", {}, format="json")
        assert response.status_code == 409 and "participants" in response.json()["detail"]


def test_a_job_without_dp_cannot_be_joined(pair, operator_client, monkeypatch):
    nodes, datasets = pair
    with acting_as(nodes[0], monkeypatch):
        job = operator_client.post(
            "/api/jobs", job_request(datasets[0].pk, dp={"mode": "none"}), format="json"
        ).json()
        response = operator_client.post(
            f"/api/jobs/{job['id']}/join", {"dataset": datasets[0].pk}, format="json"
        )
    assert response.status_code == 400 and "without differential privacy" in response.json()["detail"]


def _other_schema():
    import numpy as np

    rng = np.random.default_rng(3)
    return rng.random((40, 5)).astype(np.float32), rng.integers(0, 10, 40)


def test_a_config_from_another_node_cannot_name_an_importable_model():
    from backend.jobs.config import ConfigError, DPConfig, JobConfig

    config = JobConfig(
        name="x",
        model="mlp",
        input_shape=(4,),
        num_classes=2,
        schema_hash="00",
        rounds=1,
        dp=DPConfig("sgd", 1.0),
    ).as_dict() | {"model": "os:system"}
    with pytest.raises(ConfigError) as error:
        JobConfig.from_dict(config)
    assert error.value.field == "model"


def test_join_refuses_a_delta_too_large_for_the_dataset(pair, operator_client, monkeypatch):
    nodes, datasets = pair
    dp = {"mode": "sgd", "target_epsilon": 20.0, "delta": 1e-3, "max_grad_norm": 1.0}
    with acting_as(nodes[0], monkeypatch):
        job = operator_client.post("/api/jobs", job_request(datasets[0].pk, dp=dp), format="json").json()
        response = operator_client.post(
            f"/api/jobs/{job['id']}/join", {"dataset": datasets[0].pk}, format="json"
        )
    assert response.status_code == 400, response.content
    assert "1/(10·n)" in response.json()["detail"] and response.json()["errors"]["dataset"]
    assert not nodes[0].ctx.ledger.fl.get_participant(job["id"], nodes[0].ctx.address).joined


def test_the_job_and_its_rounds_show_honest_privacy(pair, operator_client, viewer_client, monkeypatch):
    from backend.datasets import budget
    from backend.datasets.models import Dataset
    from backend.ledger import models as mirror
    from fl_node.privacy import ReleasePlan

    nodes, datasets = pair
    Dataset.objects.filter(pk=datasets[1].pk).update(epsilon_cap=50.0)
    with acting_as(nodes[0], monkeypatch):
        job = operator_client.post("/api/jobs", job_request(datasets[0].pk), format="json").json()
    for node, dataset in zip(nodes, datasets, strict=True):
        with acting_as(node, monkeypatch):
            joined = operator_client.post(
                f"/api/jobs/{job['id']}/join", {"dataset": dataset.pk}, format="json"
            )
            assert joined.status_code == 200, joined.content

    train = ReleasePlan("dp_sgd", noise_multiplier=1.2, sample_rate=0.04, steps=75)
    released = budget.reserve_release(datasets[0], job["id"], 1, train)
    budget.mark_released(datasets[0], job["id"], 1, "dp_sgd")
    reserved = budget.reserve_release(datasets[0], job["id"], 2, train)  # round 2 not published yet
    # The other member's spend as the chain's mirror records it (micro-epsilon).
    other = mirror.Dataset.objects.get(dataset_id=int(datasets[1].onchain_id))
    mirror.PrivacySpend.objects.create(dataset=other, job_id=job["id"], spent=1_500_000)
    round_one = mirror.Job.objects.get(job_id=job["id"]).rounds_set.create(
        number=1,
        status="done",
        base_model_hash="0x" + "00" * 32,
        update_deadline=1,
        score_deadline=2,
        opened_block=1,
    )
    assert round_one.number == 1

    with acting_as(nodes[0], monkeypatch):
        privacy = viewer_client.get(f"/api/jobs/{job['id']}").json()["privacy"]
        rounds = viewer_client.get(f"/api/jobs/{job['id']}/rounds").json()
    assert privacy["target_epsilon"] == 20.0 and privacy["delta"] == 1e-5
    by_node = {p["node"]: p for p in privacy["participants"]}
    mine, theirs = by_node[nodes[0].ctx.address], by_node[nodes[1].ctx.address]
    assert mine["source"] == "local" and theirs["source"] == "chain"
    assert mine["dataset"] == int(datasets[0].onchain_id)
    assert mine["epsilon_spent"] == pytest.approx(released.epsilon)  # round 1 only: round 2 is reserved
    assert mine["epsilon_reserved"] == pytest.approx(reserved.epsilon - released.epsilon)
    assert theirs == {
        "node": nodes[1].ctx.address,
        "dataset": int(datasets[1].onchain_id),
        "epsilon_spent": 1.5,
        "epsilon_reserved": 0.0,
        "source": "chain",
    }
    assert privacy["epsilon_max"] == pytest.approx(max(1.5, released.epsilon))
    assert privacy["final"] is False  # the job runs, and round 2 is still reserved

    assert [r["round"] for r in rounds] == [1]
    assert rounds[0]["privacy"] == [
        {
            "kind": "dp_sgd",
            "noise_multiplier": 1.2,
            "sample_rate": 0.04,
            "steps": 75,
            "delta": 1e-5,
            "epsilon_after": pytest.approx(released.epsilon),
            "status": "released",
        }
    ]

    # The job ends: still not final while this node's round-2 release is reserved.
    mirror.Job.objects.filter(job_id=job["id"]).update(status="finished")
    with acting_as(nodes[0], monkeypatch):
        assert viewer_client.get(f"/api/jobs/{job['id']}").json()["privacy"]["final"] is False
        budget.mark_withheld(datasets[0], job["id"], 2, "dp_sgd")
        privacy = viewer_client.get(f"/api/jobs/{job['id']}").json()["privacy"]
    assert privacy["final"] is True
    assert privacy["participants"][0]["epsilon_reserved"] == 0.0


@pytest.mark.parametrize(
    "sparse, field",
    [
        ({"encoding": "zip"}, "sparse"),
        ({"link_mbit": 0}, "sparse"),
        ({"link_mbit": 1e9}, "sparse"),
        ({"tables": ["x"] * 65}, "sparse"),
        ({"tables": ["0.weight", "0.weight"]}, "sparse"),
        ({"tables": ["no.such.tensor"]}, "sparse.tables"),
        ({"tables": ["1.bias"]}, "sparse.tables"),  # a vector is no table
        ({"public_rows": -1}, "sparse"),
        ({"public_rows": 10}, "sparse.public_rows"),  # restricts rows of no table
        ({"tables": ["1.weight"], "public_rows": 10, "public_rule": "frequent"}, "sparse"),
        ({"tables": ["1.weight"], "public_rows": 10, "public_rule": ["head"]}, "sparse"),
    ],
)
def test_a_bad_sparse_policy_is_a_400_naming_it(pair, operator_client, monkeypatch, sparse, field):
    nodes, datasets = pair
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post(
            "/api/jobs", job_request(datasets[0].pk, sparse=sparse), format="json"
        )
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()


def test_the_sparse_policy_reaches_the_canonical_config_on_chain(pair, operator_client, monkeypatch):
    nodes, datasets = pair
    node = nodes[0]
    sparse = {
        "encoding": "delta",
        "link_mbit": 1000.0,
        "tables": ["3.weight", "1.weight"],
        "public_rows": 16,
        "public_rule": "head",
    }
    with acting_as(node, monkeypatch):
        response = operator_client.post(
            "/api/jobs", job_request(datasets[0].pk, sparse=sparse), format="json"
        )
    assert response.status_code == 201, response.content
    job = response.json()
    state = node.ctx.ledger.fl.get_job(job["id"])
    config = JobConfig.from_bytes(node.ctx.swarm.read(bytes(state.config_hash).hex(), max_bytes=1 << 20))
    assert config.sparse.encoding == "delta" and config.sparse.tables == ("1.weight", "3.weight")
    assert config.sparse.public_rows == 16 and job["config"]["sparse"]["tables"] == ["1.weight", "3.weight"]
    # Under DP the tables keep the same public rows on every node: seeded by the job and round only.
    kept = config.kept_rows(config.build_model().state_dict(), 1)
    assert set(kept) == {"1.weight", "3.weight"}
    assert len(kept["1.weight"]) == 16 and len(kept["3.weight"]) == 10  # a 10-row table keeps all
    assert config.sparse.public_rule == "head" and kept["1.weight"].tolist() == list(range(16))


def test_a_text_job_with_public_rows_can_be_joined(db, operator_client, monkeypatch):
    """Token ids stored as float32 features; the sparse policy survives create, fetch and join."""
    import numpy as np

    from fl_node.data import load_dataset

    nodes = make_nodes(2, seed="jobs-api-text")
    corpus = load_dataset("zipf_text", seed=0, num_samples=600, vocab_size=2_000, num_classes=10)
    x, y = corpus.train.x.astype(np.float32), corpus.train.y
    datasets = [
        add_dataset(node, monkeypatch, x[i::2], y[i::2], name=f"text-{i}") for i, node in enumerate(nodes)
    ]
    sparse = {"encoding": "auto", "tables": ["embedding.weight"], "public_rows": 100}
    request = job_request(
        datasets[0].pk,
        model="text",
        model_options={"vocab_size": 2_000, "embed_dim": 8},
        strategy="hybrid",
        strategy_params={"sparse_names": ["embedding.weight"]},
        sparse=sparse,
    )
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post("/api/jobs", request, format="json")
        assert response.status_code == 201, response.content
        job = response.json()
    for node, dataset in zip(nodes, datasets, strict=True):
        with acting_as(node, monkeypatch):
            joined = operator_client.post(
                f"/api/jobs/{job['id']}/join", {"dataset": dataset.pk}, format="json"
            )
            assert joined.status_code == 200, joined.content
    assert job["config"]["sparse"] == sparse | {"link_mbit": 100.0}
