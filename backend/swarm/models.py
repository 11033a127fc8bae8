"""The peer API's request log: nonces seen (replay protection) and each peer's recent usage.

One row per accepted peer request, kept for twice the clock-skew window. It lives in the
node's database, so every process of the node (gunicorn workers, agent, celery) sees the
same nonces: a request replayed to another process of the same node is refused, which a
per-process cache cannot do. The same rows give each peer's requests and bytes over the
last minute (the rate limits), so a peer request costs one insert and one indexed count.
"""

from __future__ import annotations

from django.db import models


class PeerRequest(models.Model):
    key = models.CharField(max_length=128, unique=True, help_text="signer:nonce")
    signer = models.CharField(max_length=42)
    size = models.PositiveBigIntegerField(default=0, help_text="bytes of the request's body")
    received_at = models.FloatField(help_text="unix time the request arrived")
    expires_at = models.FloatField(db_index=True, help_text="unix time after which the nonce is forgotten")

    class Meta:
        indexes = [models.Index(fields=["signer", "received_at"], name="swarm_peerreq_signer_time")]

    def __str__(self) -> str:
        return self.key
