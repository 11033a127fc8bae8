"""The trainer's part of a round: train on the global model with DP, store the update, submitUpdate.

The privacy cost is charged in the local ledger before training, so a round that would pass
the dataset's cap trains nothing and sends nothing. Its on-chain record (DataRegistry.spendPrivacy)
goes out in the background while the node trains, and is awaited before submitUpdate: the
chain records the cost before any update trained on the data is published.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from backend.datasets.budget import Charge, reserve_budget, send_spend
from backend.jobs import blobs, chain
from backend.jobs.config import JobConfig
from backend.jobs.driver import aggregator, priority, state, timing, workspace
from backend.jobs.driver.state import ActionError, Outcome
from backend.jobs.models import RoundAction
from backend.ledger import errors as ledger_errors
from backend.ledger import models as mirror
from fl_node.attacks import get_attack
from fl_node.codec import content_hash
from fl_node.sparse import encode_for_job
from fl_node.train import plan_round, train_local

logger = logging.getLogger(__name__)
# A spendPrivacy transaction is awaited at most this long before the update would be submitted.
SPEND_TIMEOUT_S = 300.0
# While a speculative update waits for its round to open, the contract is asked this often.
AWAIT_POLL_S = 0.02


def round_seed(config: JobConfig, round_: int, index: int) -> int:
    return config.seed * 1_000_003 + round_ * 1009 + index


@dataclass(frozen=True)
class _Trained:
    """An update trained on a model that was not fixed on chain yet, kept until it is."""

    base_hash: str
    reference: str
    content_hash: str
    samples: int
    work_seconds: float
    ahead: bool  # trained before the round opened, on this node's own aggregate


# (node, job, round) -> an update waiting for its round to open; per process, as the caches are.
_waiting: dict[tuple[str, int, int], _Trained] = {}


def train_round(ctx, job: mirror.Job, config: JobConfig, round_: int, claim: RoundAction) -> Outcome:
    """``claim``: this action's row; it remembers a charge made by an earlier attempt that then died.

    Speculative (planned while round ``round_ - 1`` is aggregating): train on this node's own
    aggregate of the previous round, which every honest committee member computes to the same
    bytes, and submit only once the chain has opened the round on a model with the same hash.
    On a different hash (a faulty committee) the update is discarded, unpublished, and the
    round trains again on the fixed model, in the same claim: the privacy charge is not repeated.
    """
    # A first attempt cannot have submitted (the planner saw no update in the mirror); a retry
    # after a crash may have: ask the contract before training again.
    if claim.attempts > 1 and chain.participant(ctx, job.job_id).update_round == round_:
        return Outcome(True, "update already on chain")
    key = (ctx.address, job.job_id, round_)
    for _ in range(2):
        trained = _waiting.pop(key, None) or _train(ctx, job, config, round_, claim)
        opened = _await_round(ctx, job.job_id, round_)
        if opened is None:
            workspace.keep_round(_waiting, *key)
            _waiting[key] = trained
            return Outcome(False, f"trained on {trained.base_hash[:12]}…; waiting for round {round_} to open")
        if opened is _MOVED_ON:
            return Outcome(True, "the round has moved on")
        if opened == trained.base_hash.removeprefix("0x").lower():
            try:
                receipt = chain.submit_update(
                    ctx, job.job_id, round_, trained.reference, trained.content_hash, trained.samples
                )
            except ledger_errors.DuplicateUpdate:
                return Outcome(True, "update already on chain")
            detail = f"update of {trained.samples} samples submitted"
            if trained.ahead:
                detail += " (trained ahead of the round, on this node's own aggregate)"
            return Outcome(True, detail, receipt.tx_hash, trained.work_seconds)
        logger.warning(
            "round %s of job %s opened on %s, not on the %s this node aggregated; training again",
            round_,
            job.job_id,
            opened,
            trained.base_hash,
        )
    raise ActionError(f"round {round_} keeps opening on a model other than the one trained on")


_MOVED_ON = "moved on"


def _await_round(ctx, job_id: int, round_: int) -> str | None:
    """The hash (hex) of the model round ``round_`` opened on; None if it is not open within the wait."""
    deadline = time.monotonic() + ctx.speculation_wait_s
    while True:
        on_chain = chain.job_state(ctx, job_id)
        if on_chain.round > round_ or on_chain.status != chain.JobStatus.RUNNING:
            return _MOVED_ON
        if on_chain.round == round_:  # open, or already finalized without this node's update
            return on_chain.model_hash.hex() if on_chain.phase == chain.RoundPhase.TRAINING else _MOVED_ON
        if time.monotonic() >= deadline:
            return None
        time.sleep(AWAIT_POLL_S)


def training_thread(ctx) -> ThreadPoolExecutor:
    """The thread that trains, ``ctx.train_nice`` steps nicer than the rest (see driver.priority)."""
    return priority.low_priority("train", ctx.train_nice)


def _base_model(ctx, job: mirror.Job, config: JobConfig, round_: int) -> tuple[str, dict, bool]:
    """(hash, state, ahead) of the model the round starts from: fixed on chain, else this node's aggregate."""
    try:
        reference, model_hash = state.base_model(job, round_)
    except ActionError:
        if not job.rounds_set.filter(number=round_ - 1, status=mirror.Round.Status.AGGREGATING).exists():
            raise
        model_hash, data = aggregator.aggregate(ctx, job, config, round_ - 1)
        return model_hash, workspace.remember_model(model_hash, data)[1], True
    return model_hash, workspace.global_model(ctx, reference, model_hash, config)[1], False


def _train(ctx, job: mirror.Job, config: JobConfig, round_: int, claim: RoundAction) -> _Trained:
    """Train this node's update for the round (charging its privacy once) and store it in the swarm."""
    with timing.part(timing.PREPARE):
        dataset = state.my_dataset(job, ctx.address)
        train, _ = workspace.local_split(dataset, config)
        base_hash, global_state, ahead = _base_model(ctx, job, config, round_)
        seed = round_seed(config, round_, state.participant_index(job, ctx.address))
        train_config = config.train_config(seed)
    with timing.part(timing.PRIVACY):
        mechanism = config.update_mechanism()
        spending = _charge_once(claim, dataset, job.job_id, config, train_config, len(train), mechanism)

    attack = get_attack(ctx.attack.split(":")[0]) if ctx.attack else None
    data = attack.poison_data(train, config.num_classes) if attack and attack.poison_data else train
    started = time.perf_counter()
    if attack and not attack.trains:
        update = {k: torch.zeros_like(v) for k, v in global_state.items() if v.is_floating_point()}
    else:
        # The DP accounting was charged above; train_local's own history is this call's only.
        model = config.build_model()
        with timing.part(timing.TRAIN):
            update = training_thread(ctx).submit(train_local, model, global_state, data, train_config)
            update = update.result().update
    work = time.perf_counter() - started
    update = {k: v for k, v in update.items() if v.is_floating_point()}
    if mechanism is not None:
        update = mechanism.privatize(update, generator=torch.Generator().manual_seed(seed))
    if attack and attack.poison_update:
        update = attack.poison_update(update, torch.Generator().manual_seed(seed))

    blob = encode_for_job(update, global_state, config.sparse.policy())
    reference = blobs.put(ctx, blob)
    if spending is not None:
        # Nothing trained on the data leaves this node before the chain recorded its privacy
        # cost; a failure here fails the action, and its retry sends the spend again.
        with timing.part(timing.PRIVACY):
            spending.result(timeout=SPEND_TIMEOUT_S)
        RoundAction.objects.filter(pk=claim.pk).update(privacy_unsent=0)
    return _Trained(base_hash, reference, content_hash(blob), len(data), work, ahead)


def _charge_once(
    claim: RoundAction, dataset, job_id: int, config: JobConfig, train_config, samples: int, mechanism
) -> Future | None:
    """Charge the round's privacy once per round (strict, local) and start its on-chain spend.

    Returns the spendPrivacy in flight (None when nothing is to be sent). A retry re-runs the
    same seeded computation, so it has no new privacy cost: it only re-sends an unsent spend.
    """
    if claim.budget_charged:
        unsent = Charge(math.nan, dataset.onchain_id, str(job_id), claim.privacy_unsent)
        return send_spend(unsent) if unsent.onchain else None
    charge = _reserve(dataset, job_id, train_config, samples, mechanism)
    owed = charge.micro_epsilon if charge is not None and charge.onchain else 0
    RoundAction.objects.filter(pk=claim.pk).update(budget_charged=True, privacy_unsent=owed)
    return send_spend(charge) if owed else None


def _reserve(dataset, job_id: int, train_config, samples: int, mechanism) -> Charge | None:
    if mechanism is not None:
        return reserve_budget(
            dataset, job_id, noise_multiplier=mechanism.noise_multiplier, sample_rate=1.0, steps=1
        )
    if not train_config.private:
        return None
    plan = plan_round(samples, train_config)
    return reserve_budget(
        dataset,
        job_id,
        noise_multiplier=plan.noise_multiplier,
        sample_rate=plan.sample_rate,
        steps=plan.steps,
    )
