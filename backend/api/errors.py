"""Domain errors that the API layer understands.

Services raise these (or the ledger's and swarm's own error families, which the
exception handler also maps); views never catch them. Each carries the HTTP
status it means, so the one exception handler stays a table lookup.
"""

from __future__ import annotations


class DomainError(Exception):
    """Base of errors that a user can act on; ``str(exc)`` is the message they see.

    ``field`` names the request's field that causes it, when one does: the answer then carries
    ``errors: {field: [message]}`` and the dashboard shows the message beside that field.
    """

    status_code = 400

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class InvalidInput(DomainError):
    """The request alone is unusable: a value no state of the node could accept (a 400)."""


class NotFound(DomainError):
    status_code = 404


class Conflict(DomainError):
    """A well-formed request that the node's state refuses: a duplicate, a dataset too small for the
    job's delta, more seats than the federation has members, a job not open, a revert on chain."""

    status_code = 409


class BudgetExceeded(Conflict):
    """A job would spend more of a dataset's privacy budget than is left."""


class ServiceUnavailable(DomainError):
    """The chain or the swarm store cannot be reached; the request may succeed later."""

    status_code = 503
