"""Knowing when the chain has a new block, as soon as the chain can say it.

A node's agent acts on new blocks: every step of a round is a transaction, so a new block
is when this node may have something to do. ``HeadWatcher.wait`` returns when one arrived:

- over a WebSocket subscription (``eth_subscribe("newHeads")``) where the endpoint serves
  one (anvil, geth and reth do, on the same port as HTTP): the block wakes the waiter within
  a millisecond, and an idle node sends no request at all;
- by polling ``eth_blockNumber`` every ``poll`` seconds otherwise (the in-process EVM, an
  HTTP-only endpoint), or after the subscription failed: the agent never depends on it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from .client import ChainClient

logger = logging.getLogger(__name__)


def websocket_url(http_url: str) -> str | None:
    """The WebSocket URL served beside an HTTP JSON-RPC URL (same host, port and path)."""
    parts = urlsplit(http_url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    return urlunsplit(parts._replace(scheme=scheme)) if scheme else None


def endpoint_of(client: ChainClient) -> str | None:
    """The JSON-RPC URL of the client's provider (None for the in-process EVM)."""
    provider = getattr(getattr(client, "w3", None), "provider", None)
    return getattr(provider, "endpoint_uri", None)


@dataclass(frozen=True)
class Head:
    """A block header as the newHeads subscription delivered it."""

    number: int
    timestamp: int


def parse_head(message: str) -> Head | None:
    """The header in an ``eth_subscription`` notification; None for anything else."""
    try:
        result = json.loads(message)["params"]["result"]
        return Head(int(result["number"], 16), int(result["timestamp"], 16))
    except (ValueError, KeyError, TypeError):
        return None


class HeadWatcher:
    def __init__(self, client: ChainClient, *, poll: float = 0.05, subscribe: bool = True) -> None:
        self.client = client
        self.poll = poll
        self._new_head = threading.Event()
        self._last: int | None = self._head()  # changes after this are new blocks
        self._subscribed = False
        self._closed = threading.Event()
        self._latest: Head | None = None
        url = endpoint_of(client)
        ws_url = websocket_url(url) if (subscribe and url) else None
        if ws_url:
            threading.Thread(target=self._listen, args=(ws_url,), name="chain-heads", daemon=True).start()

    @property
    def subscribed(self) -> bool:
        return self._subscribed

    @property
    def latest(self) -> Head | None:
        """The newest header the subscription delivered, while subscribed; else None (ask the chain).

        It saves the tick two requests (the head's number for the indexer, its timestamp for
        the deadlines): they are in the notification that woke it.
        """
        return self._latest if self._subscribed else None

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if a new block arrived (or may have: polling)."""
        if self._subscribed:
            arrived = self._new_head.wait(timeout)
            self._new_head.clear()
            return arrived
        deadline = time.monotonic() + timeout
        while True:
            head = self._head()
            if head is None or head != self._last:
                self._last = head
                return True
            left = deadline - time.monotonic()
            if left <= 0 or self._closed.is_set():
                return False
            time.sleep(min(self.poll, left))

    def close(self) -> None:
        self._closed.set()
        self._new_head.set()

    def _head(self) -> int | None:
        try:
            return self.client.block_number()
        except Exception:  # the chain is away: the caller's tick reports it
            return None

    def _listen(self, url: str) -> None:
        """Hold the subscription; on any failure fall back to polling for good."""
        from websockets.sync.client import connect

        try:
            with connect(url, open_timeout=5, max_size=2**22) as ws:
                ws.send(
                    json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_subscribe", "params": ["newHeads"]})
                )
                answer = json.loads(ws.recv(timeout=5))
                if "result" not in answer:
                    raise RuntimeError(f"eth_subscribe refused: {answer.get('error')}")
                self._subscribed = True
                self._new_head.set()  # whatever happened before we listened: look once
                while not self._closed.is_set():
                    try:
                        message = ws.recv(timeout=1.0)
                    except TimeoutError:
                        continue
                    if isinstance(message, bytes):  # a binary frame: JSON all the same
                        message = message.decode("utf-8", "replace")
                    if '"eth_subscription"' in message:
                        head = parse_head(message)
                        if head is not None and (self._latest is None or head.number >= self._latest.number):
                            self._latest = head
                        self._new_head.set()
        except Exception as exc:
            logger.info(
                "no newHeads subscription at %s (%s); polling the head every %ss", url, exc, self.poll
            )
        finally:
            self._subscribed = False
            self._latest = None
            self._new_head.set()  # wake a waiter so it continues by polling
