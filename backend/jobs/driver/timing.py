"""Where an action's wall time goes: seconds per part (swarm, chain, scoring, ...), per action run.

``actions.run`` opens a collector around one action; the driver's steps wrap their swarm
transfers, chain calls and compute in ``part(name)``. The sums are stored on the action's
row and shown in the rounds API's ``timings``, so the round-overhead benchmark can split a
round without reading logs. Outside a collector ``part`` only runs the block.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# The parts a round's time is split into; "other" in an action is its wall time minus these.
TRAIN = "train"  # local training (train_local)
SWARM = "swarm"  # swarm store puts and gets of models and updates
CHAIN_TX = "chain_tx"  # transactions, until their receipt
CHAIN_READ = "chain_read"  # contract reads that guard an action
SCORE = "score"  # the committee scoring updates on its validation data
AGGREGATE = "aggregate"  # aggregating the accepted updates and encoding the new model
EVALUATE = "evaluate"  # measuring a fixed global model on this node's validation data

_current: ContextVar[dict[str, float] | None] = ContextVar("defl_action_parts", default=None)


@contextmanager
def collect() -> Iterator[dict[str, float]]:
    """Sum the parts timed inside this block (one action run) into the yielded dict."""
    parts: dict[str, float] = {}
    token = _current.set(parts)
    try:
        yield parts
    finally:
        _current.reset(token)


@contextmanager
def part(name: str) -> Iterator[None]:
    parts = _current.get()
    started = time.perf_counter()
    try:
        yield
    finally:
        if parts is not None:
            parts[name] = parts.get(name, 0.0) + time.perf_counter() - started
