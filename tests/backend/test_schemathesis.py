"""Schemathesis fuzzes the node's own OpenAPI schema: the schema must say exactly what the API does.

Every operation of the schema drf-spectacular generates (the one /api/schema/ serves) is called
as each role (operator, data provider, viewer) and anonymously, with valid (positive) and invalid
(negative) requests. Then a stateful run follows the links schemathesis infers between the
operations (a created dataset's id into its grants, a job's id into join/start/cancel...), as the
operator. A real in-process chain with two admitted members, a dataset each and one joined job
stands behind the API, so the job and dataset endpoints answer with real records, not 404s.

Five counts, each must be 0 (printed past pytest's capture, with the number of cases):
- server errors: a 5xx;
- schema violations: a body or content type the schema does not describe for its status;
- undocumented statuses: a status the operation does not list;
- valid requests rejected: a request the schema allows answered 400/413/415/422 (schemathesis
  takes 401, 403, 404, 409 and 429 as the state refusing a valid request, not the request);
- invalid requests accepted: a request the schema forbids answered 2xx.
Every generated case runs and counts (a failing case does not stop its operation's run).
``DEFL_SCHEMATHESIS_ONLY=<text>`` fuzzes only the operations whose label contains the text;
``DEFL_SCHEMATHESIS_REPORT=<file>`` writes every failing case there.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from hypothesis.stateful import run_state_machine_as_test
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import AcceptedNegativeData, Failure, FailureGroup, ServerError
from schemathesis.generation import GenerationMode
from schemathesis.openapi.checks import RejectedPositiveData, UndefinedStatusCode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from backend.identity.roles import ALL_ROLES
from backend.nodes.accounts import api_token, create_or_update_user
from tests.jobs.jobs_helpers import acting_as, add_dataset, digits_parts, job_request, make_nodes

# The fuzz takes minutes on a quiet machine and far more on a loaded one: past pytest's 900 s default.
pytestmark = [pytest.mark.django_db, pytest.mark.slow, pytest.mark.timeout(2400)]

# What an uploaded file holds (a CSV or NPZ that parses, its label column, delta <= 1/(10 n) for
# its n records, its class names) no schema can state: the upload's 400 naming only these fields is
# the file refused, not a valid request rejected. Every other 400 of a schema-valid request counts.
FILE_CONTENT_FIELDS = {"file", "format", "label_column", "delta", "classes"}
UPLOADS = {"POST /api/datasets"}


def _file_content_refused(response, case) -> bool:
    if case.operation.label not in UPLOADS or response.status_code != 400:
        return False
    try:
        fields = set(json.loads(response.content).get("errors") or {})
    except ValueError:
        return False
    return bool(fields) and fields <= FILE_CONTENT_FIELDS


@schemathesis.check
def valid_requests_accepted(ctx, response, case):
    """positive_data_acceptance, but for an uploaded file's content (above)."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if _file_content_refused(response, case):
            return None
        raise


CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    content_type_conformance,
    status_code_conformance,
    valid_requests_accepted,
    negative_data_rejection,
]
KINDS = (
    "server errors",
    "schema violations",
    "undocumented statuses",
    "valid requests rejected",
    "invalid requests accepted",
)
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
        request = job_request(datasets[0].pk, committee_size=1, min_trainers=1)  # two members can start it
        job = operator.post("/api/jobs", request, format="json")
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
        yield {"tokens": {role: (lambda role=role: _identity(role)) for role in tokens}}


def _identity(role: str) -> str:
    """A fresh token of the role's fuzz user, enabled and in its role again: a fuzzed logout, token
    revocation, user change or password reset must not turn the following cases into 401s."""
    from django.contrib.auth import get_user_model

    user, _ = create_or_update_user(f"fuzz-{role}", role)
    get_user_model().objects.filter(pk=user.pk).update(is_active=True)
    return api_token(user, "fuzz")


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


def _headers(identity) -> dict:
    # identity: the answers come as they are (the test client does not unzip; gzip is tested apart).
    plain = {"Accept-Encoding": "identity"}
    return plain | ({"Authorization": f"Token {identity()}"} if identity else {})


def _kind(failure: Failure) -> str:
    if isinstance(failure, ServerError):
        return "server errors"
    if isinstance(failure, UndefinedStatusCode):
        return "undocumented statuses"
    if isinstance(failure, RejectedPositiveData):
        return "valid requests rejected"
    if isinstance(failure, AcceptedNegativeData):
        return "invalid requests accepted"
    return "schema violations"  # a body, media type or content the schema does not describe


def _failures(error: BaseException) -> list[Failure]:
    if isinstance(error, FailureGroup):
        return [failure for failure in error.exceptions if isinstance(failure, Failure)]
    if isinstance(error, Failure):
        return [error]
    raise error  # not a finding of a check: a broken test set-up


class Findings:
    """Each failing case's failures by kind: counted, grouped by operation, and one line each."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.by_operation: Counter[str] = Counter()
        self.lines: list[str] = []

    def record(self, label: str, error: BaseException, case, response) -> None:
        answer = f"{response.status_code} {response.text[:300]}" if response is not None else ""
        for failure in _failures(error):
            kind = _kind(failure)
            self.counts[kind] += 1
            self.by_operation[f"{kind}: {case.operation.label}"] += 1
            title = str(getattr(failure, "title", "") or type(failure).__name__)
            message = str(getattr(failure, "message", "") or failure)[:400]
            self.lines.append(
                f"[{kind}] {label}: {title}: {message}\n  answer: {answer}\n  {case.as_curl_command()[:2000]}"
            )

    def summary(self) -> str:
        return ", ".join(f"{kind} {self.counts[kind]}" for kind in KINDS)

    def report(self) -> str:
        """What the assertion shows: the counts, per operation, then the first cases in full."""
        report = os.environ.get("DEFL_SCHEMATHESIS_REPORT")
        if report:  # every case, for whoever fixes them
            Path(report).write_text("\n\n".join(self.lines))
        grouped = "\n".join(f"  {n} x {key}" for key, n in self.by_operation.most_common())
        return f"{self.summary()}\n{grouped}\n\n" + "\n\n".join(self.lines[:40])


def _fuzz(operation, mode, token, label: str, findings: Findings) -> int:
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
        response = None
        try:
            response = case.call(headers=_headers(token))
            case.validate_response(response, checks=CHECKS)
        except (Failure, FailureGroup) as error:
            findings.record(label, error, case, response)

    try:
        call()
    except Unsatisfiable:
        # Negative mode on an operation with no parameter and no body: nothing can be made invalid.
        if mode is not GenerationMode.NEGATIVE or ran:
            raise
    return ran


def test_every_operation_as_every_role_answers_as_the_schema_says(federation, request):
    schema = _schema()
    identities = {"anonymous": None} | federation["tokens"]
    only = os.environ.get("DEFL_SCHEMATHESIS_ONLY", "")
    findings = Findings()
    cases = 0
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if only and only not in operation.label:
            continue
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for who, token in identities.items():
                label = f"{operation.label} as {who} ({mode.value})"
                cases += _fuzz(operation, mode, token, label, findings)
    _report(
        request, f"schemathesis: {cases} generated cases over {operations} operations: {findings.summary()}"
    )
    assert not findings.counts, findings.report()
    assert operations >= (1 if only else 30), operations
    assert cases >= operations * 8


def test_stateful_links_as_the_operator(federation, request):
    schema = _schema()
    token = federation["tokens"]["operator"]
    base = schema.as_state_machine()
    calls = 0
    findings = Findings()

    class OperatorMachine(base):
        def get_call_kwargs(self, case):
            return {"headers": _headers(token)}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            nonlocal calls
            calls += 1
            try:
                case.validate_response(response, checks=CHECKS)
            except (Failure, FailureGroup) as error:
                findings.record(f"{case.operation.label} (stateful)", error, case, response)

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
    _report(
        request,
        f"schemathesis stateful: {calls} calls in {STATEFUL_RUNS} scenarios over {links} links: {findings.summary()}",
    )
    assert not findings.counts, findings.report()
    assert links > 0
    assert calls > STATEFUL_RUNS
