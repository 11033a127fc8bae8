"""backend.peers.guard.peer_signed over real requests, signatures and a real nonce cache.

The guard is what every node-to-node route sits behind (the swarm's chunk routes, the jobs' key
route): each refusal below is decided from the headers, before the view runs or the body is read.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest
from django.http import HttpResponse
from django.test import RequestFactory
from eth_account import Account

from backend.peers.guard import PeerAuth, peer_signed
from backend.peers.signing import MemoryNonceCache, RequestSigner

MEMBER = Account.create()
STRANGER = Account.create()
RECEIVER = Account.create().address
PATH = "/peer/test"
MAX_BODY = 64


class Used(NamedTuple):
    requests: int
    bytes: int


class Route:
    """A guarded view that records the bodies it was given, and the usage the guard asked about."""

    def __init__(
        self, *, requests_per_min: int = 100, bytes_per_min: int = 10_000, max_body: int | None = None
    ):
        self.bodies: list[bytes] = []
        self.counted: dict[str, Used] = {}
        self.nonces = MemoryNonceCache()
        self.requests_per_min = requests_per_min
        self.bytes_per_min = bytes_per_min
        self.view = peer_signed(self._view, self._auth, max_body=max_body)

    def _view(self, request, body: memoryview) -> HttpResponse:
        self.bodies.append(bytes(body))
        return HttpResponse(b"ok")

    def _usage(self, signer: str, window_s: float) -> Used:
        assert window_s == 60.0
        return self.counted.get(signer, Used(0, 0))

    def _auth(self) -> PeerAuth:
        return PeerAuth(
            receiver=RECEIVER,
            is_registered=lambda address: address == MEMBER.address,
            nonces=self.nonces,
            max_skew_s=30.0,
            body_timeout_s=5.0,
            max_body=MAX_BODY,
            requests_per_min=self.requests_per_min,
            bytes_per_min=self.bytes_per_min,
            usage=self._usage,
        )


def _request(
    body: bytes, *, account=MEMBER, receiver: str = RECEIVER, signed_body: bytes | None = None, **extra
):
    headers = RequestSigner(bytes(account.key)).headers("POST", PATH, signed_body or body, receiver=receiver)
    return RequestFactory().post(
        PATH, data=body, content_type="application/octet-stream", headers=headers, **extra
    )


def _detail(response) -> str:
    return json.loads(response.content)["detail"]


def test_a_signed_request_of_a_member_reaches_the_view_with_its_body():
    route = Route()
    response = route.view(_request(b"hello"))
    assert response.status_code == 200 and route.bodies == [b"hello"]


@pytest.mark.parametrize(
    ("make", "status", "detail"),
    [
        (
            lambda: RequestFactory().post(PATH, data=b"x", content_type="application/octet-stream"),
            401,
            "unsigned",
        ),
        (lambda: _request(b"x", account=STRANGER), 403, "not a registered node"),
        (lambda: _request(b"x", receiver=STRANGER.address), 401, "another node"),
        (lambda: _request(b"tampered", signed_body=b"original"), 401, "does not match"),
        (lambda: _request(b"x" * (MAX_BODY + 1)), 413, f"at most {MAX_BODY} bytes"),  # the worst length
        (lambda: _request(b"x", HTTP_TRANSFER_ENCODING="chunked"), 411, "Content-Length"),
        (lambda: _request(b"x", CONTENT_LENGTH="-1"), 400, "Content-Length"),
    ],
)
def test_a_request_is_refused_before_the_view(make, status, detail):
    route = Route()
    response = route.view(make())
    assert response.status_code == status and detail in _detail(response), response.content
    assert route.bodies == []


def test_a_body_at_the_bound_is_accepted_and_a_route_bound_overrides_the_default():
    route = Route()
    assert route.view(_request(b"x" * MAX_BODY)).status_code == 200
    tight = Route(max_body=4)
    assert tight.view(_request(b"12345")).status_code == 413
    assert tight.view(_request(b"1234")).status_code == 200


def test_a_replayed_request_is_refused():
    route = Route()
    request = _request(b"once")
    replay = RequestFactory().post(
        PATH,
        data=b"once",
        content_type="application/octet-stream",
        headers={
            k.removeprefix("HTTP_").replace("_", "-"): v
            for k, v in request.META.items()
            if k.startswith("HTTP_X")
        },
    )
    assert route.view(request).status_code == 200
    refused = route.view(replay)
    assert refused.status_code == 401 and "replayed" in _detail(refused)
    assert route.bodies == [b"once"]


def test_a_peer_over_its_rate_or_bytes_gets_429():
    route = Route(requests_per_min=3, bytes_per_min=100)
    route.counted[MEMBER.address] = Used(4, 0)
    refused = route.view(_request(b"x"))
    assert refused.status_code == 429 and refused["Retry-After"] == "60"
    route.counted[MEMBER.address] = Used(1, 101)
    assert "too many bytes" in _detail(route.view(_request(b"x")))
    route.counted[MEMBER.address] = Used(3, 100)  # at both limits: still served
    assert route.view(_request(b"x")).status_code == 200
