"""The driver's timing parts and the agent's new-block trigger (no chain: stand-ins)."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import pytest

from backend.jobs.driver import agent, timing


def test_nested_parts_count_once(monkeypatch):
    # A clock the test advances, so a loaded machine cannot change what is measured.
    now = [100.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    with timing.collect() as parts:
        with timing.part("prepare"):
            now[0] += 2.0
            with timing.part("swarm"):
                now[0] += 3.0
            now[0] += 0.5
    assert parts == {"prepare": 2.5, "swarm": 3.0}  # prepare's own time, without the nested swarm part


def test_parts_outside_a_collector_only_run_the_block():
    ran = []
    with timing.part("swarm"):
        ran.append(1)
    assert ran == [1]


def test_agent_ticks_on_a_new_block_without_waiting_for_the_interval(monkeypatch):
    # Driven by what the agent does, not by the clock: each tick is put on a queue, each look at
    # the head counted, and the test waits for those (the timeouts only bound a hung agent).
    head = {"n": 1}
    polls = {"n": 0}
    polled = threading.Condition()

    def block_number() -> int:
        with polled:
            polls["n"] += 1
            polled.notify_all()
        return head["n"]

    def polls_after(count: int) -> bool:
        with polled:
            return polled.wait_for(lambda: polls["n"] >= count, timeout=60)

    ticks: queue.Queue[int] = queue.Queue()
    ctx = SimpleNamespace(ledger=SimpleNamespace(client=SimpleNamespace(block_number=block_number)))
    monkeypatch.setattr(
        agent, "tick", lambda _ctx, _dispatch, _head=None, _gate=None: ticks.put(head["n"]) or []
    )
    stop = threading.Event()
    thread = threading.Thread(
        target=agent.run_forever,
        args=(ctx, lambda _due: None),
        kwargs={"interval": 60, "poll": 0.01, "stop": stop},
    )
    thread.start()
    try:
        assert ticks.get(timeout=60) == 1  # the first tick; the interval (60 s) is far off
        head["n"] = 2
        assert ticks.get(timeout=60) == 2  # the new block triggered a tick
        with polled:
            seen = polls["n"]
        assert polls_after(seen + 5)  # the agent looked at the unchanged head five more times...
        assert ticks.empty()  # ...and did not tick
    finally:
        stop.set()
        thread.join(5)


def test_training_runs_on_a_lower_priority_thread_and_the_caller_keeps_its_own():
    import os
    import sys

    import pytest

    from backend.jobs.driver import trainer

    if not sys.platform.startswith("linux"):
        pytest.skip("niceness per thread is Linux's")

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    mine = niceness()
    ctx = SimpleNamespace(train_nice=7)
    assert trainer.training_thread(ctx).submit(niceness).result() == min(mine + 7, 19)
    assert niceness() == mine  # only the training thread yields


@pytest.mark.django_db
def test_ticks_plan_only_for_the_jobs_contract_or_after_the_interval(monkeypatch):
    from backend.ledger.models import ChainEvent

    clock = {"t": 100.0}
    monkeypatch.setattr(agent.time, "monotonic", lambda: clock["t"])
    serial = iter(range(1, 100))

    def event(contract: str, name: str = "UpdateSubmitted") -> None:
        n = next(serial)
        ChainEvent.objects.create(
            contract=contract,
            address="0x" + "1" * 40,
            name=name,
            block_number=n,
            tx_hash=f"0x{n:064x}",
            log_index=0,
            args={},
        )

    gate = agent.PlanGate(interval=0.5)
    assert gate.should_plan()  # the first tick plans
    event("DataRegistry", "PrivacySpent")  # a trainer's spendPrivacy: nothing a planner reads
    clock["t"] += 0.1
    assert not gate.should_plan()
    event("FederatedLearning")  # an update, a score, a finalized round...
    clock["t"] += 0.1
    assert gate.should_plan()
    assert not gate.lifecycle  # no job to discover or prepare: a round moved
    assert not gate.should_plan()  # nothing new since
    event("FederatedLearning", "ParticipantJoined")
    assert gate.should_plan() and gate.lifecycle
    clock["t"] += 0.5
    assert gate.should_plan()  # deadlines pass without blocks: plan every interval
    assert gate.lifecycle  # and look for jobs to discover or prepare (a retry may be due)
