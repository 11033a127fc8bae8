from django.apps import AppConfig


class LedgerConfig(AppConfig):
    name = "backend.ledger"
    label = "ledger"
    default_auto_field = "django.db.models.BigAutoField"
