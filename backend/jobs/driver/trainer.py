"""The trainer's part of a round: train on the global model with DP, store the update, submitUpdate.

The privacy cost is charged (locally and on chain through DataRegistry.spendPrivacy) before
training, so a round that would pass the dataset's cap trains nothing and sends nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from backend.datasets.budget import charge_budget
from backend.jobs import blobs, chain
from backend.jobs.config import JobConfig
from backend.jobs.driver import state, timing, workspace
from backend.jobs.driver.state import Outcome
from backend.ledger import models as mirror
from fl_node.attacks import get_attack
from fl_node.codec import content_hash, encode_update
from fl_node.train import plan_round, train_local


def round_seed(config: JobConfig, round_: int, index: int) -> int:
    return config.seed * 1_000_003 + round_ * 1009 + index


def train_round(
    ctx, job: mirror.Job, config: JobConfig, round_: int, *, charged: bool, on_charged: Callable[[], None]
) -> Outcome:
    """``charged``: this round's privacy was charged by an earlier attempt (which then died)."""
    if chain.participant(ctx, job.job_id).update_round == round_:
        return Outcome(True, "update already on chain")
    with timing.part(timing.PREPARE):
        dataset = state.my_dataset(job, ctx.address)
        train, _ = workspace.local_split(dataset, config)
        reference, model_hash = state.base_model(job, round_)
        _, global_state, _ = workspace.global_model(ctx, reference, model_hash)
        seed = round_seed(config, round_, state.participant_index(job, ctx.address))
        train_config = config.train_config(seed)
    with timing.part(timing.PRIVACY):
        mechanism = config.update_mechanism()
        if not charged:
            _charge(dataset, job.job_id, config, train_config, len(train), mechanism)
            on_charged()  # a retry re-runs the same seeded computation: same output, no new privacy cost

    attack = get_attack(ctx.attack.split(":")[0]) if ctx.attack else None
    data = attack.poison_data(train, config.num_classes) if attack and attack.poison_data else train
    started = time.perf_counter()
    if attack and not attack.trains:
        update = {k: torch.zeros_like(v) for k, v in global_state.items() if v.is_floating_point()}
    else:
        # The DP accounting was charged above; train_local's own history is this call's only.
        model = config.build_model()
        with timing.part(timing.TRAIN):
            update = train_local(model, global_state, data, train_config).update
    work = time.perf_counter() - started
    update = {k: v for k, v in update.items() if v.is_floating_point()}
    if mechanism is not None:
        update = mechanism.privatize(update, generator=torch.Generator().manual_seed(seed))
    if attack and attack.poison_update:
        update = attack.poison_update(update, torch.Generator().manual_seed(seed))

    blob = encode_update(update)
    reference = blobs.put(ctx, blob)
    receipt = chain.submit_update(ctx, job.job_id, round_, reference, content_hash(blob), len(data))
    return Outcome(True, f"update of {len(data)} samples submitted", receipt.tx_hash, work)


def _charge(dataset, job_id: int, config: JobConfig, train_config, samples: int, mechanism) -> None:
    if mechanism is not None:
        charge_budget(dataset, job_id, noise_multiplier=mechanism.noise_multiplier, sample_rate=1.0, steps=1)
    elif train_config.private:
        plan = plan_round(samples, train_config)
        charge_budget(
            dataset,
            job_id,
            noise_multiplier=plan.noise_multiplier,
            sample_rate=plan.sample_rate,
            steps=plan.steps,
        )
