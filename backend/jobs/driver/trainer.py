"""The trainer's part of a round: train on the global model with DP, store the update, submitUpdate.

Privacy (``backend.jobs.driver.privacy``): the round's training release is reserved in the
dataset's budget before training, so a round that would pass the cap trains nothing and sends
nothing; its on-chain record is the ``spend`` of the update's own submitUpdate (one
transaction, no spendPrivacy). Every training run draws fresh secret randomness and is a
release of its own: a retrain is charged again. A store or submit that failed (too few replicas
while a peer restarts, an RPC outage, the database gone) keeps the trained update for the retry,
which stores and submits it again instead of retraining: one release, charged once. A retry
after a failure between the reservation and the encoded update (the task runner's bookkeeping
or the database going away) takes over that reservation, and the training's result when it
has one, instead of reserving and training the round again (``TrainingAttempt``).

Nothing is readable before its round's training is over: the update is sealed
(``backend.jobs.sealed``: its key is served only then). Trained while the previous round
aggregates, on this node's own aggregate of its accepted updates (deterministic: the model every
honest committee member votes for), it is stored and submitted at once, as an early update of
the round (FederatedLearning.submitUpdate), so it lands in the block that fixes that model. Once
the round is open, an update is submitted only if the round opened on the model it was trained
on; one trained on another model is discarded unpublished (withheld) and the round trained again.
"""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from django.utils import timezone

from backend.cluster import priority
from backend.cluster import runner as cluster_runner
from backend.datasets.models import PrivacyRelease
from backend.jobs import chain, encodings
from backend.jobs.context import NodeContext
from backend.jobs.driver import adaptive_work, aggregator, state, timing, workspace
from backend.jobs.driver import privacy as round_privacy
from backend.jobs.driver.memory import TrainedUpdate, TrainingAttempt
from backend.jobs.driver.state import ActionError, Outcome
from backend.jobs.models import RoundAction
from backend.jobs.sealed import key_store
from backend.ledger import errors as ledger_errors
from backend.ledger import models as mirror
from fl_node.attacks import get_attack
from fl_node.codec import content_hash
from fl_node.job import training
from fl_node.job.config import JobConfig
from fl_node.job.plan import update_mechanism, update_samples
from fl_node.local_round import local_round
from fl_node.privacy_plan import PrivacyPlan
from fl_node.sparse import encode_with_policy
from fl_node.train import TrainConfig

logger = logging.getLogger(__name__)
# While a speculative update waits for its round to open, the contract is asked this often.
AWAIT_POLL_S = 0.02


def round_settings(config: JobConfig, round_: int, index: int, plan: PrivacyPlan) -> TrainConfig:
    """Participant ``index``'s training settings for ``round_`` (before adaptive work picks the round's
    steps): the job's (fl_node.job.training), seeded by the round and the participant, as the
    simulator's (tests/jobs/test_one_job_definition.py)."""
    return training.train_config(config, training.round_seed(config, round_, index), plan)


def train_round(
    ctx: NodeContext, job: mirror.Job, config: JobConfig, round_: int, claim: RoundAction
) -> Outcome:
    """``claim``: this action's row (its attempts, and the privacy spend still unsent).

    Ahead of the round (planned while round ``round_ - 1`` is aggregating): train on this node's own
    aggregate of the previous round, which every honest committee member computes to the same
    bytes, and submit it early while that round still aggregates. Once the round is open, an
    update trained on another model than the one it opened on (a faulty committee) is discarded
    unpublished (withheld, still counted) and the round trains again on the fixed model: a new
    release, charged again.
    """
    # A first attempt cannot have submitted (the planner saw no update in the mirror); a retry
    # after a crash may have: ask the contract before training again.
    # (job, round) -> an update waiting for its round to open: the node's memory, as the caches are.
    waiting = ctx.memory.trainer.waiting
    key = (job.job_id, round_)
    if claim.attempts > 1 and chain.participant(ctx, job.job_id).update_round == round_:
        lost = waiting.pop(key, None)  # submitted by an attempt whose answer was lost
        if lost is not None:
            round_privacy.released(state.my_dataset(job, ctx.address), job.job_id, round_, lost.kind)
            round_privacy.spent_with_update(claim)
        return Outcome(True, "update already on chain")
    for _ in range(2):
        trained = (
            waiting.pop(key, None) or _resume(ctx, job, round_) or _train(ctx, job, config, round_, claim)
        )
        try:
            outcome = _publish(ctx, job, round_, claim, trained)
        except Exception:
            # Nothing of it reached the chain (no update, no spend): a store that failed (too few
            # replicas while a peer restarts), a submit that failed (an RPC outage), a database
            # that went away. The retry publishes this same update, under the same reservation,
            # instead of a retrain charged again.
            _keep(ctx, job.job_id, round_, trained)
            raise
        if outcome is not None:
            return outcome
        logger.warning(
            "round %s of job %s opened on another model than the %s this node aggregated; training again",
            round_,
            job.job_id,
            trained.base_hash,
        )
    raise ActionError(f"round {round_} keeps opening on a model other than the one trained on")


_MOVED_ON = "moved on"
_EARLY = "early"  # the round before still aggregates: the update goes in as an early one


def _keep(ctx: NodeContext, job_id: int, round_: int, trained: TrainedUpdate) -> None:
    waiting = ctx.memory.trainer.waiting
    workspace.keep_round(waiting, job_id, round_)
    waiting[(job_id, round_)] = trained


def _publish(
    ctx: NodeContext, job: mirror.Job, round_: int, claim: RoundAction, trained: TrainedUpdate
) -> Outcome | None:
    """Store and submit ``trained``: early while the round before aggregates, or once its round is
    open on the model it was trained on.

    None when the round opened on another model (the update is withheld, the caller trains
    again). An exception means nothing reached the chain: the caller keeps ``trained`` for the
    retry (``key_store.store_own`` reuses what an earlier attempt stored).
    """
    opened = _await_round(ctx, job.job_id, round_)
    if opened is None:
        _keep(ctx, job.job_id, round_, trained)
        return Outcome(False, f"trained on {trained.base_hash[:12]}…; waiting for round {round_} to open")
    dataset = state.my_dataset(job, ctx.address)
    if opened is _MOVED_ON:
        round_privacy.withheld(dataset, job.job_id, round_, trained.kind)
        round_privacy.owe_nothing(claim)
        return Outcome(True, "the round has moved on")
    if opened is not _EARLY and opened != trained.base_hash.removeprefix("0x").lower():
        round_privacy.withheld(dataset, job.job_id, round_, trained.kind)
        return None
    # Sealed and stored only now that it is final; its key stays here until the deadline.
    reference = key_store.store_own(
        ctx,
        job.job_id,
        round_,
        trained.blob,
        trained.content_hash,
        samples=trained.samples,
        base_hash=trained.base_hash,
        kind=trained.kind,
        spend=trained.spend,
    )
    try:
        receipt = chain.submit_update(
            ctx, job.job_id, round_, reference, trained.content_hash, trained.samples, spend=trained.spend
        )
    except ledger_errors.DuplicateUpdate:
        round_privacy.released(dataset, job.job_id, round_, trained.kind)
        round_privacy.spent_with_update(claim)
        return Outcome(True, "update already on chain")
    except ledger_errors.DeadlinePassed:
        round_privacy.withheld(dataset, job.job_id, round_, trained.kind)  # its key is never served
        round_privacy.owe_nothing(claim)
        return Outcome(True, "the update deadline passed before the update was submitted")
    round_privacy.released(dataset, job.job_id, round_, trained.kind)
    round_privacy.spent_with_update(claim)
    encodings.record_sent(ctx.address, job.job_id, round_, trained.choices)
    detail = f"update of {trained.samples} samples submitted"
    if trained.ahead:
        detail += " (trained ahead of the round, on this node's own aggregate)"
    return Outcome(True, detail, receipt.tx_hash, trained.work_seconds)


def _resume(ctx: NodeContext, job: mirror.Job, round_: int) -> TrainedUpdate | None:
    """After a restart: this node's sealed update of the round that an attempt stored but did not
    get on chain (the retry checked that first), whose reservation is still open. It is submitted
    again as it is: a retrain would be a new release, charged a second time. Its key never went
    out (only an update on chain has its key served), so nothing of it was released yet.
    """
    row = key_store.own_unsent(ctx, job.job_id, round_)
    if row is None:
        return None
    if row.kind != "none":
        dataset = state.my_dataset(job, ctx.address)
        still_reserved = PrivacyRelease.objects.filter(
            dataset_id=dataset.pk,
            job=str(job.job_id),
            round=round_,
            kind=row.kind,
            status=PrivacyRelease.Status.RESERVED,
        ).exists()
        if not still_reserved:  # settled meanwhile (withheld): train afresh, as before
            return None
    logger.info("job %s round %s: submitting the sealed update stored before the restart", job.job_id, round_)
    # blob: not needed, the sealed copy is stored and its row names it (key_store.store_own).
    return TrainedUpdate(
        row.base_hash, b"", row.content_hash, row.samples, 0.0, False, row.kind, {}, row.spend
    )


def _await_round(ctx: NodeContext, job_id: int, round_: int) -> str | None:
    """The hash (hex) of the model round ``round_`` opened on; _EARLY while the round before it
    aggregates (an early update is accepted); None if neither comes within the wait."""
    deadline = time.monotonic() + ctx.speculation_wait_s
    while True:
        on_chain = chain.job_state(ctx, job_id)
        if on_chain.round > round_ or on_chain.status != chain.JobStatus.RUNNING:
            return _MOVED_ON
        if on_chain.round == round_:  # open, or already finalized without this node's update
            return on_chain.model_hash.hex() if on_chain.phase == chain.RoundPhase.TRAINING else _MOVED_ON
        if on_chain.round == round_ - 1 and on_chain.phase == chain.RoundPhase.AGGREGATING:
            return _EARLY
        if time.monotonic() >= deadline:
            return None
        time.sleep(AWAIT_POLL_S)


def training_thread(ctx: NodeContext) -> ThreadPoolExecutor:
    """The thread that trains, ``ctx.train_nice`` steps nicer than the rest (see cluster.priority)."""
    return priority.low_priority("train", ctx.train_nice)


def _base_model(ctx: NodeContext, job: mirror.Job, config: JobConfig, round_: int) -> tuple[str, dict, bool]:
    """(hash, state, ahead) of the model the round starts from: fixed on chain, else this node's aggregate."""
    try:
        reference, model_hash = state.base_model(job, round_)
    except ActionError:
        if not job.rounds_set.filter(number=round_ - 1, status=mirror.Round.Status.AGGREGATING).exists():
            raise
        model_hash, data = aggregator.aggregate(ctx, job, config, round_ - 1)
        return model_hash, workspace.remember_model(ctx, model_hash, data)[1], True
    return model_hash, workspace.global_model(ctx, reference, model_hash, config)[1], False


def _train(
    ctx: NodeContext, job: mirror.Job, config: JobConfig, round_: int, claim: RoundAction
) -> TrainedUpdate:
    """Train this node's update for the round: reserve its release, train, encode; publish nothing."""
    with timing.part(timing.PREPARE):
        dataset = state.my_dataset(job, ctx.address)
        train, _ = workspace.local_split(ctx, dataset, config)
        base_hash, global_state, ahead = _base_model(ctx, job, config, round_)
        plan = round_privacy.node_plan(ctx, job, config, dataset)
        index = state.participant_index(job, ctx.address)
        train_config = round_settings(config, round_, index, plan)
        # Adaptive work: this node's AIMD steps for the round, and the release of exactly those.
        train_config, release = adaptive_work.plan_round(ctx.address, job.job_id, config, train_config, plan)
    kind = plan.train.kind if plan.train is not None else "none"
    with timing.part(timing.PRIVACY):
        attempt, spend = _reserve(ctx, (job.job_id, round_), claim, dataset, base_hash, train_config, release)
    if attempt.result is not None:  # trained by an attempt cut after its training: not again
        logger.info("job %s round %s: taking over the update an attempt trained", job.job_id, round_)
        return _encoded(ctx, job, config, dataset, round_, attempt, global_state, ahead, kind, spend)

    attack = get_attack(ctx.attack.split(":")[0]) if ctx.attack else None
    started = time.perf_counter()
    model = training.build_model(config)
    with timing.part(timing.TRAIN):
        # A cluster task (backend.cluster.runner): placed on a slot, retried, cancellable, logged.
        result = cluster_runner.run(
            job.job_id,
            round_,
            _touching_data(attempt, local_round),
            model,
            global_state,
            train,
            train_config,
            num_classes=config.num_classes,
            mechanism=update_mechanism(plan),
            attack=attack,
            attack_seed=train_config.seed,
            kept_rows=training.kept_rows(config, global_state, round_),
            node=ctx.address,
            nice=ctx.train_nice,
            demand=cluster_runner.train_demand(model, train, train_config),
        )
    attempt.result, attempt.work = result, time.perf_counter() - started
    return _encoded(ctx, job, config, dataset, round_, attempt, global_state, ahead, kind, spend)


def _encoded(
    ctx: NodeContext,
    job,
    config,
    dataset,
    round_: int,
    attempt: TrainingAttempt,
    global_state,
    ahead: bool,
    kind: str,
    spend: int,
):
    result = attempt.result
    if result is None:
        raise RuntimeError("an attempt is encoded once its training returned")
    blob, choices = encode_with_policy(result.update, global_state, config.sparse.policy())
    blob = adaptive_work.finish_round(
        ctx.address, job.job_id, config, round_, attempt.train_config, blob, attempt.work
    )
    ctx.memory.trainer.attempts.pop((job.job_id, round_), None)  # the caller keeps the update itself
    # The public planned count, not len(train): the secret split's count is no public value.
    samples = update_samples(config, samples=dataset.num_samples, public_holdout=dataset.public_holdout)
    return TrainedUpdate(
        attempt.base_hash, blob, content_hash(blob), samples, attempt.work, ahead, kind, choices, spend
    )


def _reserve(
    ctx: NodeContext, key: tuple[int, int], claim: RoundAction, dataset, base_hash: str, train_config, release
) -> tuple[TrainingAttempt, int]:
    """(the attempt, the micro-epsilon its submit owes): the cut attempt on the same model when it
    can be taken over (its reservation still open), else a new one, reserved.

    The attempts are the node's memory (``ctx.memory.trainer.attempts``, by (job, round)): after a
    restart nobody knows whether the lost attempt trained, and its reservation is withheld (still
    counted) when the round is reserved again."""
    attempts = ctx.memory.trainer.attempts
    cut = attempts.get(key)
    if cut is not None and cut.base_hash == base_hash:
        if cut.result is not None:  # trained: published under the release it was computed under
            if cut.release is None:
                return cut, 0
            owed = round_privacy.reuse_for_update(
                claim, dataset, key[0], key[1], cut.release, since=cut.since
            )
            if owed is not None:
                return cut, owed
        elif not cut.touched and release is not None:  # nothing computed: this plan, that reservation
            owed = round_privacy.reuse_for_update(claim, dataset, key[0], key[1], release, since=cut.since)
            if owed is not None:
                cut.train_config, cut.release = train_config, release
                return cut, owed
    workspace.keep_round(attempts, *key)
    # Recorded before the reservation: it may be stored and its answer lost.
    attempt = attempts[key] = TrainingAttempt(timezone.now(), base_hash, train_config, release)
    if release is None:
        return attempt, 0
    return attempt, round_privacy.reserve_for_update(claim, dataset, key[0], key[1], release)


def _touching_data(attempt: TrainingAttempt, fn):
    """``fn`` that marks ``attempt`` as having touched the data when it begins, and keeps its result."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        attempt.touched = True
        attempt.result = fn(*args, **kwargs)
        return attempt.result

    return run
