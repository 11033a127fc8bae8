"""The OpenAPI schema of accounts, node, datasets and models generates without warnings or errors.

Generated from this part's routes only (api_only_urls): the whole project's schema also
contains other apps' views, which have their own check.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_schema_validates_without_warnings(tmp_path):
    target = tmp_path / "schema.yml"
    call_command(
        "spectacular",
        "--validate",
        "--fail-on-warn",
        "--urlconf",
        "api_only_urls",
        "--file",
        str(target),
        stdout=io.StringIO(),
    )
    schema = target.read_text()
    for path in (
        "/api/auth/login:",
        "/api/auth/me:",
        "/api/node:",
        "/api/peers:",
        "/api/events:",
        "/api/datasets:",
        "/api/datasets/{id}/grants:",
        "/api/datasets/{id}/grants/{node}:",
        "/api/models/{id}/predict:",
        "/api/models/{id}/download:",
    ):
        assert path in schema
