"""Nonces that never collide between threads or processes of the same node.

A thread lock serializes the threads of one process; an exclusive ``fcntl`` lock on a file
(one per chain and address) serializes processes. Under both locks the nonce is the chain's
pending transaction count (or one past the last nonce this process sent, if the node has not
counted it yet) and stays reserved until the transaction is in the node's pool.
"""

from __future__ import annotations

import fcntl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


class NonceManager:
    def __init__(self, lock_path: Path | None = None):
        self._lock_path = lock_path
        self._thread_lock = threading.Lock()
        self._next: int | None = None

    @contextmanager
    def reserve(self, pending_count: Callable[[], int]) -> Iterator[int]:
        """Yield the next nonce; it is used up only if the body returns without raising."""
        with self._thread_lock, self._process_lock():
            nonce = pending_count()
            if self._next is not None and self._next > nonce:
                nonce = self._next
            try:
                yield nonce
            except BaseException:
                self._next = None  # re-read the chain next time: the transaction may not exist
                raise
            self._next = nonce + 1

    def reset(self) -> None:
        """Forget the local count (after the chain was reverted to a snapshot, say)."""
        with self._thread_lock:
            self._next = None

    @contextmanager
    def _process_lock(self) -> Iterator[None]:
        if self._lock_path is None:
            yield
            return
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
