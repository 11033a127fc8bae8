"""Each node's contribution to a job, derived from the mirrored chain events (no extra gas).

Why derived, not counted on chain: every fact needed is already an event (RoundFinalized names
the accepted updates and their medians, ScoresSubmitted each reveal, GlobalModelVoted each vote,
GlobalModelFixed the pair that won), so any node or outside tool recomputes the same figures from
the chain alone; on-chain counters would add a storage write (2.9k-22.1k gas) to every update,
reveal and vote of every round for figures nothing on chain reads.

Only useful work counts: a vote counts when it was for the (hash, reference) pair the round fixed,
and a reveal when it scored every update of its round and agreed with the committee's decision on
at least half of them (its own score above its own base score plus the margin exactly when the
update was accepted). So a member is not paid for garbage: random scores, a blanket 10000 or 0,
or votes for a pair nobody else recomputed.

Per participant: ``accepted_updates`` and the sum of their medians (``accepted_median_sum``, basis
points), ``updates`` submitted, committee work (``reveals`` of scores, ``votes`` on global models),
and ``share``: its part of the job's contribution, where an accepted update counts its median and
one committee action counts as much as the job's mean accepted median (so scoring and aggregating
are paid like an average accepted update). Shares sum to 1 (all 0 when nothing counted yet).
"""

from __future__ import annotations

from collections import Counter

from eth_utils import keccak

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
    reveals = _useful_reveals(job, events.filter(name="ScoresSubmitted"))
    votes = _winning_votes(events)
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


def _winning_votes(events) -> Counter:
    """Per member, its votes for the pair its round fixed."""
    fixed = {
        e.args["round"]: (e.args["modelHash"].lower(), e.args["referenceDigest"].lower())
        for e in events.filter(name="GlobalModelFixed")
    }
    won: Counter = Counter()
    for e in events.filter(name="GlobalModelVoted"):
        pair = (e.args["modelHash"].lower(), _digest(e.args["modelRef"]))
        if fixed.get(e.args["round"]) == pair:
            won[e.args["member"]] += 1
    return won


def _useful_reveals(job: models.Job, reveals) -> Counter:
    """Per member, its reveals that scored every update of the round and agreed with the decision
    on at least half of them."""
    by_round: dict[int, dict[str, bool]] = {}
    for round_, trainer, was_accepted in job.updates.values_list("round", "trainer", "accepted"):
        by_round.setdefault(round_, {})[trainer] = was_accepted
    useful: Counter = Counter()
    for e in reveals:
        decided = by_round.get(e.args["round"], {})
        given = dict(zip(e.args["trainers"], e.args["scores"], strict=False))
        if not decided or set(given) != set(decided):
            continue
        threshold = int(e.args["baseScore"]) + int(job.margin)
        agree = sum((int(given[t]) > threshold) == decided[t] for t in decided)
        if 2 * agree >= len(decided):
            useful[e.args["member"]] += 1
    return useful


def _digest(reference: str) -> str:
    return "0x" + keccak(bytes.fromhex(reference.removeprefix("0x"))).hex()
