"""The privacy parts of the API are typed in the OpenAPI schema (the dashboard builds against them)."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator


@pytest.fixture(scope="module")
def components(django_db_blocker):
    with django_db_blocker.unblock():
        return SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]


def _properties(components, name: str) -> dict:
    return components[name]["properties"]


def test_the_dataset_budget_is_typed(components):
    budget = _properties(components, "Budget")
    for field in ("epsilon_cap", "delta", "epsilon_spent", "epsilon_reserved", "epsilon_left"):
        assert budget[field]["type"] == "number", field
    assert budget["budget_group"] == {**budget["budget_group"], "type": "array"}
    assert budget["budget_group"]["items"]["type"] == "integer"
    assert budget["explanation"]["type"] == "string"
    assert set(_properties(components, "JobSpend")) == {"job", "epsilon", "rounds"}


def test_the_job_privacy_and_the_round_releases_are_typed(components):
    job = _properties(components, "Job")
    assert job["privacy"]["$ref"].endswith("/JobPrivacy")
    privacy = _properties(components, "JobPrivacy")
    assert set(privacy) == {"target_epsilon", "delta", "epsilon_max", "final", "participants"}
    assert privacy["final"]["type"] == "boolean"
    participant = _properties(components, "ParticipantPrivacy")
    assert set(participant) == {
        "node",
        "dataset",
        "epsilon_spent",
        "epsilon_local",
        "epsilon_reserved",
        "source",
    }
    release = _properties(components, "ReleaseRecord")
    assert set(release) == {
        "kind",
        "noise_multiplier",
        "sample_rate",
        "steps",
        "delta",
        "epsilon_after",
        "status",
    }
    assert release["epsilon_after"]["type"] == "number"
    assert _properties(components, "Round")["privacy"]["items"]["$ref"].endswith("/ReleaseRecord")
