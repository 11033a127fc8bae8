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
PREPARE = "prepare"  # loading the job's config, this node's data split, decoding the global model
PRIVACY = "privacy"  # calibrating DP noise and charging the budget (accounting, spendPrivacy)


class _Collector:
    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self.children: list[float] = []  # per open part: time spent in parts nested in it


_current: ContextVar[_Collector | None] = ContextVar("defl_action_parts", default=None)


@contextmanager
def collect() -> Iterator[dict[str, float]]:
    """Sum the parts timed inside this block (one action run) into the yielded dict."""
    collector = _Collector()
    token = _current.set(collector)
    try:
        yield collector.parts
    finally:
        _current.reset(token)


@contextmanager
def part(name: str) -> Iterator[None]:
    """Time a block as ``name``; a part nested in another counts for itself only (no double count)."""
    collector = _current.get()
    if collector is None:
        yield
        return
    collector.children.append(0.0)
    started = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        nested = collector.children.pop()
        collector.parts[name] = collector.parts.get(name, 0.0) + elapsed - nested
        if collector.children:
            collector.children[-1] += elapsed
