"""How an honest committee member scores a round's updates under the job: one rule, read by the
node's committee (backend/jobs/driver/committee.py) and by the simulator (fl_node.simulate).

Every member also scores the unchanged global model (the base): the contract accepts an update
whose median score beats the base's median by the job's margin. Under a defense that scores
relatively (fl_node.robust.DEFENSES: "levelled", the default, "mixing", "robust" and "committee") each update is scored
relative to the base at its 1/top_k share, clipped first to the round's median norm
(fl_node.score.member_scores); under "none" each update is scored whole (fl_node.score.score_update).
"""

from __future__ import annotations

from dataclasses import dataclass

from fl_node.job.config import JobConfig
from fl_node.robust import get_defense


@dataclass(frozen=True)
class ScoringRule:
    metric: str  # fl_node.score.METRICS
    relative: bool  # scored relative to the base model (fl_node.score.member_scores)
    scale: float  # the share of an update applied before it is scored (relative scores)
    clip_to_median: bool  # each update clipped to the round's median norm before it is scored
    norm_bound: float | None  # an update above this L2 norm scores 0 (None: no bound)
    margin: int  # basis points an update's median must beat the base model's median by


def scoring(job: JobConfig) -> ScoringRule:
    relative = get_defense(job.defense).relative_scores
    return ScoringRule(
        metric=job.score_metric,
        relative=relative,
        scale=1 / job.top_k if relative else 1.0,
        clip_to_median=relative,
        norm_bound=job.norm_bound or None,
        margin=job.margin_bp,
    )
