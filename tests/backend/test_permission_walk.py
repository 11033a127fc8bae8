"""Every route of the node, found by walking Django's URL resolver, answers each identity as its rule says.

The table below names the rule of each (route name, method). The walk finds the operations
themselves (DRF viewsets' action maps, APIView handlers; plain Django views from the table), so
a route added without a line here fails ``test_every_route_has_a_rule``, and one whose guard
is dropped or loosened fails the walk:

- anonymous: 401 wherever a role is needed (DRF's token authenticator answers first);
- an authenticated user whose role is not allowed: 403;
- a user whose role is allowed: neither 401 nor 403, and no 500 (path ids that do not exist give
  404, empty bodies 400, a blob no reachable peer holds 503: the guard was passed, the point).

Peer routes are not for users at all: they need a request signed by a registered node, so
anonymous callers and every user token alike are refused (401/403). ``admin/`` is Django's
admin, guarded by its own staff login (a redirect), and is outside this walk.
"""

from __future__ import annotations

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient

from backend.identity.roles import Role

pytestmark = pytest.mark.django_db

OPERATOR = frozenset({Role.OPERATOR})
PROVIDERS = frozenset({Role.OPERATOR, Role.PROVIDER})
EVERY_ROLE = frozenset({Role.OPERATOR, Role.PROVIDER, Role.VIEWER})
PUBLIC = "public"  # no credentials needed
PEER = "peer"  # a signature of a registered node, never a user's credentials

RULES: dict[tuple[str, str], frozenset | str] = {
    ("health", "GET"): PUBLIC,
    ("schema", "GET"): PUBLIC,
    ("swagger-ui", "GET"): PUBLIC,
    ("dashboard", "GET"): PUBLIC,  # the SPA's HTML shell; its data comes from the guarded API
    ("auth-login", "POST"): PUBLIC,
    ("auth-logout", "POST"): EVERY_ROLE,
    ("auth-me", "GET"): EVERY_ROLE,
    ("node", "GET"): EVERY_ROLE,
    ("peers", "GET"): EVERY_ROLE,
    ("events", "GET"): EVERY_ROLE,
    ("swarm-peer-push", "POST"): PEER,
    ("swarm-peer-fetch", "POST"): PEER,
    ("swarm-peer-has", "POST"): PEER,
    ("swarm-peer-verify", "POST"): PEER,
    ("jobs-peer-update-key", "POST"): PEER,  # a sealed update's key (backend.jobs.sealed)
    ("swarm-upload", "POST"): OPERATOR,
    ("swarm-download", "GET"): EVERY_ROLE,
    ("swarm-stat", "GET"): EVERY_ROLE,
    ("swarm-node-stat", "GET"): EVERY_ROLE,
    ("job-list", "GET"): EVERY_ROLE,
    ("job-list", "POST"): OPERATOR,
    ("job-detail", "GET"): EVERY_ROLE,
    ("job-cancel", "POST"): OPERATOR,
    ("job-committee", "GET"): EVERY_ROLE,
    ("job-limits", "GET"): EVERY_ROLE,  # fl_node.job.limits, for the job form
    ("job-join", "POST"): OPERATOR,
    ("job-rounds", "GET"): EVERY_ROLE,
    ("job-start", "POST"): OPERATOR,
    ("dataset-list", "GET"): EVERY_ROLE,
    ("dataset-list", "POST"): PROVIDERS,
    ("dataset-detail", "GET"): EVERY_ROLE,
    ("dataset-grants", "GET"): EVERY_ROLE,
    ("dataset-grants", "POST"): PROVIDERS,
    ("dataset-revoke", "DELETE"): PROVIDERS,
    ("model-list", "GET"): EVERY_ROLE,
    ("model-detail", "GET"): EVERY_ROLE,
    ("model-download", "GET"): EVERY_ROLE,
    ("model-predict", "POST"): EVERY_ROLE,  # inference changes nothing stored
    ("cluster", "GET"): EVERY_ROLE,
    ("job-tasks", "GET"): EVERY_ROLE,
    ("job-tasks-priority", "POST"): OPERATOR,
    ("job-task-cancel", "POST"): OPERATOR,
    ("dashboard-overview", "GET"): EVERY_ROLE,
    ("dashboard-join-candidates", "GET"): EVERY_ROLE,
    ("dashboard-granted-datasets", "GET"): EVERY_ROLE,
    ("dashboard-models", "GET"): EVERY_ROLE,
    ("users", "GET"): OPERATOR,  # accounts: operators manage them (backend/nodes/account_views.py)
    ("users", "POST"): OPERATOR,
    ("user", "GET"): OPERATOR,
    ("user", "PATCH"): OPERATOR,
    ("tokens", "GET"): EVERY_ROLE,  # each user's own logins and tokens; an operator's list has all
    ("tokens", "POST"): EVERY_ROLE,
    ("token", "DELETE"): EVERY_ROLE,
    # Prometheus' scrape: its own guard (a bearer token or an allowed address, loopback here),
    # never a user's credentials (backend/monitoring)
    ("metrics", "GET"): PUBLIC,
    ("health-live", "GET"): PUBLIC,  # a load balancer's probes
    ("health-ready", "GET"): PUBLIC,
    ("api-not-found", "GET"): PUBLIC,  # every other /api/ path: a JSON 404 for anyone
    ("api-not-found", "POST"): PUBLIC,
}

# Values for path parameters: well-formed, naming nothing that exists.
SAMPLE_ARGUMENTS = {
    "pk": "987654",
    "job_id": "987654",
    "task_id": "987654",
    "reference": "ab" * 32,
    "node": "0x" + "cd" * 20,
    "path": "jobs",
}
HANDLER_METHODS = ("get", "post", "put", "patch", "delete")


def _patterns(patterns, groups=()):
    for entry in patterns:
        names = groups + tuple(entry.pattern.regex.groupindex)
        if isinstance(entry, URLResolver):
            if str(entry.pattern).startswith("admin/"):
                continue
            yield from _patterns(entry.url_patterns, names)
        elif isinstance(entry, URLPattern):
            yield entry, names


def _methods(callback) -> list[str] | None:
    """The HTTP methods a route serves, from the view itself; None for a plain Django view."""
    actions = getattr(callback, "actions", None)
    if actions:  # a DRF viewset route: {"get": "list", ...}
        # DRF adds "head" (GET's handler) to this dict on the route's first request, so whether it
        # is there depends on which tests ran before in this process; HEAD has GET's rule.
        return sorted(method.upper() for method in actions if method != "head")
    view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if view_class is None:
        return None
    return sorted(method.upper() for method in HANDLER_METHODS if hasattr(view_class, method))


def walk() -> list[tuple[str, str, str]]:
    """(route name, method, a concrete URL) for every operation the URL resolver serves."""
    operations = []
    for pattern, names in _patterns(get_resolver().url_patterns):
        assert pattern.name, f"route {pattern.pattern} has no name: the walk cannot name its rule"
        url = reverse(pattern.name, kwargs={name: SAMPLE_ARGUMENTS[name] for name in names})
        methods = _methods(pattern.callback)
        if methods is None:
            methods = sorted(method for name, method in RULES if name == pattern.name)
            assert methods, f"plain view {pattern.name} ({pattern.pattern}) has no rule in RULES"
        operations += [(pattern.name, method, url) for method in methods]
    return operations


def test_every_route_has_a_rule():
    operations = walk()
    missing = [f"{method} {url} ({name})" for name, method, url in operations if (name, method) not in RULES]
    assert not missing, "routes without a rule in RULES (add one):\n" + "\n".join(missing)
    assert len(operations) >= 40, operations


def _call(client: APIClient, method: str, url: str):
    if method == "GET":
        return client.get(url)
    return getattr(client, method.lower())(url, {}, format="json")


def test_each_identity_gets_what_its_role_allows(make_client):
    clients = {None: make_client(None)} | {role: make_client(role) for role in Role}
    wrong: list[str] = []
    calls = 0
    # Logging out deletes the caller's token: that route goes last.
    for name, method, url in sorted(walk(), key=lambda operation: operation[0] == "auth-logout"):
        rule = RULES[(name, method)]
        for role, client in clients.items():
            calls += 1
            status = _call(client, method, url).status_code
            if rule == PEER:
                expected_ok = status in (401, 403)
                want = "401/403 (not signed by a node)"
            elif rule == PUBLIC:
                expected_ok = status not in (401, 403, 500)
                want = "no 401/403/500 (public)"
            elif role is None:
                expected_ok = status == 401
                want = "401"
            elif role in rule:
                # 503 is a refusal past the guard (a blob no reachable peer holds), not a crash.
                expected_ok = status not in (401, 403, 500)
                want = "no 401/403/500 (allowed)"
            else:
                expected_ok = status == 403
                want = "403"
            if not expected_ok:
                who = role.value if role else "anonymous"
                wrong.append(f"{method} {url} ({name}) as {who}: {status}, want {want}")
    assert not wrong, f"{len(wrong)} of {calls} calls answered wrongly:\n" + "\n".join(wrong)
