"""Each node's contribution to a job, derived from the mirrored chain events (no extra gas).

Why derived, not counted on chain: every fact needed is already an event (RoundFinalized names
the accepted updates and their medians, ScoresSubmitted each reveal, GlobalModelProposed /
GlobalModelConfirmed each vote), so any node or outside tool recomputes the same figures from the
chain alone; on-chain counters would add a storage write (2.9k-22.1k gas) to every update, reveal
and vote of every round for figures nothing on chain reads.

Per participant: ``accepted_updates`` and the sum of their medians (``accepted_median_sum``, basis
points), ``updates`` submitted, committee work (``reveals`` of scores, ``votes`` on global models),
and ``share``: its part of the job's contribution, where an accepted update counts its median and
one committee action counts as much as the job's mean accepted median (so scoring and aggregating
are paid like an average accepted update). Shares sum to 1 (all 0 when nothing counted yet).
"""

from __future__ import annotations

from collections import Counter

from backend.ledger import models


def contributions(job: models.Job) -> list[dict]:
    """One row per participant, in join order."""
    nodes = list(job.participants.order_by("index").values_list("node", flat=True))
    accepted = job.updates.filter(accepted=True)
    accepted_count = Counter(accepted.values_list("trainer", flat=True))
    median_sum: Counter = Counter()
    for trainer, median in accepted.values_list("trainer", "median"):
        median_sum[trainer] += median or 0
    updates = Counter(job.updates.values_list("trainer", flat=True))
    events = models.ChainEvent.objects.filter(contract="FederatedLearning", args__jobId=job.job_id)
    reveals = Counter(e.args["member"] for e in events.filter(name="ScoresSubmitted"))
    votes = Counter(e.args["proposer"] for e in events.filter(name="GlobalModelProposed"))
    votes.update(e.args["member"] for e in events.filter(name="GlobalModelConfirmed"))
    total_accepted = sum(accepted_count.values())
    unit = sum(median_sum.values()) / total_accepted if total_accepted else 1.0
    weight = {n: median_sum[n] + unit * (reveals[n] + votes[n]) for n in nodes}
    total = sum(weight.values())
    return [
        {
            "node": n,
            "accepted_updates": accepted_count[n],
            "accepted_median_sum": median_sum[n],
            "updates": updates[n],
            "reveals": reveals[n],
            "votes": votes[n],
            "share": round(weight[n] / total, 6) if total else 0.0,
        }
        for n in nodes
    ]
