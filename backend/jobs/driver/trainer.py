"""The trainer's part of a round: train on the global model with DP, store the update, submitUpdate.

Privacy (``backend.jobs.driver.privacy``): the round's training release is reserved in the
dataset's budget before training, so a round that would pass the cap trains nothing and sends
nothing; its on-chain record (spendPrivacy) goes out in the background while the node trains
and is awaited before the update is published. Every training run draws fresh secret
randomness and is a release of its own: a retrain is charged again.

Nothing is published before it is final: the update is stored in the swarm (where every
member can read it) only once the chain opened the round on the model it was trained on. A
speculative update on a model the committee did not fix is discarded unpublished (withheld).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from backend.cluster import runner as cluster_runner
from backend.jobs import blobs, chain, encodings
from backend.jobs.config import JobConfig
from backend.jobs.driver import aggregator, priority, state, timing, workspace
from backend.jobs.driver import privacy as round_privacy
from backend.jobs.driver.state import ActionError, Outcome
from backend.jobs.models import RoundAction
from backend.ledger import errors as ledger_errors
from backend.ledger import models as mirror
from fl_node.attacks import get_attack
from fl_node.codec import content_hash
from fl_node.local_round import local_round
from fl_node.sparse import TensorChoice, encode_with_policy

logger = logging.getLogger(__name__)
# While a speculative update waits for its round to open, the contract is asked this often.
AWAIT_POLL_S = 0.02


def round_seed(config: JobConfig, round_: int, index: int) -> int:
    """Public: seeds only what DP does not rely on (dropout) and a scripted attacker's draws."""
    return config.seed * 1_000_003 + round_ * 1009 + index


@dataclass(frozen=True)
class _Trained:
    """An update trained on a model that was not fixed on chain yet, kept until it is."""

    base_hash: str
    blob: bytes  # the encoded update: held here, unpublished, until the round opens on base_hash
    content_hash: str
    samples: int
    work_seconds: float
    ahead: bool  # trained before the round opened, on this node's own aggregate
    kind: str  # the release kind it was charged as
    choices: dict[str, TensorChoice]  # each tensor's encoding (fl_node.sparse), recorded once submitted


# (node, job, round) -> an update waiting for its round to open; per process, as the caches are.
_waiting: dict[tuple[str, int, int], _Trained] = {}


def train_round(ctx, job: mirror.Job, config: JobConfig, round_: int, claim: RoundAction) -> Outcome:
    """``claim``: this action's row (its attempts, and the privacy spend still unsent).

    Speculative (planned while round ``round_ - 1`` is aggregating): train on this node's own
    aggregate of the previous round, which every honest committee member computes to the same
    bytes, and publish and submit only once the chain has opened the round on a model with the
    same hash. On a different hash (a faulty committee) the update is discarded unpublished
    (withheld, still counted) and the round trains again on the fixed model: a new release,
    charged again.
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
        dataset = state.my_dataset(job, ctx.address)
        if opened is _MOVED_ON:
            round_privacy.withheld(dataset, job.job_id, round_, trained.kind)
            return Outcome(True, "the round has moved on")
        if opened == trained.base_hash.removeprefix("0x").lower():
            reference = blobs.put(ctx, trained.blob)  # published only now that it is final
            try:
                receipt = chain.submit_update(
                    ctx, job.job_id, round_, reference, trained.content_hash, trained.samples
                )
            except ledger_errors.DuplicateUpdate:
                round_privacy.released(dataset, job.job_id, round_, trained.kind)
                return Outcome(True, "update already on chain")
            round_privacy.released(dataset, job.job_id, round_, trained.kind)
            encodings.record_sent(ctx.address, job.job_id, round_, trained.choices)
            detail = f"update of {trained.samples} samples submitted"
            if trained.ahead:
                detail += " (trained ahead of the round, on this node's own aggregate)"
            return Outcome(True, detail, receipt.tx_hash, trained.work_seconds)
        round_privacy.withheld(dataset, job.job_id, round_, trained.kind)
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
    """Train this node's update for the round: reserve its release, train, encode; publish nothing."""
    with timing.part(timing.PREPARE):
        dataset = state.my_dataset(job, ctx.address)
        train, _ = workspace.local_split(dataset, config)
        base_hash, global_state, ahead = _base_model(ctx, job, config, round_)
        seed = round_seed(config, round_, state.participant_index(job, ctx.address))
        plan = round_privacy.node_plan(job, config, dataset)
        train_config = config.train_config(seed, plan)
    kind = plan.train.kind if plan.train is not None else "none"
    with timing.part(timing.PRIVACY):
        spending = (
            round_privacy.reserve(claim, dataset, job.job_id, round_, plan.train)
            if plan.train is not None
            else None
        )

    attack = get_attack(ctx.attack.split(":")[0]) if ctx.attack else None
    started = time.perf_counter()
    with timing.part(timing.TRAIN):
        # A cluster task (backend.cluster.runner): placed on a slot, retried, cancellable, logged.
        result = cluster_runner.run(
            job.job_id,
            round_,
            local_round,
            config.build_model(),
            global_state,
            train,
            train_config,
            num_classes=config.num_classes,
            mechanism=config.update_mechanism(plan),
            attack=attack,
            attack_seed=seed,
            kept_rows=config.kept_rows(global_state, round_),
            node=ctx.address,
            nice=ctx.train_nice,
        )
    work = time.perf_counter() - started
    blob, choices = encode_with_policy(result.update, global_state, config.sparse.policy())
    with timing.part(timing.PRIVACY):
        round_privacy.await_spend(claim, spending)
    return _Trained(base_hash, blob, content_hash(blob), result.samples, work, ahead, kind, choices)
