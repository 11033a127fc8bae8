"""The nonce cache and per-peer usage shared by all of a node's processes (``models.PeerRequest``).

``DatabaseNonceCache.add`` inserts the request's row; the unique key turns a replay into
an integrity error, answered ``False``. Expired rows are deleted by whichever process
next finds a sweep due (at most one sweep per ``sweep_s`` per process).
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

from django.db import IntegrityError, transaction
from django.db.models import Count, Sum

from backend.swarm.models import PeerRequest


class Usage(NamedTuple):
    requests: int
    bytes: int


# The window of the per-peer rate limits: rows are kept at least this long to count them.
RATE_WINDOW_S = 60.0


class DatabaseNonceCache:
    def __init__(self, *, sweep_s: float = 30.0) -> None:
        self.sweep_s = sweep_s
        self._next_sweep = 0.0
        self._lock = threading.Lock()

    def add(self, key: str, ttl_s: float, *, signer: str = "", size: int = 0) -> bool:
        now = time.time()
        ttl_s = max(ttl_s, RATE_WINDOW_S)
        self._sweep(now)
        try:
            with transaction.atomic():
                PeerRequest.objects.create(
                    key=key[:128], signer=signer[:42], size=size, received_at=now, expires_at=now + ttl_s
                )
        except IntegrityError:
            # Unique key taken: a replay, unless the row has expired but not been swept yet.
            with transaction.atomic():
                renewed = PeerRequest.objects.filter(key=key[:128], expires_at__lt=now).update(
                    signer=signer[:42], size=size, received_at=now, expires_at=now + ttl_s
                )
            return renewed == 1
        return True

    def usage(self, signer: str, window_s: float) -> Usage:
        """Requests and body bytes of ``signer`` over the last ``window_s`` seconds (this one included)."""
        rows = PeerRequest.objects.filter(signer=signer, received_at__gte=time.time() - window_s)
        totals = rows.aggregate(requests=Count("id"), bytes=Sum("size"))
        return Usage(totals["requests"] or 0, totals["bytes"] or 0)

    def _sweep(self, now: float) -> None:
        with self._lock:
            if now < self._next_sweep:
                return
            self._next_sweep = now + self.sweep_s
        PeerRequest.objects.filter(expires_at__lt=now).delete()
