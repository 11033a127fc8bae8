"""The cluster API: the cluster view, a job's tasks, cancel and priority, role checks, bad input."""

from __future__ import annotations

import pytest

from backend.cluster import registry, runner
from backend.cluster.models import Task

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(settings):
    """Two workers: local@host (2 cores) and w2@remote (4 cores, silent for long: offline)."""
    from datetime import timedelta

    from django.utils import timezone

    from backend.cluster.models import Worker

    settings.DEFL_CLUSTER_CPU_CORES = 2
    local = registry.ensure_local()
    settings.DEFL_CLUSTER_CPU_CORES = 4
    remote = registry.register("w2@remote", queue="w2@remote")
    Worker.objects.filter(pk=remote.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=10))
    return local, remote


def test_cluster_view_needs_a_role(make_client):
    from backend.identity.roles import Role

    assert make_client(None).get("/api/cluster").status_code == 401
    assert make_client(Role.PROVIDER).get("/api/cluster").status_code == 200


def test_cluster_view_lists_workers_slots_load_and_tasks(viewer, operator, cluster, settings):
    local, _ = cluster
    settings.DEFL_CLUSTER_RETRY_BASE_S = 0.01
    runner.run(5, 1, lambda: None)  # succeeded: in no list

    def broken():
        raise OSError("disk full")

    with pytest.raises(OSError):
        runner.run(5, 2, broken)  # failed once, queued for its retry
    queued = runner.enqueue(6, 1)
    body = viewer.get("/api/cluster").json()
    workers = {w["name"]: w for w in body["workers"]}
    assert workers[local.name]["live"] is True and workers["w2@remote"]["live"] is False
    slot = workers[local.name]["slots"][0]
    assert (slot["device"], slot["capacity"], slot["used"], slot["load"]) == ("cpu", 2, 0, 0.0)
    assert body["totals"]["live_workers"] == 1 and body["totals"]["cpu_cores"] == 2
    assert body["totals"]["queued"] == 2 and body["running"] == []
    assert [(t["job_id"], t["round"], t["queue_position"]) for t in body["queued"]] == [(5, 2, 1), (6, 1, 2)]
    assert "log" not in body["queued"][0]
    # A viewer reads what kind of error it was; the operator reads the error itself.
    failure = body["recent_failures"][0]
    summary = "OSError (the node's operator sees the details)"
    assert (failure["job_id"], failure["round"], failure["error"]) == (5, 2, summary)
    raw = operator.get("/api/cluster").json()["recent_failures"][0]
    assert raw["error"] == "OSError: disk full"
    assert queued.pk in [t["id"] for t in body["queued"]]


def test_job_tasks_with_positions_timings_and_logs(viewer, operator, cluster):
    runner.run(8, 1, lambda: 1)
    runner.enqueue(8, 2)
    assert all(
        task["log"] == "" for task in viewer.get("/api/jobs/8/tasks").json()["tasks"]
    )  # operators only
    body = operator.get("/api/jobs/8/tasks").json()
    assert body["job_id"] == 8 and body["priority"] == 0
    newest, first = body["tasks"]
    assert (newest["round"], newest["state"], newest["queue_position"]) == (2, "queued", 1)
    assert (first["round"], first["state"], first["queue_position"]) == (1, "succeeded", None)
    assert first["attempts"] == 1 and first["duration_s"] >= 0 and "succeeded in" in first["log"]
    assert first["worker"] == registry.local_name() and first["device"] == "cpu"


def test_unknown_job_and_task_are_404(viewer, operator):
    assert viewer.get("/api/jobs/999/tasks").status_code == 404
    assert operator.post("/api/jobs/999/tasks/1/cancel").status_code == 404
    runner.enqueue(9, 1)
    other = runner.enqueue(10, 1)
    # A task id of another job is not this job's task.
    assert operator.post(f"/api/jobs/9/tasks/{other.pk}/cancel").status_code == 404
    # Ids past 18 digits never reach the database.
    assert viewer.get("/api/jobs/" + "9" * 40 + "/tasks").status_code == 404


def test_cancel_is_for_operators_and_only_once(viewer, operator):
    task = runner.enqueue(9, 1)
    assert viewer.post(f"/api/jobs/9/tasks/{task.pk}/cancel").status_code == 403
    response = operator.post(f"/api/jobs/9/tasks/{task.pk}/cancel")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "cancelled"
    again = operator.post(f"/api/jobs/9/tasks/{task.pk}/cancel")
    assert again.status_code == 409 and "cancelled" in again.json()["detail"]
    assert Task.objects.get(pk=task.pk).state == Task.State.CANCELLED


def test_priority_is_for_operators_and_bounded(viewer, operator):
    low, high = runner.enqueue(30, 1), runner.enqueue(31, 1)
    assert viewer.post("/api/jobs/31/tasks/priority", {"priority": 5}, format="json").status_code == 403
    for bad in ({"priority": 101}, {"priority": -101}, {"priority": "high"}, {}):
        assert operator.post("/api/jobs/31/tasks/priority", bad, format="json").status_code == 400
    response = operator.post("/api/jobs/31/tasks/priority", {"priority": 5}, format="json")
    assert response.json() == {"job_id": 31, "priority": 5, "updated_tasks": 1}
    tasks = viewer.get("/api/jobs/31/tasks").json()
    assert tasks["priority"] == 5 and tasks["tasks"][0]["queue_position"] == 1
    assert viewer.get("/api/jobs/30/tasks").json()["tasks"][0]["queue_position"] == 2
    assert low.pk != high.pk
