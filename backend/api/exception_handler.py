"""The one place where domain errors become HTTP responses.

Every error body has ``detail`` (a sentence); validation errors also carry
``errors`` ({field: [messages]}), as docs/API.md promises. The ledger's and the
swarm's error families are mapped by name of their base class so that this module
does not import web3 or the chunk store (and works before they exist).
"""

from __future__ import annotations

import logging

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from backend.api.errors import DomainError, InvalidInput

logger = logging.getLogger(__name__)

# Error families of the external-service clients, looked up along the MRO by class name.
# "Cannot be served now" (unreachable chain or peers, chunks nobody returned, a ledger
# that is not configured) is 503; a malformed reference is the caller's 400; everything
# else (a revert, a corrupt chunk) conflicts with the current state: 409.
_SERVICE_ERROR_BASES = {"LedgerError", "SwarmError"}
_UNAVAILABLE_NAMES = {
    "ChainUnavailable",
    "LedgerConfigError",
    "TransactionTimeout",
    "PeerError",
    "ChunkNotFound",
    "NotEnoughReplicas",
}
_BAD_REQUEST_NAMES = {"InvalidReference"}
# The learning core's budget error, should one escape a service untranslated.
_CONFLICT_NAMES = {"PrivacyBudgetExceeded"}


def _service_status(exc: Exception) -> int | None:
    names = {klass.__name__ for klass in type(exc).__mro__}
    if names & _CONFLICT_NAMES:
        return status.HTTP_409_CONFLICT
    if not names & _SERVICE_ERROR_BASES:
        return None
    if names & _UNAVAILABLE_NAMES:
        return status.HTTP_503_SERVICE_UNAVAILABLE
    if names & _BAD_REQUEST_NAMES:
        return status.HTTP_400_BAD_REQUEST
    return status.HTTP_409_CONFLICT


def _first_message(errors) -> str:
    if isinstance(errors, dict):
        for field, value in errors.items():
            message = _first_message(value)
            return message if field in ("non_field_errors", "detail") else f"{field}: {message}"
    if isinstance(errors, list) and errors:
        return _first_message(errors[0])
    return str(errors)


def exception_handler(exc, context):
    if isinstance(exc, DomainError):
        body = {"detail": str(exc)}
        if isinstance(exc, InvalidInput) and exc.field:
            body["errors"] = {exc.field: [str(exc)]}
        return Response(body, status=exc.status_code)

    service_status = _service_status(exc)
    if service_status is not None:
        logger.warning("service error in %s: %r", context.get("view"), exc)
        return Response({"detail": str(exc) or type(exc).__name__}, status=service_status)

    if isinstance(exc, exceptions.ValidationError):
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        return Response({"detail": _first_message(errors), "errors": errors}, status=exc.status_code)

    # DRF's own exceptions (401, 403, 404, 405, 415, throttling) already have a detail.
    return drf_exception_handler(exc, context)
