"""Every error family says what it means in HTTP on itself (docs/ARCHITECTURE.md, issue 16)."""

from __future__ import annotations

import inspect

import pytest

from backend.api.exception_handler import http_status_of
from backend.ledger import errors as ledger_errors
from backend.swarm import errors as swarm_errors
from fl_node.privacy import PrivacyBudgetExceeded


def _family(module, base) -> list[type]:
    return [c for _, c in inspect.getmembers(module, inspect.isclass) if issubclass(c, base)]


@pytest.mark.parametrize(
    "klass",
    _family(ledger_errors, ledger_errors.LedgerError) + _family(swarm_errors, swarm_errors.SwarmError),
)
def test_every_ledger_and_swarm_error_declares_a_status(klass: type) -> None:
    assert klass.http_status in (400, 404, 409, 413, 503)  # 404: a blob no node holds


def test_the_statuses_mean_what_the_caller_can_do() -> None:
    assert http_status_of(ledger_errors.ChainUnavailable("down")) == 503
    assert http_status_of(swarm_errors.PeerError("gone")) == 503  # through SwarmUnavailable
    assert http_status_of(swarm_errors.ChunkNotFound(b"\x00" * 32)) == 503
    # every node asked answered that it holds none: the blob is not in the store
    assert http_status_of(swarm_errors.ChunkMissing(b"\x00" * 32)) == 404
    assert http_status_of(swarm_errors.InvalidReference("xyz")) == 400
    assert http_status_of(swarm_errors.BlobTooLarge(10, 5)) == 413
    assert http_status_of(swarm_errors.CorruptChunk(b"\x00" * 32)) == 409
    assert (
        http_status_of(PrivacyBudgetExceeded(requested_epsilon=4, cap_epsilon=3, spent_epsilon=2, delta=1e-5))
        == 409
    )
    assert http_status_of(RuntimeError("a bug")) is None  # becomes a 500 with a reference id
