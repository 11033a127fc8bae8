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
    config = JobConfig.from_bytes(node.ctx.swarm.read(bytes(state.config_hash).hex()))
    assert config.name == "digits-dp" and config.schema_hash == datasets[0].schema_hash
    # The initial model is create_model(seed from the config), encoded canonically.
    initial = encode_model(config.build_model().state_dict())
    assert bytes(state.model_hash).hex() == content_hash(initial)


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
