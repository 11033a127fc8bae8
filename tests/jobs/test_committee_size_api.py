"""The committee rules through the REST API: a production deployment takes only odd committees of
at least 3 (a clear 409, the deployment's rule, before anything goes on chain), a development one
also smaller ones, and nobody chooses the first committee at the start (the contract draws it)."""

from __future__ import annotations

import pytest
from jobs_helpers import acting_as, add_dataset, digits_parts, job_request, make_nodes

from backend.jobs import chain
from backend.jobs_api.services import START_COMMITTEE_REFUSED
from backend.ledger import models as mirror

pytestmark = pytest.mark.django_db


def _node_with_dataset(monkeypatch, *, allow_small_committees: bool, part: int = 0, members: int = 1):
    """The first of ``members`` nodes, each with its own eighth of the digits (so that many can join
    a job; records no other dataset of the test holds: datasets sharing records share a budget)."""
    nodes = make_nodes(members, seed="committee-size", allow_small_committees=allow_small_committees)
    parts = digits_parts(8)
    datasets = [
        add_dataset(node, monkeypatch, *parts[part + i], name=f"digits-{part + i}")
        for i, node in enumerate(nodes)
    ]
    return nodes[0], datasets[0]


@pytest.mark.parametrize("size", [1, 2, 4, 14])
def test_production_refuses_small_or_even_committees(operator_client, monkeypatch, size):
    node, dataset = _node_with_dataset(monkeypatch, allow_small_committees=False)
    assert chain.allows_small_committees(node.ctx) is False
    with acting_as(node, monkeypatch):
        response = operator_client.post(
            "/api/jobs", job_request(dataset.pk, committee_size=size), format="json"
        )
    assert response.status_code == 409, response.content
    body = response.json()
    assert "committee size must be odd and at least 3" in str(body["errors"]["committee_size"])
    assert not mirror.Job.objects.exists()  # refused before anything went on chain


def test_production_takes_odd_committees_and_development_small_ones(operator_client, monkeypatch):
    node, dataset = _node_with_dataset(monkeypatch, allow_small_committees=False, members=4)
    with acting_as(node, monkeypatch):
        request = job_request(dataset.pk, committee_size=3, min_trainers=1)
        response = operator_client.post("/api/jobs", request, format="json")
    assert response.status_code == 201, response.content
    assert node.ctx.ledger.fl.get_job(response.json()["onchain_id"]).committee_size == 3
    dev, dev_dataset = _node_with_dataset(monkeypatch, allow_small_committees=True, part=4, members=3)
    assert chain.allows_small_committees(dev.ctx) is True
    with acting_as(dev, monkeypatch):
        response = operator_client.post(
            "/api/jobs", job_request(dev_dataset.pk, committee_size=2, min_trainers=1), format="json"
        )
    assert response.status_code == 201, response.content


def test_the_first_committee_cannot_be_chosen(operator_client, monkeypatch):
    node, dataset = _node_with_dataset(monkeypatch, allow_small_committees=True, members=2)
    with acting_as(node, monkeypatch):
        request = job_request(dataset.pk, committee_size=1, min_trainers=1)
        created = operator_client.post("/api/jobs", request, format="json")
        assert created.status_code == 201, created.content
        job = created.json()
        response = operator_client.post(
            f"/api/jobs/{job['id']}/start", {"committee": [node.ctx.address]}, format="json"
        )
    assert response.status_code == 400, response.content
    assert "drawn on chain" in str(response.json()["errors"]["committee"])
    assert "drawn on chain" in START_COMMITTEE_REFUSED
