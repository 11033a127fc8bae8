from django.apps import AppConfig


class SwarmConfig(AppConfig):
    name = "backend.swarm"
    label = "swarm"
    default_auto_field = "django.db.models.BigAutoField"
