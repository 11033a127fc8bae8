"""The peer API's body reader: straight from gunicorn's socket, or through the request's stream."""

from __future__ import annotations

import os
import socket
import threading

import pytest
from gunicorn.http.body import Body, LengthReader
from gunicorn.http.unreader import SocketUnreader

from backend.peers.receive import BufferPool, read_body


class FakeRequest:
    def __init__(self, body: Body | None = None, data: bytes = b"") -> None:
        self.META = {"wsgi.input": body} if body is not None else {}
        self._data = data

    def read(self, n: int) -> bytes:
        piece, self._data = self._data[:n], self._data[n:]
        return piece


def _gunicorn_body(sock: socket.socket, length: int, read_ahead: bytes) -> Body:
    """A body as gunicorn hands it over: the header parser has read ``read_ahead`` past the headers."""
    unreader = SocketUnreader(sock)
    unreader.unread(read_ahead)
    return Body(LengthReader(unreader, length))


def test_reads_gunicorn_body_from_buffer_and_socket_and_leaves_the_next_request():
    body_bytes = os.urandom(3 << 20)
    following = b"POST /next HTTP/1.1\r\n"
    ours, theirs = socket.socketpair()
    try:
        # The first 1000 body bytes arrived with the headers; the rest (and a pipelined
        # request) is still in the socket.
        sender = threading.Thread(target=theirs.sendall, args=(body_bytes[1000:] + following,))
        sender.start()
        body = _gunicorn_body(ours, len(body_bytes), body_bytes[:1000])
        with read_body(FakeRequest(body), len(body_bytes)) as got:
            assert got == body_bytes
        sender.join()
        assert body.reader.length == 0 and body.read(10) == b""  # gunicorn sees the body consumed
        assert body.reader.unreader.read(len(following)) == following
    finally:
        ours.close()
        theirs.close()


def test_read_ahead_past_the_body_stays_with_gunicorn():
    ours, theirs = socket.socketpair()
    try:
        body = _gunicorn_body(ours, 5, b"hello" + b"GET / HTTP/1.1\r\n")
        with read_body(FakeRequest(body), 5) as got:
            assert got == b"hello"
        assert body.reader.unreader.read(3) == b"GET"
    finally:
        ours.close()
        theirs.close()


def test_a_body_cut_short_is_refused_and_the_connection_dropped():
    ours, theirs = socket.socketpair()
    try:
        theirs.sendall(b"x" * 100)
        theirs.shutdown(socket.SHUT_WR)
        body = _gunicorn_body(ours, 1000, b"")
        with pytest.raises(ValueError, match="cut short"), read_body(FakeRequest(body), 1000):
            pass
        assert body.failed  # gunicorn closes the connection instead of parsing the rest
    finally:
        ours.close()
        theirs.close()


def test_other_servers_are_read_through_the_request():
    data = os.urandom((1 << 20) + 123)
    with read_body(FakeRequest(data=data), len(data)) as got:
        assert got == data
    with pytest.raises(ValueError), read_body(FakeRequest(data=data[:10]), 11):
        pass


def test_buffers_are_reused_and_sized_by_the_request():
    pool = BufferPool(keep_bytes=4 << 20)
    with pool.buffer(100) as first:
        first[:] = b"a" * 100
        assert len(first) == 100
    with pool.buffer(200) as second:
        assert len(second) == 200 and second[:100] == b"a" * 100  # same buffer, not zeroed
    with pool.buffer(8 << 20) as big:  # larger than the pool keeps: used once, then dropped
        assert len(big) == 8 << 20
    assert sum(len(b) for b in pool._free) <= 4 << 20
