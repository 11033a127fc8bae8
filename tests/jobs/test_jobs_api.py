"""Job creation and joining through the REST API: validation, chain records, budget refusals."""

from __future__ import annotations

import pytest
from jobs_helpers import acting_as, add_dataset, digits_parts, job_request, make_nodes

from fl_node.codec import content_hash, encode_model
from fl_node.job import training
from fl_node.job.config import JobConfig

pytestmark = pytest.mark.django_db


@pytest.fixture
def pair(db, monkeypatch):
    nodes = make_nodes(2, seed="jobs-api")
    (x0, y0), (x1, y1) = digits_parts(2)
    datasets = [
        add_dataset(nodes[0], monkeypatch, x0, y0, name="digits-a"),
        add_dataset(nodes[1], monkeypatch, x1, y1, name="digits-b"),
    ]
    return nodes, datasets


def _job(dataset_id: int, **overrides) -> dict:
    """A job two members can start (a committee of one and one trainer): the API refuses one the
    federation could never start, before anything goes on chain."""
    return job_request(dataset_id, **({"committee_size": 1, "min_trainers": 1} | overrides))


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
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"dp": {"mode": "none"}}, "dp"),  # no dataset may join a job without DP: never created
        ({"min_trainers": 186}, "min_trainers"),  # any committee + this would pass 200 participants
    ],
)
def test_create_job_rejects_bad_input(pair, operator_client, monkeypatch, overrides, field):
    nodes, datasets = pair
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post("/api/jobs", _job(datasets[0].pk, **overrides), format="json")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["detail"]
    assert field in body["errors"], body


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        ({"dataset": 999_999}, "dataset", "no dataset 999999"),
        # digits-a has ~900 records: delta must be at most 1/(10 n) ~ 1.1e-4
        ({"dp": {"mode": "sgd", "target_epsilon": 20.0, "delta": 1e-3}}, "dp.delta", "1/(10·n)"),
        (
            {"dp": {"mode": "sgd", "target_epsilon": 60.0}},
            "dp.target_epsilon",
            "lower the target epsilon",
        ),  # cap 50
        ({"committee_size": 1, "min_trainers": 2}, "min_trainers", "only 2 member(s) can join"),
        ({"committee_size": 2, "min_trainers": 1}, "committee_size", "leaves no trainer"),
        (
            {"model": "cnn", "model_options": {"channels": [3, 5], "groups": 2}},
            "model_options",
            "cannot be built",
        ),
        ({"model": "text"}, "model", "cannot be built"),
    ],
)
def test_create_job_refuses_what_this_node_or_the_federation_cannot_run(
    pair, operator_client, monkeypatch, overrides, field, words
):
    from backend.ledger import models as mirror

    nodes, datasets = pair
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post("/api/jobs", _job(datasets[0].pk, **overrides), format="json")
    assert response.status_code == 409, response.content
    assert words in response.json()["detail"] and response.json()["errors"][field], response.json()
    assert not mirror.Job.objects.exists()  # nothing went on chain


def test_create_job_puts_config_and_initial_model_on_chain(pair, operator_client, viewer_client, monkeypatch):
    nodes, datasets = pair
    node = nodes[0]
    with acting_as(node, monkeypatch):
        assert viewer_client.post("/api/jobs", _job(datasets[0].pk), format="json").status_code == 403
        response = operator_client.post("/api/jobs", _job(datasets[0].pk), format="json")
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
    initial = encode_model(training.build_model(config).state_dict())
    assert bytes(state.model_hash).hex() == content_hash(initial)


def test_create_job_with_adaptive_work_puts_the_flag_in_the_config(pair, operator_client, monkeypatch):
    nodes, datasets = pair
    node = nodes[0]
    with acting_as(node, monkeypatch):
        request = _job(datasets[0].pk, adaptive_work=True, max_local_steps=40)
        response = operator_client.post("/api/jobs", request, format="json")
    assert response.status_code == 201, response.content
    state = node.ctx.ledger.fl.get_job(response.json()["id"])
    config = JobConfig.from_bytes(node.ctx.swarm.read(bytes(state.config_hash).hex(), max_bytes=1 << 20))
    assert config.adaptive_work is True and config.max_local_steps == 40


def test_join_refuses_a_budget_overrun_and_a_schema_mismatch(pair, operator_client, monkeypatch):
    nodes, datasets = pair
    with acting_as(nodes[0], monkeypatch):
        job = operator_client.post("/api/jobs", _job(datasets[0].pk), format="json").json()
    with acting_as(nodes[1], monkeypatch):
        # The job targets epsilon 20: a dataset capped at 1 cannot take it.
        small = add_dataset(nodes[1], monkeypatch, *_same_schema(), name="digits-small", epsilon_cap=1.0)
        response = operator_client.post(f"/api/jobs/{job['id']}/join", {"dataset": small.pk}, format="json")
        assert response.status_code == 409, response.content
        assert "exceed the privacy budget" in response.json()["detail"]
        assert response.json()["errors"]["dataset"]
        assert not nodes[1].ctx.ledger.fl.get_participant(job["id"], nodes[1].ctx.address).joined

        other = add_dataset(nodes[1], monkeypatch, *_other_schema(), name="wide")
        response = operator_client.post(f"/api/jobs/{job['id']}/join", {"dataset": other.pk}, format="json")
        assert response.status_code == 409 and "schema" in response.json()["detail"]

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
        # One participant is too few for a committee of 1 plus 1 trainer.
        response = operator_client.post(f"/api/jobs/{job['id']}/start", {}, format="json")
        assert response.status_code == 409 and "participants" in response.json()["detail"]


def test_a_job_without_dp_is_never_created(pair, operator_client, monkeypatch):
    """No dataset may join a job without DP (it would spend an unbounded budget): the API creates none."""
    nodes, datasets = pair
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post("/api/jobs", _job(datasets[0].pk, dp={"mode": "none"}), format="json")
    assert response.status_code == 400 and response.json()["errors"]["dp"]


def _same_schema():
    """Records of the digits schema (1x8x8, 10 classes) that no digits dataset holds."""
    import numpy as np

    rng = np.random.default_rng(11)
    return rng.random((60, 1, 8, 8)).astype(np.float32), np.arange(60) % 10


def _other_schema():
    import numpy as np

    rng = np.random.default_rng(3)
    return rng.random((40, 5)).astype(np.float32), rng.integers(0, 10, 40)


def test_a_config_from_another_node_cannot_name_an_importable_model():
    from fl_node.job.config import ConfigError, DPConfig, JobConfig

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


def test_an_add_remove_job_refuses_a_dataset_that_registered_its_exact_size(
    pair, operator_client, monkeypatch
):
    """Its size is public, so add/remove protects none of its records: 409 at create and at join,
    naming the field; replace-one takes it."""
    from backend.datasets.models import Dataset

    nodes, datasets = pair
    Dataset.objects.filter(pk=datasets[0].pk).update(count_noise_std=0.0)  # registered before counts
    with acting_as(nodes[0], monkeypatch):
        refused = operator_client.post("/api/jobs", _job(datasets[0].pk), format="json")
        assert refused.status_code == 409, refused.content
        assert "exact size" in refused.json()["detail"] and refused.json()["errors"]["dp.adjacency"]
    with acting_as(nodes[1], monkeypatch):
        created = operator_client.post("/api/jobs", _job(datasets[1].pk), format="json")
        assert created.status_code == 201, created.content
        job = created.json()
        assert job["config"]["dp"]["adjacency"] == "add-remove"  # the default
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post(
            f"/api/jobs/{job['id']}/join", {"dataset": datasets[0].pk}, format="json"
        )
        assert response.status_code == 409, response.content
        assert "replace-one" in response.json()["detail"] and response.json()["errors"]["dataset"]
        assert not nodes[0].ctx.ledger.fl.get_participant(job["id"], nodes[0].ctx.address).joined
        dp = {"mode": "sgd", "target_epsilon": 3.0, "adjacency": "replace-one"}
        accepted = operator_client.post("/api/jobs", _job(datasets[0].pk, dp=dp), format="json")
        assert accepted.status_code == 201, accepted.content


def test_join_refuses_a_delta_too_large_for_the_dataset(pair, operator_client, monkeypatch):
    import numpy as np

    nodes, datasets = pair
    # A job whose delta fits digits-b (~900 records) but not a dataset of 2000 records.
    dp = {"mode": "sgd", "target_epsilon": 20.0, "delta": 1e-4, "max_grad_norm": 1.0}
    # Records of the same schema that no other dataset holds (a dataset sharing records shares a budget).
    rng = np.random.default_rng(12)
    many = add_dataset(nodes[0], monkeypatch, rng.random((2000, 1, 8, 8)).astype(np.float32),
                       np.arange(2000) % 10, name="digits-like")  # fmt: skip
    with acting_as(nodes[1], monkeypatch):
        created = operator_client.post("/api/jobs", _job(datasets[1].pk, dp=dp), format="json")
        assert created.status_code == 201, created.content
        job = created.json()
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post(f"/api/jobs/{job['id']}/join", {"dataset": many.pk}, format="json")
    assert response.status_code == 409, response.content
    assert "1/(10·n)" in response.json()["detail"] and response.json()["errors"]["dataset"]
    assert not nodes[0].ctx.ledger.fl.get_participant(job["id"], nodes[0].ctx.address).joined


def _proposed_and_joined(nodes, datasets, client, monkeypatch) -> dict:
    """A job proposed by the first node, joined by every node with its dataset."""
    with acting_as(nodes[0], monkeypatch):
        job = client.post("/api/jobs", _job(datasets[0].pk), format="json").json()
    for node, dataset in zip(nodes, datasets, strict=True):
        with acting_as(node, monkeypatch):
            joined = client.post(f"/api/jobs/{job['id']}/join", {"dataset": dataset.pk}, format="json")
            assert joined.status_code == 200, joined.content
    return job


def test_the_job_and_its_rounds_show_honest_privacy(pair, operator_client, viewer_client, monkeypatch):
    from backend.datasets import budget
    from backend.datasets.models import Dataset
    from backend.jobs.discovery import config_of, job_record
    from backend.ledger import models as mirror
    from fl_node.job.plan import participant_plan, scores_per_round
    from fl_node.privacy import ReleasePlan
    from fl_node.privacy_plan import job_epsilon

    nodes, datasets = pair
    Dataset.objects.filter(pk=datasets[1].pk).update(epsilon_cap=50.0)
    job = _proposed_and_joined(nodes, datasets, operator_client, monkeypatch)

    train = ReleasePlan("dp_sgd", noise_multiplier=1.2, sample_rate=0.04, steps=75)
    released = budget.reserve_release(datasets[0], job["id"], 1, train)
    budget.mark_released(datasets[0], job["id"], 1, "dp_sgd")
    reserved = budget.reserve_release(datasets[0], job["id"], 2, train)  # round 2 not published yet
    # What the chain's mirror holds of each participant's releases (PrivacySpent: kind and steps):
    # node 0 published round 1's update; node 1 scored round 1 and published, then withheld, a
    # round 2 update. The shown figure is recomputed from these and the public plan alone.
    recorded = {nodes[0].ctx.address: [(0, 0)], nodes[1].ctx.address: [(1, 0), (0, 0), (2, 0)]}
    log = iter(range(100))
    for node, dataset in zip(nodes, datasets, strict=True):
        on_chain = mirror.Dataset.objects.get(dataset_id=int(dataset.onchain_id))
        for round_, (kind, steps) in enumerate(recorded[node.ctx.address], start=1):
            mirror.PrivacyRecord.objects.create(
                dataset=on_chain, job_id=job["id"], round=min(round_, 2), spender=node.ctx.address,
                amount=1000, kind=kind, steps=steps, block=1, log_index=next(log),
            )  # fmt: skip
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
        config = config_of(job_record(nodes[0].ctx, job["id"]))
    assert privacy["target_epsilon"] == 20.0 and privacy["delta"] == 1e-5
    by_node = {p["node"]: p for p in privacy["participants"]}
    mine, theirs = by_node[nodes[0].ctx.address], by_node[nodes[1].ctx.address]
    assert mine["source"] == theirs["source"] == "chain"
    assert mine["dataset"] == int(datasets[0].onchain_id)
    expected = {}
    for node, dataset in zip(nodes, datasets, strict=True):
        plan = participant_plan(
            config, samples=dataset.num_samples, public_holdout=False, scores_per_round=scores_per_round(2, 1)
        )
        expected[node.ctx.address] = job_epsilon(plan, recorded[node.ctx.address])
        assert by_node[node.ctx.address]["epsilon_spent"] == pytest.approx(expected[node.ctx.address])
    assert 0 < expected[nodes[0].ctx.address] < expected[nodes[1].ctx.address]
    # This node also shows its own records' figure, at the job's delta, and what is still reserved.
    assert mine["epsilon_local"] == pytest.approx(released.epsilon)  # round 1 only: round 2 is reserved
    assert mine["epsilon_reserved"] == pytest.approx(reserved.epsilon - released.epsilon)
    assert theirs == {
        "node": nodes[1].ctx.address,
        "dataset": int(datasets[1].onchain_id),
        "epsilon_spent": pytest.approx(expected[nodes[1].ctx.address]),
        "epsilon_reserved": 0.0,
        "source": "chain",
    }
    assert privacy["epsilon_max"] == pytest.approx(max(expected.values()))
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


def test_a_participant_registered_with_an_absurd_size_does_not_break_the_job_page(
    pair, operator_client, viewer_client, monkeypatch
):
    """A hostile member registers 10^12 records (DataRegistry takes the registrant's word, up to
    MAX_SAMPLES) and joins: no plan exists at the job's delta for that size (1/(10 n) < delta).
    Every member's job page still answers, the participant marked unplannable."""
    from backend.ledger import models as mirror

    nodes, datasets = pair
    job = _proposed_and_joined(nodes, datasets, operator_client, monkeypatch)
    mirror.Dataset.objects.filter(dataset_id=int(datasets[1].onchain_id)).update(samples=10**12)
    with acting_as(nodes[0], monkeypatch):
        response = viewer_client.get(f"/api/jobs/{job['id']}")
    assert response.status_code == 200, response.content
    by_node = {p["node"]: p for p in response.json()["privacy"]["participants"]}
    assert by_node[nodes[1].ctx.address]["source"] == "unplannable"
    assert by_node[nodes[1].ctx.address]["epsilon_spent"] == 0.0
    assert by_node[nodes[0].ctx.address]["source"] == "chain"


@pytest.mark.parametrize(
    "sparse, field",
    [
        ({"encoding": "zip"}, "sparse"),
        ({"link_mbit": 0}, "sparse"),
        ({"link_mbit": 1e9}, "sparse"),
        ({"tables": ["x"] * 65}, "sparse"),
        ({"tables": ["0.weight", "0.weight"]}, "sparse"),
        ({"public_rows": -1}, "sparse"),
        ({"public_rows": 10}, "sparse.public_rows"),  # restricts rows of no table
        ({"tables": ["1.weight"], "public_rows": 10, "public_rule": "frequent"}, "sparse"),
        ({"tables": ["1.weight"], "public_rows": 10, "public_rule": ["head"]}, "sparse"),
    ],
)
def test_a_bad_sparse_policy_is_a_400_naming_it(pair, operator_client, monkeypatch, sparse, field):
    nodes, datasets = pair
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post("/api/jobs", _job(datasets[0].pk, sparse=sparse), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()


@pytest.mark.parametrize("tables", [["no.such.tensor"], ["1.bias"]])  # a vector is no table
def test_sparse_tables_must_be_tables_of_the_model_for_this_dataset(
    pair, operator_client, monkeypatch, tables
):
    nodes, datasets = pair
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post(
            "/api/jobs", _job(datasets[0].pk, sparse={"tables": tables}), format="json"
        )
    assert response.status_code == 409, response.content
    assert "sparse.tables" in response.json()["errors"]


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
        response = operator_client.post("/api/jobs", _job(datasets[0].pk, sparse=sparse), format="json")
    assert response.status_code == 201, response.content
    job = response.json()
    state = node.ctx.ledger.fl.get_job(job["id"])
    config = JobConfig.from_bytes(node.ctx.swarm.read(bytes(state.config_hash).hex(), max_bytes=1 << 20))
    assert config.sparse.encoding == "delta" and config.sparse.tables == ("1.weight", "3.weight")
    assert config.sparse.public_rows == 16 and job["config"]["sparse"]["tables"] == ["1.weight", "3.weight"]
    # Under DP the tables keep the same public rows on every node: seeded by the job and round only.
    kept = training.kept_rows(config, training.build_model(config).state_dict(), 1)
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
    request = _job(
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
