"""The first committee's draw: this node reveals its draw secret, and anyone draws after the deadline.

A job's participants each committed to a secret when they joined (``chain.join``: HMAC of the
node's key, recomputed here, never stored). Once the proposer has started the job, each reveals
it; the reveal that completes the set draws the committee on chain. A participant that does not
reveal by the deadline takes no part in the job, and then any member draws from those that did:
the proposer at once, the others after ``proposer_fallback_s`` if it is still needed.
"""

from __future__ import annotations

import time

from backend.jobs import chain
from backend.jobs.context import NodeContext
from backend.jobs.driver.state import Outcome
from backend.ledger import errors as ledger_errors
from backend.ledger import models as mirror


def reveal(ctx: NodeContext, job: mirror.Job) -> Outcome:
    on_chain = chain.job_state(ctx, job.job_id)
    if on_chain.status != chain.JobStatus.DRAWING:
        return Outcome(True, "the committee is drawn already")
    if chain.participant(ctx, job.job_id).drawn:
        return Outcome(True, "the draw secret is revealed already")
    try:
        receipt = chain.reveal_draw_secret(ctx, job.job_id)
    except (ledger_errors.AlreadyRevealed, ledger_errors.DrawNotOpen):
        return Outcome(True, "the draw secret is revealed already, or the draw is over")
    except ledger_errors.DeadlinePassed:
        return Outcome(True, "the reveal deadline passed: this node takes no part in the job")
    return Outcome(True, "revealed the draw secret", receipt.tx_hash)


def draw(ctx: NodeContext, job: mirror.Job, first_seen: float) -> Outcome:
    waited = time.time() - first_seen
    if job.proposer != ctx.address and waited < ctx.proposer_fallback_s:
        return Outcome(
            False,
            f"reveal deadline passed; drawing after {ctx.proposer_fallback_s:.0f}s if the proposer does not",
            recheck_s=ctx.proposer_fallback_s - waited,
        )
    try:
        receipt = chain.draw_committee(ctx, job.job_id)
    except ledger_errors.DrawNotOpen:
        return Outcome(True, "the committee is drawn already")
    except ledger_errors.DrawNotOverdue:
        return Outcome(False, "the reveal deadline has not passed on chain yet")
    return Outcome(True, "drew the first committee from the revealed secrets", receipt.tx_hash)
