"""One job, one definition: the simulator and the node derive the same plans from the same JobConfig.

One ``fl_node.job.config.JobConfig`` is built; the node's own functions (its driver's privacy plan,
its trainer's round settings, its adaptive-work controller, its committee's scoring rule, its
aggregator's strategy and defenses) and the simulator's (fl_node.simulate) each derive from it, and
the two must be equal: the privacy plan, the training settings, the scoring and the aggregation.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from backend.jobs.driver import adaptive_work, aggregator, committee, trainer
from backend.jobs.driver import privacy as node_privacy
from fl_node.data import load_dataset
from fl_node.job import aggregation, training
from fl_node.job.config import DPConfig, JobConfig
from fl_node.job.simulated import job_for
from fl_node.simulate import SimulationConfig, build_participants, prepared_model_and_data, run_simulation
from fl_node.simulate import round_settings as simulated_round_settings

NODES = 6  # the job's participants: a committee of 3 and 3 trainers


def _job(**fields) -> JobConfig:
    base = dict(
        rounds=4,
        committee_size=3,
        top_k=2,
        margin_bp=50,
        lr=0.3,
        batch_size=32,
        dp=DPConfig(mode="sgd", target_epsilon=3.0, delta=1e-5, max_grad_norm=0.5),
        seed=7,
    )
    return job_for(load_dataset("digits", seed=7), "mlp", **(base | fields))


def _node_plan(job: JobConfig, samples: int, public_holdout: bool):
    """The node's driver's plan (backend.jobs.driver.privacy.node_plan) for a participant of a job
    of NODES participants whose dataset registered ``samples`` records: the mirror's job and the
    dataset row, as the plan reads them (their counts and flags)."""
    on_chain = SimpleNamespace(
        participants=SimpleNamespace(count=lambda: NODES), committee_size=job.committee_size
    )
    dataset = SimpleNamespace(num_samples=samples, public_holdout=public_holdout)
    return node_privacy.node_plan(None, on_chain, job, dataset)


@pytest.mark.parametrize("public_holdouts", [False, True])
@pytest.mark.parametrize(
    "fields",
    [
        {},  # DP-SGD, the default defense ("levelled")
        {"dp": DPConfig(mode="update", target_epsilon=2.0, max_grad_norm=1.0), "defense": "committee"},
        {"dp": DPConfig(mode="none"), "defense": "none", "strategy": "median"},
    ],
)
def test_the_simulator_and_the_node_derive_identical_plans_from_one_job(fields, public_holdouts):
    job = _job(**fields)
    simulated = SimulationConfig(
        job=job, dataset="digits", nodes=NODES, partition="iid", public_holdouts=public_holdouts
    )
    splits, _ = prepared_model_and_data("digits", job.model, seed=job.seed)
    participants = build_participants(simulated, splits)
    for participant in participants:
        # The privacy plan: from public numbers only, the same on both sides.
        samples = len(participant.train) + len(participant.val)
        node_plan = _node_plan(job, samples, public_holdouts)
        assert participant.plan == node_plan
        # One score per trainer and one of the base model: the count both plan and the node spends.
        assert node_plan.scores_per_round == NODES - job.committee_size + 1
        # The training settings of every round.
        for round_ in (1, 2, job.rounds):
            assert simulated_round_settings(
                job, round_, participant.index, node_plan
            ) == trainer.round_settings(job, round_, participant.index, node_plan)
    # The scoring: the node's committee reads the job's rule; the simulator's members score by it.
    assert simulated.scoring == committee.scoring(job)
    # The aggregation: the node's aggregator's strategy and defenses are the simulator's.
    assert simulated.defense == aggregator.aggregation.round_defense(job)
    strategy = aggregator.aggregation.strategy(job, {})
    assert type(strategy) is type(aggregation.strategy(job, {})) and strategy.name == job.strategy


@pytest.mark.django_db
def test_adaptive_work_gives_the_simulator_the_nodes_first_round():
    # The node's controller starts at the nominal steps (backend.jobs.driver.adaptive_work); the
    # simulator runs every round at them: the same settings, the same release.
    job = _job(adaptive_work=True, max_local_steps=20)
    plan = _node_plan(job, 300, False)
    settings = trainer.round_settings(job, 1, 0, plan)
    node = adaptive_work.plan_round("0x" + "ab" * 20, 1, job, settings, plan)
    simulated = training.adaptive_round(
        job, simulated_round_settings(job, 1, 0, plan), plan, training.nominal_steps(job)
    )
    assert node == simulated and node[0].local_steps == 5 and node[1] is not None and node[1].steps == 5
    fednova = aggregation.strategy(job, {})
    assert isinstance(fednova, aggregation.NormalizedAverage)
    assert isinstance(aggregator.aggregation.strategy(job, {}), aggregation.NormalizedAverage)


def test_a_simulated_committee_member_spends_no_more_score_releases_than_it_planned():
    # With a margin the base model's score is a release too: planned as one, spent as one.
    job = _job(rounds=1, margin_bp=100, defense="none")
    simulated = SimulationConfig(job=job, dataset="digits", nodes=NODES, partition="iid")
    result = run_simulation(simulated)
    splits, _ = prepared_model_and_data("digits", job.model, seed=job.seed)
    planned = {p.index: p.plan.scores_per_round for p in build_participants(simulated, splits)}
    members = result.rounds[0].committee
    assert len(members) == job.committee_size
    for index in members:  # round 1: a member's only release is its scores
        (release,) = result.histories[index].entries
        assert release.sample_rate == 1.0
        # the trainers' scores and the base's: as many as planned (none of the updates is unreadable)
        assert release.steps == planned[index] == NODES - job.committee_size + 1
    # The same job moved to another seed is another job: its plans are its own.
    assert replace(job, seed=8) != job
