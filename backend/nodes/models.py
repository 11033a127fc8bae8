"""Users' roles on this node. Peers and chain state live in the ledger's mirror tables."""

from django.conf import settings
from django.db import models

from backend.identity.roles import Role


class Profile(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    def __str__(self) -> str:
        return f"{self.user.get_username()} ({self.role})"


class ApiToken(models.Model):
    """One credential of one user: a login on one device, or a named token a script uses.

    Every login gets a token of its own, so logging out on one device ends that login only;
    scripts get named tokens that an operator lists and revokes. Only the key's SHA-256 is
    stored: a copy of the database yields no usable key.
    """

    class Kind(models.TextChoices):
        LOGIN = "login", "a login on one device"
        SCRIPT = "script", "a named token for a script or another service"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8, help_text="the key's first characters, to tell tokens apart")
    created = models.DateTimeField()
    expires = models.DateTimeField()
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created", "-id")

    def __str__(self) -> str:
        return f"{self.user.get_username()}: {self.name} ({self.kind})"
