"""Checks of a finished job's privacy figures, for the protocol tests.

What every member shows for a participant must be the participant's own epsilon in the job at
the job's delta, recomputed from public records alone (its plan from the job's config and its
dataset's size and hold-out flag on chain, its releases from the spends it recorded on chain);
and it must equal what the participant's node composed from its own records, so no release went
unrecorded.
"""

from __future__ import annotations

import pytest
from jobs_helpers import acting_as

from backend.datasets import budget, job_privacy
from backend.ledger import models as mirror
from fl_node.job.plan import participant_plan, scores_per_round
from fl_node.privacy import PrivacyHistory
from fl_node.privacy_audit import assert_claim_holds
from fl_node.privacy_plan import SPEND_WITHHELD, spends_history


def check_published_figures(nodes, datasets, job_id: int, operator_client, monkeypatch, *, withheld_by=()):
    """Every node's API shows, for every participant, the figure recomputed from the chain; it is
    the participant's own local figure at the job's delta; the audit under replace-one holds; and
    each node in ``withheld_by`` recorded a withheld training release on chain."""
    from backend.jobs.discovery import config_of, job_record

    job = mirror.Job.objects.get(job_id=job_id)
    count = job.participants.count()
    owners = {node.ctx.address: dataset for node, dataset in zip(nodes, datasets, strict=True)}
    for viewer in nodes:
        with acting_as(viewer, monkeypatch):
            config = config_of(job_record(viewer.ctx, job_id))
            shown = operator_client.get(f"/api/jobs/{job_id}").json()["privacy"]
        assert shown["delta"] == config.dp.delta
        for row in shown["participants"]:
            dataset_id = int(row["dataset"])
            records = job_privacy.recorded_spends(job_id, dataset_id, row["node"], rounds=job.rounds)
            samples, public = job_privacy.registered_facts(dataset_id)
            plan = participant_plan(
                config,
                samples=samples,
                public_holdout=public,
                scores_per_round=scores_per_round(count, job.committee_size),
            )
            history = spends_history(plan, records)
            if plan.count is not None:  # an add-remove figure rests on the dataset's count
                history = PrivacyHistory(plan.count.history().entries + history.entries)
            recomputed = job_privacy.participant_epsilon(plan, records)
            assert row["epsilon_spent"] == pytest.approx(recomputed, rel=1e-12), row
            assert row["source"] == "chain"
            assert_claim_holds(
                history, delta=config.dp.delta, claimed_epsilon=recomputed, adjacency=plan.adjacency
            )
            # The participant's own node composed the same releases at the job's delta.
            own = owners[row["node"]]
            local = budget.job_spend(own, job_id, delta=config.dp.delta, adjacency=config.dp.adjacency)
            assert local.reserved == 0.0
            assert recomputed == pytest.approx(local.spent, rel=1e-9), (row["node"], records)
            if viewer.ctx.address == row["node"]:
                assert row["epsilon_local"] == pytest.approx(local.spent, rel=1e-12)
    for address in withheld_by:
        dataset = owners[address]
        kinds = {
            kind
            for kind, _ in job_privacy.recorded_spends(
                job_id, int(dataset.onchain_id), address, rounds=job.rounds
            )
        }
        assert SPEND_WITHHELD in kinds, (address, kinds)
