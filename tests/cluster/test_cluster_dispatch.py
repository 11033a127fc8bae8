"""The agent's dispatch of a round's training: a cluster task, routed to the worker it was placed
on; a cancelled or exhausted task ends the round's training action before anything is computed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backend.cluster import registry, runner
from backend.cluster.models import Task
from backend.jobs import tasks as job_tasks
from backend.jobs.driver.planner import Due
from backend.jobs.models import RoundAction

pytestmark = pytest.mark.django_db
NODE = SimpleNamespace(address="0x" + "ab" * 20)
TRAIN = RoundAction.Kind.TRAIN


def _action(job_id: int, round_: int) -> RoundAction:
    return RoundAction.objects.create(node=NODE.address, job_id=job_id, round=round_, kind=TRAIN)


@pytest.mark.parametrize("ending", ["cancel", "give up"])
def test_a_closed_task_ends_the_training_action_unrun(ending, settings, monkeypatch):
    settings.DEFL_CLUSTER_MAX_ATTEMPTS = 1
    action = _action(3, 2)
    task = runner.enqueue(3, 2, node=NODE.address)
    if ending == "cancel":
        runner.cancel(task)
    else:
        with pytest.raises(ZeroDivisionError):
            runner.run(3, 2, lambda: 1 / 0, node=NODE.address)
    sent = []
    monkeypatch.setattr(job_tasks.run_action, "delay", lambda *a: sent.append(a))
    job_tasks._dispatch_training(NODE, Due(3, 2, TRAIN))
    assert sent == []  # nothing reserved or computed
    action.refresh_from_db()
    assert action.state == RoundAction.State.DONE
    assert f"task {task.pk}" in action.detail
    assert ("cancelled by the operator" if ending == "cancel" else "ZeroDivisionError") in action.detail


def test_another_nodes_task_does_not_close_this_nodes_training(monkeypatch):
    runner.cancel(runner.enqueue(3, 2, node="0x" + "cd" * 20))
    action = _action(3, 2)
    sent = []
    monkeypatch.setattr(job_tasks.run_action, "delay", lambda *a: sent.append(a))
    job_tasks._dispatch_training(NODE, Due(3, 2, TRAIN))
    assert sent == [(3, 2, TRAIN)]
    action.refresh_from_db()
    assert action.state == RoundAction.State.QUEUED
    assert Task.objects.get(node=NODE.address, job_id=3, round=2).state == Task.State.QUEUED


def test_with_a_broker_training_goes_to_the_queue_of_the_worker_it_was_placed_on(settings, monkeypatch):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.DEFL_CLUSTER_CPU_CORES = 1
    registry.register("w1@a", queue="w1@a")
    settings.DEFL_CLUSTER_CPU_CORES = 3
    registry.register("w2@b", queue="w2@b")
    sent = []
    monkeypatch.setattr(
        job_tasks.run_action, "apply_async", lambda args, queue: sent.append((args, queue.name))
    )
    for round_ in (1, 2):
        job_tasks._dispatch_training(NODE, Due(4, round_, TRAIN))
    # w2 first (3 free cores), then w1 (all of its 1 free beats w2's 2 of 3).
    assert sent == [((4, 1, TRAIN), "w2@b.dq2"), ((4, 2, TRAIN), "w1@a.dq2")]
    first = Task.objects.get(job_id=4, round=1)
    assert (first.worker.name, first.amount) == ("w2@b", 1)  # its core held while it is in flight
    assert "placed on w2@b cpu" in first.log


def test_a_starting_worker_keeps_the_running_actions_of_other_live_workers(settings, monkeypatch):
    monkeypatch.setattr(job_tasks, "current_node", lambda: NODE)
    running = _action(5, 1)
    RoundAction.objects.filter(pk=running.pk).update(state=RoundAction.State.RUNNING)
    registry.register("w1@a", queue="w1@a")  # busy with job 5's training
    registry.register("w2@b", queue="w2@b")
    job_tasks._release_lost_claims(sender=SimpleNamespace(hostname="w2@b"))
    running.refresh_from_db()
    assert running.state == RoundAction.State.RUNNING
    # The node's only worker restarting: what it ran is lost and released at once.
    registry.stopped("w1@a")
    job_tasks._release_lost_claims(sender=SimpleNamespace(hostname="w2@b"))
    running.refresh_from_db()
    assert running.state == RoundAction.State.WAITING
