"""Which peer endpoints a node dials: http(s) only, and public addresses unless told otherwise.

A member registers its endpoint on chain; a hostile one may point it at an address
inside the receiving node's network (its database, a cloud metadata service, an admin
port), and every node would send it signed requests. So an endpoint must be an http(s)
URL with a host and no credentials, and unless the node's configuration allows private
peers (``DEFL_ALLOW_PRIVATE_PEERS``: the local federation, tests on loopback) every
address its host resolves to must be global: loopback, private, link-local, shared,
multicast and reserved ranges are refused. Literal addresses are checked when the
registry is read (``check_url``); host names when a request is about to be sent
(``EndpointGuard``, re-resolving at most every ``ttl_s``), so a name that later
resolves inward is refused then. Redirects are never followed (client.py).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from urllib.parse import urlsplit


class EndpointRefused(ValueError):
    """An endpoint this node will not dial."""


def check_url(url: str, *, allow_private: bool) -> None:
    """Refuse an endpoint by its text alone: scheme, host, credentials, and a literal address."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise EndpointRefused(f"endpoint is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise EndpointRefused("endpoint must be an http or https URL")
    if not parts.hostname:
        raise EndpointRefused("endpoint has no host")
    if parts.username or parts.password:
        raise EndpointRefused("endpoint must not carry credentials")
    if port == 0:
        raise EndpointRefused("endpoint has port 0")
    literal = _literal(parts.hostname)
    if literal is not None and not allow_private:
        check_ip(literal)


def check_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not ip.is_global or ip.is_multicast:
        raise EndpointRefused("endpoint is a loopback, private or link-local address")


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


class EndpointGuard:
    """Checks, before each request, the addresses an endpoint's host resolves to (cached)."""

    def __init__(self, url: str, *, allow_private: bool, ttl_s: float = 60.0) -> None:
        check_url(url, allow_private=allow_private)
        parts = urlsplit(url)
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.allow_private = allow_private
        self.ttl_s = ttl_s
        self._checked_until = 0.0
        self._lock = threading.Lock()

    def check(self) -> None:
        if self.allow_private or _literal(self.host) is not None:
            return  # a literal address was checked with the URL
        now = time.monotonic()
        if now < self._checked_until:
            return
        with self._lock:
            try:
                infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise EndpointRefused(f"endpoint host does not resolve: {exc}") from None
            for info in infos:
                check_ip(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
            self._checked_until = now + self.ttl_s
