"""``manage.py node run``: this node's agent loop (the ``node`` command dispatches here).

Configured only by the environment (see backend/settings.py and .env.example):
the same variables as the node's web process, plus DEFL_AGENT_INTERVAL and DEFL_ATTACK.
"""

from __future__ import annotations

import signal
import threading

from django.conf import settings
from django.core.management.base import CommandError


def add_run_parser(subparsers) -> None:
    run = subparsers.add_parser(
        "run", help="the agent loop: follow the chain and play this node's role in jobs"
    )
    run.add_argument("--interval", type=float, help="seconds between ticks (default DEFL_AGENT_INTERVAL)")
    run.add_argument("--once", action="store_true", help="run one tick and exit")


def run_agent(command, interval: float | None = None, once: bool = False, **_options) -> None:
    from backend.jobs.context import current_node
    from backend.jobs.driver import actions, agent
    from backend.jobs.tasks import dispatch, release_orphans

    try:
        ctx = current_node()
    except Exception as exc:  # no key, no chain, no contracts: say which in a sentence
        raise CommandError(f"cannot start the agent: {exc}") from exc
    eager = settings.CELERY_TASK_ALWAYS_EAGER
    if eager:
        # Actions run inside this process, so after a restart none of them can still be running.
        actions.release_lost_claims(ctx)
    interval = interval if interval is not None else settings.DEFL_AGENT_INTERVAL
    command.stdout.write(
        f"agent for {ctx.address}: tick on each new block (a newHeads subscription, else the head "
        f"polled every {settings.DEFL_AGENT_POLL}s) and every {interval}s, actions "
        f"{'in-process' if eager else 'on the Celery worker'}"
        + (f", ATTACK MODE {ctx.attack} (test hook)" if ctx.attack else "")
    )

    def report(offered) -> None:
        for due in offered:
            command.stdout.write(f"{due.kind} job {due.job_id} round {due.round}")

    if once:
        report(agent.tick(ctx, dispatch))
        return
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    poll = settings.DEFL_AGENT_POLL
    # Re-replicate this node's chunks every DEFL_SWARM_REPAIR_INTERVAL_S (backend/swarm/repair_schedule.py).
    from backend.swarm.repair_schedule import start_repair_schedule

    start_repair_schedule(stop)
    # In-process actions: the claims this process no longer holds are offered again, at once
    # after a tick the database failed, else by a periodic sweep. With a worker, its
    # broker-reconnect step and the claims' leases do that.
    recover = (lambda after_failure: release_orphans(ctx, after_failure)) if eager else None
    agent.run_forever(ctx, dispatch, interval=interval, poll=poll, stop=stop, on_tick=report, recover=recover)
    command.stdout.write("agent stopped")
