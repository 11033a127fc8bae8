"""Threads for bulk work that should take only the CPU the round's critical path leaves.

Training, and measuring a fixed model, are bulk work; everything else a node does (noticing
a block, scoring, finalizing, serving chunks and the API) is on some round's critical path
and should not queue behind it on a busy machine. Linux sets niceness per thread, so only
these threads yield; the rest of the process keeps its priority.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger(__name__)
_executors: dict[tuple[str, int], ThreadPoolExecutor] = {}
_lock = threading.Lock()


def low_priority(name: str, nice: int) -> ThreadPoolExecutor:
    """One thread named ``name``, ``nice`` steps nicer than the process (0: same priority)."""
    nice = max(0, int(nice))
    with _lock:
        if (name, nice) not in _executors:
            _executors[name, nice] = ThreadPoolExecutor(1, name, initializer=_lower, initargs=(nice,))
        return _executors[name, nice]


def _lower(nice: int) -> None:
    if nice:
        try:
            thread = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + nice))
        except (AttributeError, OSError) as exc:  # not Linux, or not allowed: full priority
            logger.info("thread keeps its priority: %s", exc)
