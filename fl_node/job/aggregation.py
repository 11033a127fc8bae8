"""How the accepted updates of a round become the next global model under the job: the
aggregation strategy and the defenses around it. One rule, read by the node's aggregator
(backend/jobs/driver/aggregator.py) and by the simulator (fl_node.simulate); every honest member
computes the same bytes from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from fl_node.aggregate import Strategy, WeightedUpdate, get_strategy
from fl_node.job.config import JobConfig
from fl_node.job.training import nominal_steps
from fl_node.normalized_average import WorkUpdate, normalized_average, work_norm
from fl_node.robust import RoundDefense, get_defense


def round_defense(job: JobConfig) -> RoundDefense:
    """The job's aggregation defenses (fl_node.robust.RoundDefense): the norm bound and the cap on an
    update's share, and what its defense adds (fl_node.robust.DEFENSES: the clip to the round's
    median norm, the sign vote, the verified step, the backed magnitude)."""
    return get_defense(job.defense).round_defense(
        top_k=job.top_k, norm_bound=job.norm_bound or None, max_share_bp=job.max_share_bp
    )


class NormalizedAverage:
    """FedNova over the round's updates with their claimed steps (an adaptive-work job)."""

    def __init__(self, job: JobConfig, steps: Mapping[str, int]) -> None:
        self.job = job
        self.steps = dict(steps)

    def aggregate(
        self,
        global_state: Mapping[str, Tensor],
        updates: Sequence[WeightedUpdate],
        server_state: Mapping[str, Tensor] | None = None,
    ) -> tuple[dict[str, Tensor], dict[str, Tensor] | None]:
        job = self.job
        nominal = nominal_steps(job)
        work = [WorkUpdate(u.update, u.num_samples, self.steps.get(u.id, nominal), u.id) for u in updates]
        new_state = normalized_average(
            global_state,
            work,
            max_steps=job.max_local_steps,
            momentum=job.momentum,
            tau_eff=work_norm(nominal, job.momentum),
            cap_steps=nominal,
        )
        return new_state, dict(server_state) if server_state else None


def strategy(job: JobConfig, steps: Mapping[str, int] | None = None) -> Strategy | NormalizedAverage:
    """The job's aggregation: FedNova over the updates' ``steps`` (by update id) for an
    adaptive-work job, else the job's strategy with its parameters."""
    if job.adaptive_work:
        return NormalizedAverage(job, steps or {})
    return get_strategy(job.strategy, **job.strategy_params)
