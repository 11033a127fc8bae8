from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "backend.serving"
    label = "serving"
    default_auto_field = "django.db.models.BigAutoField"
