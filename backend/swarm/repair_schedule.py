"""Scheduled repair: every node re-replicates what it holds by itself, not only when asked.

A storage node that is lost for good (its disk gone) takes one copy of each chunk it held with
it; nothing notices until someone reads a chunk whose other copies are also gone. So each
node's agent runs ``Swarm.repair`` over everything it holds every DEFL_SWARM_REPAIR_INTERVAL_S
seconds (0 turns it off), in a background thread so that a long repair never delays a round.
The first run waits a random part of the interval: nodes started together do not all repair
(and load each other) at the same moment. A failed run is logged and tried again next time.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class RepairSchedule:
    def __init__(
        self,
        run: Callable[[], object],
        interval_s: float,
        *,
        first_delay_s: float | None = None,
        on_report: Callable[[object | None], None] | None = None,
    ):
        if interval_s <= 0:
            raise ValueError("the repair interval must be positive")
        self.run = run
        self.interval_s = interval_s
        self.first_delay_s = random.uniform(0, interval_s) if first_delay_s is None else first_delay_s
        self.runs = 0
        self.failures = 0
        self.last_report: object = None
        self.on_report = on_report  # told of each run's report (None: it failed): the node's metrics

    def run_once(self) -> None:
        try:
            self.last_report = self.run()
            logger.info("scheduled swarm repair: %s", self.last_report)
            self._tell(self.last_report)
        except Exception:  # a peer or the chain away: next time
            self.failures += 1
            logger.exception("scheduled swarm repair failed")
            self._tell(None)
        finally:
            self.runs += 1
            _close_database_connection()

    def _tell(self, report: object | None) -> None:
        if self.on_report is not None:
            try:
                self.on_report(report)
            except Exception:  # counting must never stop the schedule
                logger.exception("repair observer failed")

    def loop(self, stop: threading.Event) -> None:
        delay = self.first_delay_s
        while not stop.wait(delay):
            self.run_once()
            delay = self.interval_s

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.loop, args=(stop,), name="swarm-repair", daemon=True)
        thread.start()
        return thread


def _close_database_connection() -> None:
    # This thread's own connection (the peer directory reads the chain's mirror): not left open
    # between runs an interval apart, where the server would time it out.
    from django.db import connection

    connection.close()


def start_repair_schedule(stop: threading.Event) -> threading.Thread | None:
    """The node's schedule from its settings; None when DEFL_SWARM_REPAIR_INTERVAL_S is 0."""
    from django.conf import settings

    from backend.swarm import factory
    from backend.telemetry.counters import repair_finished

    interval = float(getattr(settings, "DEFL_SWARM_REPAIR_INTERVAL_S", 0))
    if interval <= 0:
        return None
    schedule = RepairSchedule(lambda: factory.node_swarm().repair(None), interval, on_report=repair_finished)
    return schedule.start(stop)
