"""``GET /metrics`` (Prometheus text format), ``GET /api/health/live`` and ``GET /api/health/ready``.

/metrics answers a scraper that presents ``Authorization: Bearer <DEFL_METRICS_TOKEN>`` (when that
token is set), or one whose address is in ``DEFL_METRICS_ALLOWED_NETS`` (loopback by default);
anyone else gets 403. The figures come from the node's database, mirror and chunk index at scrape
time (``collectors``), the counters of all the node's processes (``counters``, multiprocess
mode), and this web process's own CPU, memory and file descriptors.
"""

from __future__ import annotations

import hmac
import ipaddress
import os

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)

from backend.monitoring import health
from backend.monitoring.collectors import NodeStateCollector


def _allowed(request: HttpRequest) -> bool:
    token = settings.DEFL_METRICS_TOKEN
    if token:
        presented = request.headers.get("Authorization", "")
        if hmac.compare_digest(presented.encode(), f"Bearer {token}".encode()):
            return True
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(
        client in ipaddress.ip_network(net, strict=False) for net in settings.DEFL_METRICS_ALLOWED_NETS
    )


def _registry() -> CollectorRegistry:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = REGISTRY  # one process: its own counters, process and platform metrics
    else:
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        ProcessCollector(registry=registry)  # this web process
    scrape = CollectorRegistry()
    scrape.register(NodeStateCollector())
    return _Both(registry, scrape)


class _Both(CollectorRegistry):
    """Two registries read as one (the node's state is collected anew on every scrape)."""

    def __init__(self, *parts: CollectorRegistry) -> None:
        super().__init__(auto_describe=False)
        self.parts = parts

    def collect(self):
        for part in self.parts:
            yield from part.collect()


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        return HttpResponse(
            "metrics need the Bearer token DEFL_METRICS_TOKEN, or a client address in DEFL_METRICS_ALLOWED_NETS\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)


@require_GET
def live(_request: HttpRequest) -> JsonResponse:
    return JsonResponse(health.liveness())


@require_GET
def ready(_request: HttpRequest) -> JsonResponse:
    ok, body = health.readiness()
    return JsonResponse(body, status=200 if ok else 503)
