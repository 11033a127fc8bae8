"""The agent's side of a broker restart, against a real unreachable broker (a closed port).

An action the agent cannot send goes back to waiting (its next tick sends it again) instead of
staying queued, with no message anywhere, until its lease expires; after a worker lost its broker
connection, every queued action of its node is sent again, and nothing else is touched.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from backend.celery import app
from backend.jobs import tasks as job_tasks
from backend.jobs.driver.planner import Due
from backend.jobs.models import RoundAction

pytestmark = pytest.mark.django_db
NODE = SimpleNamespace(address="0x" + "cd" * 20)
OTHER = "0x" + "ef" * 20
State, Kind = RoundAction.State, RoundAction.Kind


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: connections are refused


@pytest.fixture
def unreachable_broker(settings, monkeypatch):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    monkeypatch.setattr(job_tasks, "current_node", lambda: NODE)  # whose claims: this node's
    saved = {key: app.conf[key] for key in ("task_always_eager", "broker_url")}
    app.conf.update(task_always_eager=False, broker_url=f"redis://127.0.0.1:{_closed_port()}/0")
    monkeypatch.setattr(app, "_pool", None)  # a connection pool for that broker, made on first use
    try:
        yield
    finally:
        app.conf.update(saved)


def _claim(kind: str, state: str = State.QUEUED, node: str = NODE.address, round_: int = 1) -> RoundAction:
    return RoundAction.objects.create(node=node, job_id=7, round=round_, kind=kind, state=state)


@pytest.mark.timeout(120)
def test_an_action_the_broker_does_not_take_goes_back_to_waiting(unreachable_broker):
    claim = _claim(Kind.SCORE)
    job_tasks.dispatch(Due(7, 1, Kind.SCORE))  # does not raise: the agent's tick goes on
    claim.refresh_from_db()
    assert claim.state == State.WAITING
    assert "broker unreachable" in claim.detail


def test_after_a_lost_broker_connection_only_queued_claims_are_sent_again():
    queued = _claim(Kind.TRAIN)
    running = _claim(Kind.SCORE, State.RUNNING)
    done = _claim(Kind.FINALIZE, State.DONE)
    elsewhere = _claim(Kind.TRAIN, node=OTHER)
    assert job_tasks.requeue_lost_messages(NODE) == 1
    for claim, state in (
        (queued, State.WAITING),
        (running, State.RUNNING),
        (done, State.DONE),
        (elsewhere, State.QUEUED),
    ):
        claim.refresh_from_db()
        assert claim.state == state, (claim.kind, claim.node)


def test_a_claim_that_could_not_begin_goes_back_to_waiting():
    # In-process (no broker): a background action whose database went away before it began
    # stayed queued until its lease (600 s) ended; the MariaDB restart test found a past round's
    # measure left so. Only a claim still queued is put back; one that began records its own end.
    queued = _claim(Kind.MEASURE)
    running = _claim(Kind.REGISTER, State.RUNNING)
    for claim in (queued, running):
        job_tasks.requeue_when_back(NODE, Due(7, 1, claim.kind))
    queued.refresh_from_db()
    running.refresh_from_db()
    assert (queued.state, running.state) == (State.WAITING, State.RUNNING)
    assert "before it began" in queued.detail
