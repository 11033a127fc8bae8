"""Reading a peer request's body into one buffer, without the WSGI server's copies.

A batch of chunks is several MB and every byte of an upload arrives at R nodes, so the
receiving side's cost per byte decides how fast a replicated upload goes. gunicorn's
body reader recv()s into fresh ``bytes`` and passes them through two ``BytesIO``
buffers: five or six copies of each byte, each into freshly mapped pages, which cost
the receiving node more CPU than hashing and writing the chunks. Under gunicorn's
workers the request's socket is at hand, so this module takes what gunicorn has
already buffered, ``recv_into()``s the rest straight into the buffer, and tells
gunicorn's reader that the body has been consumed (keep-alive then finds the next
request where it expects it). Any other server (Django's test client, runserver) is
read through the request's stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.http import HttpRequest

_PIECE = 1 << 20

try:  # gunicorn is the production server; tests also run the views without it
    from gunicorn.http.body import Body as _GunicornBody
    from gunicorn.http.body import LengthReader as _GunicornLengthReader
    from gunicorn.http.unreader import SocketUnreader as _GunicornSocketUnreader
except ImportError:  # pragma: no cover - gunicorn is in requirements.txt
    _GunicornBody = _GunicornLengthReader = _GunicornSocketUnreader = None


class BufferPool:
    """Reusable body buffers: a fresh multi-MB buffer is zeroed under the GIL and then
    faulted in page by page, for every request; a reused one costs neither.

    Buffers are sized in whole MiB so batches of slightly different sizes share them;
    at most ``keep_bytes`` are kept between requests.
    """

    def __init__(self, keep_bytes: int = 48 << 20) -> None:
        self.keep_bytes = keep_bytes
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    @contextmanager
    def buffer(self, size: int) -> Iterator[memoryview]:
        """A view of exactly ``size`` bytes of a pooled buffer, returned to the pool on exit.

        Nothing may keep a reference into the view past the ``with`` block.
        """
        buf = self._take(size)
        view = memoryview(buf)
        try:
            with view[:size] as exact:
                yield exact
        finally:
            view.release()
            self._give(buf)

    def _take(self, size: int) -> bytearray:
        with self._lock:
            fits = [b for b in self._free if len(b) >= size]
            if fits:
                buf = min(fits, key=len)
                self._free.remove(buf)
                return buf
        return bytearray(-(-size // _PIECE) * _PIECE)

    def _give(self, buf: bytearray) -> None:
        with self._lock:
            if sum(len(b) for b in self._free) + len(buf) <= self.keep_bytes:
                self._free.append(buf)


_POOL = BufferPool()
# A peer body may take ``timeout_s`` plus one second per MB: a slow sender (slow-loris)
# holds one of the server's threads for that long at most.
_MIN_RATE_BYTES_PER_S = 1_000_000


class SlowBody(ValueError):
    """The body did not arrive in time; the connection is closed."""


def body_deadline(length: int, timeout_s: float) -> float:
    return time.monotonic() + timeout_s + length / _MIN_RATE_BYTES_PER_S


@contextmanager
def read_body(request: HttpRequest, length: int, *, timeout_s: float | None = None) -> Iterator[memoryview]:
    """The request's body of ``length`` bytes (its Content-Length), valid inside the ``with``.

    ``ValueError`` if the body is cut short, ``SlowBody`` if it takes longer than
    ``timeout_s`` plus a second per MB (under gunicorn, whose socket is at hand).
    """
    deadline = body_deadline(length, timeout_s) if timeout_s is not None else None
    with _POOL.buffer(length) as buffer:
        if length:
            stream = request.META.get("wsgi.input")
            if _is_gunicorn_length_body(stream):
                got = _read_gunicorn(stream, buffer, deadline)
            else:
                got = _read_stream(request, buffer)
            if got < length:
                raise ValueError(f"request body cut short ({got} of {length} bytes)")
        yield buffer


def abandon_body(request: HttpRequest) -> None:
    """Have gunicorn close the connection after the response instead of reading the unread body.

    A request refused from its headers leaves its body on the socket; draining it would
    let the sender hold a thread (and cost the bandwidth) the refusal was meant to save.
    """
    stream = request.META.get("wsgi.input")
    if _GunicornBody is not None and type(stream) is _GunicornBody:
        stream.failed = True


def _is_gunicorn_length_body(stream: Any) -> bool:
    return (
        _GunicornBody is not None
        and type(stream) is _GunicornBody
        and type(stream.reader) is _GunicornLengthReader
        and type(stream.reader.unreader) is _GunicornSocketUnreader
    )


def _read_stream(request: HttpRequest, buffer: memoryview) -> int:
    got = 0
    while got < len(buffer):
        piece = request.read(min(_PIECE, len(buffer) - got))
        if not piece:
            break
        buffer[got : got + len(piece)] = piece
        got += len(piece)
    return got


def _read_gunicorn(body: Any, buffer: memoryview, deadline: float | None = None) -> int:
    """Fill ``buffer`` from gunicorn's buffers, then from the socket, keeping its reader's count right.

    ``body.buf`` holds body bytes already counted off the reader; the unreader's
    buffer holds whatever was received past them (the rest of the first segment after
    the headers), of which only ``reader.length`` bytes belong to this body.
    """
    reader = body.reader
    unreader = reader.unreader
    got = 0

    def take(data: bytes) -> None:
        nonlocal got
        n = min(len(data), len(buffer) - got)
        buffer[got : got + n] = data[:n]
        got += n

    take(body.buf.getvalue())
    body.buf.seek(0)
    body.buf.truncate()
    ahead = unreader.buf.getvalue()
    unreader.buf.seek(0)
    unreader.buf.truncate()
    mine = ahead[: reader.length]
    if len(mine) < len(ahead):
        unreader.unread(ahead[len(mine) :])
    reader.length -= len(mine)
    take(mine)
    sock = unreader.sock
    previous = sock.gettimeout()
    try:
        while got < len(buffer) and reader.length > 0:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SlowBody(f"request body too slow ({got} of {len(buffer)} bytes in time)")
                sock.settimeout(left)
            n = sock.recv_into(buffer[got : got + min(reader.length, len(buffer) - got)])
            if not n:
                break
            reader.length -= n
            got += n
    except TimeoutError:
        body.failed = True
        raise SlowBody(f"request body too slow ({got} of {len(buffer)} bytes in time)") from None
    except BaseException:
        body.failed = True  # where the next request starts is unknown: gunicorn closes the connection
        raise
    finally:
        sock.settimeout(previous)
    if got < len(buffer):
        body.failed = True
    return got
