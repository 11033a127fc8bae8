"""Counts every HTTP request the node answers and times it (``defl_http_request*``)."""

from __future__ import annotations

import time

from backend.telemetry.counters import REQUEST_SECONDS, REQUESTS


class RequestMetricsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        clock = time.perf_counter()
        response = self.get_response(request)
        method = request.method if request.method in _METHODS else "other"  # bounded label values
        REQUEST_SECONDS.labels(method=method).observe(time.perf_counter() - clock)
        REQUESTS.labels(method=method, status=f"{response.status_code // 100}xx").inc()
        return response


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
