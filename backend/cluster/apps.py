from django.apps import AppConfig


class ClusterConfig(AppConfig):
    name = "backend.cluster"
    label = "cluster"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from backend.cluster import signals  # noqa: F401 - connects the Celery worker hooks
