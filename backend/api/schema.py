"""The OpenAPI schema states every status an operation can answer, with the error body's shape.

``NodeAutoSchema`` (settings: DEFAULT_SCHEMA_CLASS) adds the errors every operation of a kind
can give: 401 and 403 where a login and a role are needed, 400 where there is a query or a
body to validate, 404 where the path names a record, 413 and 415 where a body is read. A view
adds the errors of its own flow with ``errors(409, 503, ...)`` in its ``extend_schema``
responses. Every error body is ``{"detail": sentence, "errors"?: {field: [messages]}}``
(backend.api.exception_handler). tests/backend/test_schemathesis.py checks each response
against the schema: an undocumented status fails it.
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.permissions import AllowAny

from backend.api.permissions import RolePermission

# The largest id a path or a body may name: 18 digits, below a database's signed 64-bit key (a
# longer number is a 400 in a body, a 404 in a path, never a database overflow).
MAX_RECORD_ID = 10**18 - 1
RECORD_ID_PATTERN = "[0-9]{1,18}"


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="what went wrong, as a sentence")
    # The stubs take this for Serializer.errors, but DRF's serializer metaclass moves declared
    # fields out of the class namespace: nothing is overridden.
    errors = serializers.DictField(  # type: ignore[assignment]
        required=False,
        help_text="400 and 409 on a request's field: {field: [messages]} (nested for dp.*, sparse.*)",
    )


MEANINGS = {
    400: "the request is malformed or a field is out of its bounds (errors names the field)",
    401: "no valid login or token (WWW-Authenticate: Token)",
    403: "the caller's role does not allow this, or a session write without its CSRF token",
    404: "no such record on this node",
    408: "the request body came too slowly",
    409: "the request is well formed but conflicts with this node's state (its datasets, the "
    "federation, the job's state); errors names the field when one is the cause",
    411: "the request has no Content-Length",
    413: "the request body exceeds this node's limit",
    415: "the body's media type is not one this operation reads",
    429: "too many requests: wait the seconds in Retry-After",
    503: "the chain or the swarm store cannot be reached now; the request may succeed later",
}


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    """Error responses for an ``extend_schema(responses=...)``: {code: the error body}."""
    return {code: OpenApiResponse(ErrorSerializer, description=MEANINGS[code]) for code in codes}


# What a CharField accepts once DRF has trimmed it and checked it: some character that is not a
# space, and no NUL anywhere (ProhibitNullCharactersValidator). Python's \s is what str.strip() trims.
NOT_BLANK_PATTERN = r"^[^\x00]*[^\s\x00][^\x00]*$"
NO_NUL_PATTERN = r"^[^\x00]*$"


class NodeAutoSchema(AutoSchema):
    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        declared = [
            v.regex if isinstance(v.regex, str) else v.regex.pattern
            for v in getattr(field, "validators", ())
            if isinstance(v, RegexValidator) and not v.inverse_match
        ]
        if declared and "pattern" not in schema:
            schema["pattern"] = declared[0]  # a list's child keeps its own (spectacular drops it)
        if direction == "request" and type(field) is serializers.CharField and "pattern" not in schema:
            # DRF refuses "", "   " (once trimmed) and a NUL in a CharField; the schema says so, so a
            # client (and the fuzz) can tell a valid value from a refused one.
            if not field.allow_blank:
                schema["minLength"] = max(schema.get("minLength", 0), 1)
            schema["pattern"] = (
                NOT_BLANK_PATTERN if not field.allow_blank and field.trim_whitespace else NO_NUL_PATTERN
            )
        return schema

    def _automatic_errors(self) -> list[int]:
        codes: list[int] = []
        permissions = [permission() for permission in getattr(self.view, "permission_classes", [])]
        if permissions and not all(isinstance(permission, AllowAny) for permission in permissions):
            codes.append(401)
            # Roles may refuse; so may CSRF on a session's write.
            if any(isinstance(p, RolePermission) for p in permissions) or self.method not in ("GET", "HEAD"):
                codes.append(403)
        if "{" in self.path:
            codes.append(404)
        parameters = self._get_parameters()
        has_query = any(parameter.get("in") == "query" for parameter in parameters)
        # A path parameter with a pattern is checked by the view (a 400 for a malformed one).
        has_query |= any(p.get("in") == "path" and "pattern" in p.get("schema", {}) for p in parameters)
        has_body = self.method in ("POST", "PUT", "PATCH") and self._get_request_body() is not None
        if has_query or has_body:
            codes.append(400)
        if has_body:
            codes += [413, 415]
        return codes

    def _get_request_body(self, direction="request"):
        body = super()._get_request_body(direction)
        # A view that cannot take an absent body (an upload) says so: the schema marks it required.
        if body is not None and getattr(self.view, "request_body_required", False):
            body["required"] = True
        return body

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code in self._automatic_errors():
            if str(code) not in responses:
                responses[str(code)] = self._get_response_for_code(
                    OpenApiResponse(ErrorSerializer, description=MEANINGS[code]),
                    str(code),
                    direction=direction,
                )
        return dict(sorted(responses.items()))


def bounded_path_ids(result, generator, request, public):
    """Postprocessing hook: every record id in a path (``id``, ``pk``, ``*_id``) is an integer of at
    most 18 digits, as the routes match it (RecordRouter, the id converters); a longer one is a 404."""
    for item in result.get("paths", {}).values():
        for operation in item.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                name = parameter.get("name", "")
                if parameter.get("in") == "path" and (name in ("id", "pk") or name.endswith("_id")):
                    parameter["schema"] = {"type": "integer", "minimum": 0, "maximum": MAX_RECORD_ID}
    return result
