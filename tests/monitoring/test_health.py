"""Liveness and readiness: what is not ready is named, with a sentence (no node processes)."""

from __future__ import annotations

import pytest
from django.test import Client


def test_liveness_answers_without_asking_anything():
    response = Client().get("/api/health/live")
    assert response.status_code == 200 and response.json() == {"status": "alive"}


@pytest.mark.django_db
def test_a_node_on_its_in_process_chain_alone_is_ready():
    response = Client().get("/api/health/ready")
    body = response.json()
    assert response.status_code == 200, body
    assert body["not_ready"] == [] and set(body["checks"]) == {"database", "chain", "broker", "swarm"}
    assert body["checks"]["swarm"]["detail"] == "1 of 1 nodes answer; an upload needs 1"


@pytest.mark.django_db
def test_an_unreachable_broker_makes_the_node_not_ready_and_says_so(settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = Client().get("/api/health/ready")
    body = response.json()
    assert response.status_code == 503
    assert body["not_ready"] == ["broker"]
    assert body["checks"]["broker"]["ok"] is False and body["checks"]["broker"]["detail"]


@pytest.mark.django_db
def test_contracts_file_of_another_chain_makes_the_chain_not_ready(settings, tmp_path):
    import json

    from backend.ledger import factory

    settings.DEFL_CHAIN_URL = "http://127.0.0.1:1"  # a chain that does not answer
    (tmp_path / "contracts.json").write_text(json.dumps({"chain_id": 1, "block": 1, "contracts": {}}))
    factory.reset()
    try:
        body = Client().get("/api/health/ready").json()
    finally:
        factory.reset()
    assert body["not_ready"] == ["chain", "swarm"]
    assert "not checked" in body["checks"]["swarm"]["detail"]
