"""Users' roles on this node. Peers and chain state live in the ledger's mirror tables."""

from django.conf import settings
from django.db import models

from backend.identity.roles import Role


class Profile(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    def __str__(self) -> str:
        return f"{self.user.get_username()} ({self.role})"
