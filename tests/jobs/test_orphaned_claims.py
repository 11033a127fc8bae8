"""Claims an in-process agent left open when its database went away are offered again at once.

CI lost one: a fixed model's "register" stayed queued (attempts 0) after a MariaDB restart, and
its 600 s lease outlived the job. After a failed tick the agent now releases every queued or
running claim of its node that its own background thread does not still hold.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from backend.jobs.driver import actions, agent
from backend.jobs.driver.planner import Due
from backend.jobs.models import RoundAction

ME, OTHER = "0x" + "1" * 40, "0x" + "2" * 40
State, Kind = RoundAction.State, RoundAction.Kind


@pytest.mark.django_db
def test_open_claims_not_held_in_process_go_back_to_waiting():
    def claim(node, round_, kind, state):
        return RoundAction.objects.create(node=node, job_id=3, round=round_, kind=kind, state=state)

    lost_offer = claim(ME, 2, Kind.REGISTER, State.QUEUED)
    unrecorded = claim(ME, 2, Kind.SCORE, State.RUNNING)
    held = claim(ME, 2, Kind.MEASURE, State.QUEUED)  # still in this process's background queue
    done = claim(ME, 1, Kind.REGISTER, State.DONE)
    failed = claim(ME, 1, Kind.MEASURE, State.FAILED)
    another_nodes = claim(OTHER, 2, Kind.REGISTER, State.QUEUED)

    ctx = SimpleNamespace(address=ME)
    released = actions.release_orphaned_claims(ctx, {Due(3, 2, Kind.MEASURE)})

    assert released == 2
    states = {c.pk: RoundAction.objects.get(pk=c.pk).state for c in (lost_offer, unrecorded, held)}
    assert states == {lost_offer.pk: State.WAITING, unrecorded.pk: State.WAITING, held.pk: State.QUEUED}
    assert RoundAction.objects.get(pk=done.pk).state == State.DONE
    assert RoundAction.objects.get(pk=failed.pk).state == State.FAILED
    assert RoundAction.objects.get(pk=another_nodes.pk).state == State.QUEUED
    # A released claim is due again at the next tick: offer re-queues a waiting row at once.
    assert actions.offer(SimpleNamespace(address=ME, action_lease_s=600.0), Due(3, 2, Kind.REGISTER))


@pytest.mark.django_db
def test_the_periodic_sweep_leaves_claims_touched_lately():
    fresh = RoundAction.objects.create(node=ME, job_id=4, round=1, kind=Kind.SCORE, state=State.QUEUED)
    stale = RoundAction.objects.create(node=ME, job_id=4, round=1, kind=Kind.TRAIN, state=State.RUNNING)
    RoundAction.objects.filter(pk=stale.pk).update(updated=timezone.now() - timedelta(seconds=120))

    assert actions.release_orphaned_claims(SimpleNamespace(address=ME), set(), older_than_s=60) == 1
    assert RoundAction.objects.get(pk=fresh.pk).state == State.QUEUED
    assert RoundAction.objects.get(pk=stale.pk).state == State.WAITING


def run_agent_until(monkeypatch, tick, recover, done) -> None:
    """agent.run_forever with this ``tick`` and ``recover`` on a thread, until ``done()``."""
    head = {"n": 1}
    ctx = SimpleNamespace(ledger=SimpleNamespace(client=SimpleNamespace(block_number=lambda: head["n"])))
    monkeypatch.setattr(agent, "tick", tick)
    stop = threading.Event()
    thread = threading.Thread(
        target=agent.run_forever,
        args=(ctx, lambda _due: None),
        kwargs={"interval": 0.01, "poll": 0.005, "stop": stop, "recover": recover},
    )
    thread.start()
    try:
        deadline = time.monotonic() + 60  # generous: the loop ends as soon as the ticks are in
        while not done() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(5)


def test_the_agent_recovers_after_a_failed_tick(monkeypatch):
    calls: list[str] = []

    def tick(_ctx, _dispatch, _head=None, _gate=None):
        calls.append("tick")
        if calls.count("tick") == 2:
            raise ConnectionError("the database went away")
        return []

    def recover(after_failure):
        calls.append(f"recover({after_failure})")
        if calls.count(f"recover({after_failure})") == 1:
            raise ConnectionError("still away")  # the failed recovery is tried again next tick

    monkeypatch.setattr(agent, "RECOVER_EVERY_S", 3600.0)  # no periodic sweep here
    run_agent_until(monkeypatch, tick, recover, lambda: calls.count("tick") >= 5)
    # tick, tick (fails), recover (fails), recover, tick, tick, ...: recovery only after a failure.
    assert calls[:5] == ["tick", "tick", "recover(True)", "recover(True)", "tick"]
    assert calls.count("recover(True)") == 2 and "recover(False)" not in calls


def test_the_agent_sweeps_now_and_then_without_a_failure(monkeypatch):
    calls: list[str] = []

    def tick(_ctx, _dispatch, _head=None, _gate=None):
        calls.append("tick")
        return []

    monkeypatch.setattr(agent, "RECOVER_EVERY_S", 0.0)  # a sweep due before every tick
    run_agent_until(
        monkeypatch, tick, lambda failed: calls.append(f"recover({failed})"), lambda: calls.count("tick") >= 3
    )
    assert calls[:4] == ["recover(False)", "tick", "recover(False)", "tick"]
