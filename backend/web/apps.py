from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "backend.web"
    label = "web"
    verbose_name = "Dashboard (the built Vue app)"
