"""/api/cluster and the per-job task routes (no trailing slashes, as in docs/API.md)."""

from django.urls import path, register_converter

from backend.cluster.views import ClusterView, JobPriorityView, JobTasksView, TaskCancelView


class BoundedId:
    """A database id or on-chain job id: at most 18 digits, so it always fits a signed 64-bit column."""

    regex = r"[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)


register_converter(BoundedId, "id18")

urlpatterns = [
    path("cluster", ClusterView.as_view(), name="cluster"),
    path("jobs/<id18:job_id>/tasks", JobTasksView.as_view(), name="job-tasks"),
    path("jobs/<id18:job_id>/tasks/priority", JobPriorityView.as_view(), name="job-tasks-priority"),
    path("jobs/<id18:job_id>/tasks/<id18:task_id>/cancel", TaskCancelView.as_view(), name="job-task-cancel"),
]
