from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "backend.jobs"
    label = "jobs"
    default_auto_field = "django.db.models.BigAutoField"
