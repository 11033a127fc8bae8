"""The one place where errors become HTTP responses, and the guard that nothing internal leaks.

Every error body has ``detail`` (a sentence); validation errors also carry ``errors``
({field: [messages]}), as docs/API.md promises.

Status: an error family says what it means in HTTP on the family itself: the ledger's and the
swarm's exceptions carry ``http_status`` (a plain int, so neither needs DRF), the DomainError
family ``status_code``, and the learning core's budget error is named here (fl_node knows no HTTP).

Leaks: a response never carries a filesystem path, a URL (a peer's endpoint, the chain's RPC),
a network address, SQL or a traceback, whoever asks: messages are scrubbed of them, and an
error that no family claims (a bug, a database error) becomes a 500 with a reference id. The
full error, with its traceback, goes to the node's log under that id.
"""

from __future__ import annotations

import logging
import re
import uuid

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from backend.api.errors import DomainError
from fl_node.privacy import PrivacyBudgetExceeded

logger = logging.getLogger(__name__)

# What a message must not show. URLs first (they contain paths), then addresses, then paths.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>)\]]+")
_HOST_PORT = re.compile(r"\b(?:\d{1,3}(?:\.\d{1,3}){3}|localhost|\[[0-9a-fA-F:]+\])(?::\d{1,5})?\b")
_PATH = re.compile(r"(?<![\w.:/<-])(?:~|\.{1,2})?/(?:[^\s/'\"<>:;,()\[\]]+/)+[^\s/'\"<>:;,()\[\]]*")
# Upper-case keywords only: "delete the dataset from the node" is a sentence, not a query.
_SQL = re.compile(r"\b(?:SELECT|INSERT|UPDATE|DELETE)\b.*\b(?:FROM|INTO|SET|WHERE)\b.*", re.DOTALL)


def scrub(message: str) -> str:
    """The message without URLs, network addresses, filesystem paths or SQL."""
    message = _URL.sub("<url>", message)
    message = _HOST_PORT.sub("<address>", message)
    message = _PATH.sub("<path>", message)
    return _SQL.sub("<query>", message)


def _scrub_tree(value):
    if isinstance(value, dict):
        return {key: _scrub_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_scrub_tree(item) for item in value]
    if isinstance(value, str):  # ErrorDetail is a str: keep its text, drop its code
        return scrub(str(value))
    return value


def http_status_of(exc: Exception) -> int | None:
    """The HTTP status an error family declares, or None (not ours: a bug, a database error)."""
    declared = getattr(type(exc), "http_status", None)
    if isinstance(declared, int):
        return declared
    if isinstance(exc, PrivacyBudgetExceeded):  # should one escape a service untranslated
        return status.HTTP_409_CONFLICT
    return None


def _first_message(errors) -> str:
    if isinstance(errors, dict):
        for field, value in errors.items():
            message = _first_message(value)
            return message if field in ("non_field_errors", "detail") else f"{field}: {message}"
    if isinstance(errors, list) and errors:
        return _first_message(errors[0])
    return str(errors)


def _internal_error(exc: Exception, context) -> Response:
    reference = uuid.uuid4().hex[:12]
    set_rollback()
    logger.error("internal error %s in %s", reference, context.get("view"), exc_info=exc)
    body = {
        "detail": f"the node could not handle this request (an internal error, reference {reference}); "
        "its operator finds the details in the node's log"
    }
    return Response(body, status=status.HTTP_500_INTERNAL_SERVER_ERROR)


def exception_handler(exc, context):
    if isinstance(exc, DomainError):
        detail = scrub(str(exc))
        body: dict[str, object] = {"detail": detail}
        if exc.field:
            body["errors"] = {exc.field: [detail]}
        return Response(body, status=exc.status_code)

    if isinstance(exc, exceptions.ValidationError):
        errors = _scrub_tree(exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail})
        return Response({"detail": _first_message(errors), "errors": errors}, status=exc.status_code)

    if isinstance(exc, exceptions.APIException):
        # DRF's own exceptions (401, 403, 404, 405, 413, 415, 429) already have a sentence;
        # DRF's handler adds WWW-Authenticate and Retry-After.
        response = drf_exception_handler(exc, context)
        if response is not None:
            response.data = _scrub_tree(response.data)
        return response

    service_status = http_status_of(exc)
    if service_status is not None:
        # The full text (a peer's URL, a keystore path) is for the log, the sentence for the caller.
        logger.warning("service error in %s: %r", context.get("view"), exc)
        return Response({"detail": scrub(str(exc)) or type(exc).__name__}, status=service_status)

    if isinstance(exc, RequestDataTooBig):  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE, checked from the header
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {
                "detail": f"the request body exceeds this node's limit of {limit} bytes (DEFL_MAX_REQUEST_BYTES)"
            },
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, SuspiciousOperation):  # too many fields, a bad Host: the caller's error
        logger.warning("suspicious request in %s: %r", context.get("view"), exc)
        return Response({"detail": "the request is malformed"}, status=status.HTTP_400_BAD_REQUEST)

    response = drf_exception_handler(exc, context)  # Http404, PermissionDenied
    if response is not None:
        return response
    return _internal_error(exc, context)
