"""Timing helper shared by the micro-benchmarks."""

import time
from collections.abc import Callable


def best_time(run: Callable[[], object], repeats: int = 5) -> float:
    """The fastest of ``repeats`` runs, in seconds: the least disturbed by other load."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best
