"""Schemathesis fuzzes the node's own OpenAPI schema: no 5xx and no response the schema does not describe.

Every operation of the schema drf-spectacular generates (the one /api/schema/ serves) is called
as each role (operator, data provider, viewer) and anonymously, with valid (positive) and invalid
(negative) requests. Then a stateful run follows the links schemathesis infers between the
operations (a created dataset's id into its grants, a job's id into join/start/cancel...), as the
operator. A real in-process chain with two admitted members, a dataset each and one joined job
stands behind the API, so the job and dataset endpoints answer with real records, not 404s.

Checks: no server error, the response body matches the schema of its status code, and its
content type is the declared one. The number of generated cases is printed (terminal reporter),
so a run that silently generated nothing is visible.
"""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.stateful import run_state_machine_as_test
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from backend.identity.roles import ALL_ROLES
from backend.nodes.accounts import api_token, create_or_update_user
from tests.jobs.jobs_helpers import acting_as, add_dataset, digits_parts, job_request, make_nodes

# The fuzz takes minutes on a quiet machine and far more on a loaded one: past pytest's 900 s default.
pytestmark = [pytest.mark.django_db, pytest.mark.slow, pytest.mark.timeout(2400)]

CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]
# Examples per operation, role and mode: ~37 operations x 4 identities x 2 modes x this (about a
# thousand cases; 6 gave 1464 cases, 17 min under a load average of 19 on two cores).
EXAMPLES = 4
STATEFUL_STEPS = 25
STATEFUL_RUNS = 8


def _openapi_document() -> dict:
    """The schema exactly as /api/schema/ serves it (same generator, same renderer)."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer

    document = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(document))


@pytest.fixture
def wsgi_requests(settings):
    """Requests straight into Django's WSGI handler inside the test's transaction.

    Django closes the connection at each request's start and end, which would end the test's
    transaction; its own test client disconnects that handler the same way."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    settings.ALLOWED_HOSTS = ["*"]
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def federation(db, monkeypatch, wsgi_requests):
    """Two admitted members on an in-process chain, a dataset each, one job both joined."""
    from rest_framework.test import APIClient

    nodes = make_nodes(2, seed="schemathesis")
    (x0, y0), (x1, y1) = digits_parts(2)
    datasets = [
        add_dataset(nodes[0], monkeypatch, x0, y0, name="digits-a"),
        add_dataset(nodes[1], monkeypatch, x1, y1, name="digits-b"),
    ]
    tokens = {}
    for role in ALL_ROLES:
        user, _ = create_or_update_user(f"fuzz-{role.value}", role, password="correct horse")
        tokens[role.value] = api_token(user)
    operator = APIClient()
    operator.credentials(HTTP_AUTHORIZATION=f"Token {tokens['operator']}")
    with acting_as(nodes[0], monkeypatch):
        job = operator.post("/api/jobs", job_request(datasets[0].pk), format="json")
        assert job.status_code == 201, job.content
        joined = operator.post(
            f"/api/jobs/{job.json()['id']}/join", {"dataset": datasets[0].pk}, format="json"
        )
        assert joined.status_code == 200, joined.content
    with acting_as(nodes[1], monkeypatch):
        joined = operator.post(
            f"/api/jobs/{job.json()['id']}/join", {"dataset": datasets[1].pk}, format="json"
        )
        assert joined.status_code == 200, joined.content
    # Every fuzzed request is served by node 0.
    with acting_as(nodes[0], monkeypatch):
        yield {"tokens": tokens}


def _schema():
    from django.core.wsgi import get_wsgi_application

    schema = schemathesis.openapi.from_dict(_openapi_document())
    schema.app = get_wsgi_application()
    return schema


def _report(request, line: str) -> None:
    """Straight to the terminal, past pytest's output capture: the count is part of the result."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is None or reporter is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


def _headers(token: str | None) -> dict:
    return {"Authorization": f"Token {token}"} if token else {}


def _fuzz(operation, mode, token) -> int:
    """Runs EXAMPLES generated cases of one operation as one identity; returns how many ran."""
    ran = 0

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def call(case):
        nonlocal ran
        ran += 1
        case.call_and_validate(headers=_headers(token), checks=CHECKS)

    try:
        call()
    except Unsatisfiable:
        # Negative mode on an operation with no parameter and no body: nothing can be made invalid.
        if mode is not GenerationMode.NEGATIVE or ran:
            raise
    return ran


def test_every_operation_as_every_role_has_no_server_error_or_schema_violation(federation, request):
    schema = _schema()
    identities = {"anonymous": None} | federation["tokens"]
    cases = 0
    operations = 0
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for who, token in identities.items():
                try:
                    cases += _fuzz(operation, mode, token)
                except (Exception, BaseExceptionGroup) as error:  # noqa: BLE001 (collected, reported together below)
                    failures.append(f"{operation.label} as {who} ({mode.value}): {error}")
    _report(request, f"schemathesis: {cases} generated cases over {operations} operations")
    assert not failures, f"{len(failures)} failing:\n\n" + "\n\n".join(failures)
    assert operations >= 30, operations
    assert cases >= operations * 8


def test_stateful_links_as_the_operator(federation, request):
    schema = _schema()
    token = federation["tokens"]["operator"]
    base = schema.as_state_machine()
    calls = 0

    class OperatorMachine(base):
        def get_call_kwargs(self, case):
            return {"headers": _headers(token)}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            nonlocal calls
            calls += 1
            case.validate_response(response, checks=CHECKS)

    run_state_machine_as_test(
        OperatorMachine,
        settings=settings(
            max_examples=STATEFUL_RUNS,
            stateful_step_count=STATEFUL_STEPS,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        ),
    )
    links = schema.statistic.transitions.total
    _report(request, f"schemathesis stateful: {calls} calls in {STATEFUL_RUNS} scenarios over {links} links")
    assert links > 0
    assert calls > STATEFUL_RUNS
