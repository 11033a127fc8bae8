"""GET /api/jobs/limits, and the job request's bounds at and one past each limit (fl_node.job.limits).

The request is refused by the serializer before anything reaches the node or the chain, so a
past-the-limit POST needs neither; the at-the-limit side is the same serializer's verdict.
"""

from __future__ import annotations

import json

import pytest

from backend.identity.roles import Role
from backend.jobs_api.serializers import JobCreateSerializer
from fl_node.job import limits
from fl_node.job.config import ConfigError, DPConfig, JobConfig

pytestmark = pytest.mark.django_db

BODY = {
    "name": "limits",
    "model": "mlp",
    "dataset": 1,
    "rounds": 2,
    "lr": 0.1,
    "dp": {"mode": "sgd", "target_epsilon": 3.0, "delta": 1e-5, "max_grad_norm": 1.0},
    "committee_size": 3,
    "top_k": 2,
    "min_trainers": 2,
    "round_timeout_s": 600,
}
DP = BODY["dp"]


def _with(path: str, value) -> dict:
    if path.startswith("dp."):
        return BODY | {"dp": DP | {path[3:]: value}}
    if path.startswith("sparse."):
        return BODY | {"sparse": {path[7:]: value, "tables": ["w"]}}
    return BODY | {path: value}


# (field, the largest value accepted, the smallest refused past it)
BOUNDS = [
    ("rounds", limits.MAX_ROUNDS, limits.MAX_ROUNDS + 1),
    ("local_epochs", limits.MAX_LOCAL_EPOCHS, limits.MAX_LOCAL_EPOCHS + 1),
    ("batch_size", limits.MAX_BATCH_SIZE, limits.MAX_BATCH_SIZE + 1),
    ("committee_size", limits.MAX_COMMITTEE, limits.MAX_COMMITTEE + 1),
    ("top_k", limits.MAX_TOP_K, limits.MAX_TOP_K + 1),
    ("margin_bp", limits.MAX_MARGIN_BP, limits.MAX_MARGIN_BP + 1),
    ("round_timeout_s", limits.MAX_PERIOD_S, limits.MAX_PERIOD_S + 1),
    ("score_timeout_s", limits.MAX_PERIOD_S, limits.MAX_PERIOD_S + 1),
    ("join_timeout_s", limits.MAX_JOIN_TIMEOUT_S, limits.MAX_JOIN_TIMEOUT_S + 1),
    ("seed", limits.MAX_SEED, limits.MAX_SEED + 1),
    ("name", "n" * limits.MAX_JOB_NAME, "n" * (limits.MAX_JOB_NAME + 1)),
    ("max_local_steps", limits.MAX_LOCAL_STEPS, limits.MAX_LOCAL_STEPS + 1),
    ("norm_bound", 9.99e29, limits.NORM_BOUND_BELOW),  # exclusive
    ("dp.target_epsilon", limits.MAX_TARGET_EPSILON, limits.MAX_TARGET_EPSILON * 1.000001),
    ("sparse.public_rows", limits.MAX_PUBLIC_ROWS, limits.MAX_PUBLIC_ROWS + 1),
    ("sparse.link_mbit", limits.MAX_LINK_MBIT, limits.MAX_LINK_MBIT * 1.000001),
    # any committee (at most MAX_COMMITTEE) plus min_trainers stays within MAX_PARTICIPANTS
    (
        "min_trainers",
        limits.MAX_PARTICIPANTS - limits.MAX_COMMITTEE,
        limits.MAX_PARTICIPANTS - limits.MAX_COMMITTEE + 1,
    ),
]


def _errors_of(response, path: str) -> str:
    errors = response.json()["errors"]
    for part in path.split("."):
        errors = errors[part]
    return str(errors)


@pytest.mark.parametrize(("field", "at", "past"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_a_job_field_is_accepted_at_its_limit_and_refused_past_it(operator, field, at, past):
    form = JobCreateSerializer(data=_with(field, at))
    assert form.is_valid(), form.errors
    response = operator.post("/api/jobs", _with(field, past), format="json")
    assert response.status_code == 400, response.content
    message = _errors_of(response, field)
    assert message  # a sentence naming the bound, next to the field


@pytest.mark.parametrize("value", ["1e308", "1e999", str(2**63), str(10**30), "-1e999"])
def test_worst_values_are_refused(operator, value):
    # Raw JSON: "1e999" parses to infinity, which a client library would refuse to send.
    for field in ("rounds", "committee_size", "top_k", "min_trainers", "norm_bound", "dp.target_epsilon"):
        body = json.dumps(_with(field, "VALUE")).replace('"VALUE"', value)
        response = operator.post("/api/jobs", body, content_type="application/json")
        # 2**63 is a norm bound below 1e30, so only the node's state refuses it (no dataset 1 here)
        expected = 409 if (field, value) == ("norm_bound", str(2**63)) else 400
        assert response.status_code == expected, (field, value, response.content)


def test_committee_and_trainers_together_are_bounded_by_the_participants(operator):
    trainers = limits.MAX_PARTICIPANTS - limits.MAX_COMMITTEE
    assert JobCreateSerializer(
        data=BODY | {"committee_size": limits.MAX_COMMITTEE, "min_trainers": trainers}
    ).is_valid()
    body = BODY | {"committee_size": 3, "min_trainers": trainers + 1}  # whatever the committee
    response = operator.post("/api/jobs", body, format="json")
    assert response.status_code == 400
    assert f"less than or equal to {trainers}" in _errors_of(response, "min_trainers")


def _config(**overrides) -> JobConfig:
    values = dict(
        name="limits",
        model="mlp",
        input_shape=(4,),
        num_classes=2,
        schema_hash="0" * 64,
        rounds=2,
        dp=DPConfig(mode="none"),
    )
    return JobConfig(**(values | overrides))


@pytest.mark.parametrize(
    ("at", "past"),
    [
        ({"rounds": limits.MAX_ROUNDS}, {"rounds": limits.MAX_ROUNDS + 1}),
        ({"committee_size": limits.MAX_COMMITTEE}, {"committee_size": limits.MAX_COMMITTEE + 1}),
        ({"top_k": limits.MAX_TOP_K}, {"top_k": limits.MAX_TOP_K + 1}),
        ({"margin_bp": limits.MAX_MARGIN_BP}, {"margin_bp": limits.MAX_MARGIN_BP + 1}),
        (
            {"committee_size": 3, "min_trainers": limits.MAX_PARTICIPANTS - 3},
            {"committee_size": 3, "min_trainers": limits.MAX_PARTICIPANTS - 2},
        ),
    ],
)
def test_the_job_configuration_reads_the_same_limits(at, past):
    _config(**at)  # a configuration fetched from another node is checked against the same numbers
    with pytest.raises(ConfigError) as caught:
        _config(**past)
    assert caught.value.field == next(iter(past)) if len(past) == 1 else "min_trainers"


def test_the_limits_endpoint_answers_every_role(make_client, settings):
    for role in Role:
        response = make_client(role).get("/api/jobs/limits")
        assert response.status_code == 200, (role, response.content)
        assert response.json() == limits.as_dict() | {"max_upload_bytes": settings.DEFL_MAX_UPLOAD_BYTES}
    assert response.json()["max_committee"] == limits.MAX_COMMITTEE == 15


def test_the_limits_endpoint_needs_a_login(anonymous):
    assert anonymous.get("/api/jobs/limits").status_code == 401


def test_the_limits_are_in_the_schema(operator):
    schema = operator.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/jobs/limits"]["get"]
    shape = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert set(schema["components"]["schemas"][shape]["properties"]) == set(limits.as_dict()) | {
        "max_upload_bytes"
    }
