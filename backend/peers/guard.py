"""``peer_signed``: the guard every node-to-node route sits behind.

Length, signature, freshness, receiver, membership, replay and rate are decided from the
headers, so a stranger, a replay or an oversized request is refused before one byte of its body
is read, and its connection is closed rather than drained. The body is then read with a deadline
(a slow sender holds a thread for seconds, not forever) and compared with the signed hash.

What the checks need comes from the app serving the route, as a ``PeerAuth`` built per request
(``backend.swarm.factory.peer_auth``), so this package reads no settings and keeps no state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from backend.peers.errors import SignatureError, UnregisteredSigner
from backend.peers.receive import SlowBody, abandon_body, read_body
from backend.peers.signing import NonceCache, check_body, remember_nonce, verify_headers

PeerView = Callable[[HttpRequest, memoryview], HttpResponse]


class Usage(Protocol):
    requests: int
    bytes: int


@dataclass(frozen=True)
class PeerAuth:
    """What the checks of one peer request need: this node, who its peers are, the limits."""

    receiver: str  # this node's chain address: every request to it must be signed for it
    is_registered: Callable[[str], bool]
    nonces: NonceCache
    max_skew_s: float
    body_timeout_s: float
    max_body: int  # a route's default body bound (``peer_signed(max_body=...)`` overrides it)
    requests_per_min: int
    bytes_per_min: int
    # A peer's requests and bytes within the last ``rate_window_s`` (None: no rate limit).
    usage: Callable[[str, float], Usage] | None = None
    rate_window_s: float = 60.0


class _Refused(Exception):
    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.headers = headers or {}


def _body_length(request: HttpRequest, limit: int) -> int:
    if request.META.get("HTTP_TRANSFER_ENCODING"):
        raise _Refused(411, "peer requests need a Content-Length")
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise _Refused(400, "bad Content-Length") from None
    if length < 0:
        raise _Refused(400, "bad Content-Length")
    if length > limit:
        raise _Refused(413, f"request body too large (at most {limit} bytes)")
    return length


def _check_rate(auth: PeerAuth, signer: str) -> None:
    """429 once a peer exceeds its requests or pushed bytes per minute (counted across processes)."""
    if auth.usage is None:
        return
    used = auth.usage(signer, auth.rate_window_s)
    if used.requests > auth.requests_per_min:
        raise _Refused(429, "too many requests from this peer; retry later", {"Retry-After": "60"})
    if used.bytes > auth.bytes_per_min:
        raise _Refused(429, "this peer sent too many bytes; retry later", {"Retry-After": "60"})


def peer_signed(
    view: PeerView,
    auth: Callable[[], PeerAuth],
    digest: Callable[[memoryview], str] | None = None,
    *,
    max_body: int | None = None,
) -> Callable[[HttpRequest], HttpResponse]:
    """Wrap a peer view: every check that needs no body first, then the body, then the view.

    ``auth`` is called once per request; ``digest`` is the body's signed hash when it is not the
    plain SHA-256 (a batch of chunks); ``max_body`` bounds this route's body.
    """

    @csrf_exempt
    @require_POST
    def wrapper(request: HttpRequest) -> HttpResponse:
        body_read = False
        try:
            checks = auth()
            length = _body_length(request, max_body or checks.max_body)
            verified = verify_headers(
                method=request.method or "POST",
                path=request.get_full_path(),
                headers=request.headers,
                length=length,
                receiver=checks.receiver,
                is_registered=checks.is_registered,
                max_skew_s=checks.max_skew_s,
            )
            remember_nonce(verified, checks.nonces, checks.max_skew_s, length)
            _check_rate(checks, verified.signer)
            # Not request.body: the body may exceed DATA_UPLOAD_MAX_MEMORY_SIZE, and
            # read_body skips the server's copies (receive.py). The view's response must
            # not refer to the body: its buffer is reused once the block ends.
            with read_body(request, length, timeout_s=checks.body_timeout_s) as body:
                body_read = True
                check_body(verified, body, digest(body) if digest else None)
                return view(request, body)
        except _Refused as exc:
            response = JsonResponse({"detail": str(exc)}, status=exc.status)
            for name, value in exc.headers.items():
                response[name] = value
        except SlowBody as exc:
            response = JsonResponse({"detail": str(exc)}, status=408)
        except ValueError as exc:  # a body cut short, a malformed batch or address list
            response = JsonResponse({"detail": str(exc)}, status=400)
        except UnregisteredSigner as exc:
            response = JsonResponse({"detail": str(exc)}, status=exc.http_status)
        except SignatureError as exc:
            response = JsonResponse({"detail": str(exc)}, status=exc.http_status)
        if not body_read:
            abandon_body(request)
        return response

    return wrapper
