"""The committee's part of a round: score every update on this node's validation data.

Scores go on chain by commit and reveal (see score_round). The reveal that completes the
committee's set finalizes the round on chain in the same transaction; a separate finalize is
sent only when a deadline ends the scoring.

A malformed update, or one whose bytes do not match the hash on chain, scores 0; it is
never an error (fl_node.score guarantees that for the bytes themselves). Updates are sealed
(backend.jobs.sealed): the committee fetches each sealed blob as it arrives, and its key once the
round's training is over; an update whose key has not arrived by ``key_deadline`` scores 0 too,
so a trainer that withholds its key (or went away) cannot hold the round.

Scores are releases of this node's validation records: unless its dataset declared the
hold-out public, each is a noisy count (``fl_node.score``, noise from a secret stream) and the
round's set of scores is reserved in the dataset's budget before the first one is computed
(one release of ``scores_per_round`` noisy counts, the plan's score noise), its spendPrivacy
awaited before the scores go on chain, and marked released when they do.
"""

from __future__ import annotations

import copy
import os
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from backend.jobs import blobs, chain
from backend.jobs.context import NodeContext
from backend.jobs.driver import privacy as round_privacy
from backend.jobs.driver import state, timing, workspace
from backend.jobs.driver.state import Outcome
from backend.jobs.models import RoundAction
from backend.jobs.sealed import key_gathering, key_release, reader
from backend.ledger import errors as ledger_errors
from backend.ledger import models as mirror
from backend.swarm.errors import SwarmError
from fl_node.codec import CodecError, decode_update, update_spec
from fl_node.job.config import JobConfig
from fl_node.job.scoring import scoring
from fl_node.robust import within_norm_bound
from fl_node.score import BASE_SCORE, member_scores, score_update_int

# The updates scored as they arrived and the round's score release are the node's memory
# (``ctx.memory.committee``: scored, score_spends, by (job, round)). BASE: the key under which
# ``scored`` keeps this member's score of the round's base model.
BASE = ("base", "base")
# A missing key is waited for at most until the first half of the commit window is over (the
# window is the first half of the score period), and at most KEY_WAIT_S after this member saw the
# round's training over: an honest trainer answers a key request within seconds, and a trainer
# that withholds its key must not hold the round for a long score period (it scores 0).
KEY_WAIT_SHARE = 4  # of the score period
KEY_WAIT_S = 60
# Within the action, the keys still missing are asked for again every KEY_ASK_PAUSE_S for KEY_ASK_S
# after this member first saw the training over: a trainer's node serves its key moments after its
# submit, while the agent's next tick may be a whole interval away (no block comes meanwhile).
KEY_ASK_S = 3.0
KEY_ASK_PAUSE_S = 0.2
# The updates read in one pass are scored on up to this many threads, each on its own copy of
# the scratch module: torch's kernels release the interpreter lock, and once the last update is
# in the trainers are idle until the round finalizes, so the cores are the committee's. Only the
# cores torch's own pool leaves idle are worth a thread: with the pool on every core (torch's
# default), a second scoring thread only contends with the first (3 CNN scores of 180 records on
# 2 cores: 21 ms one after another, 29 ms on two threads; 111 vs 118 ms for 1000 records).
SCORE_THREADS = max(1, min(4, (os.cpu_count() or 1) // max(1, torch.get_num_threads())))


def key_deadline(on_chain, training_seen_over: int | None = None) -> int:
    """When the committee stops waiting for keys and scores the keyless updates 0 (contract time).

    ``training_seen_over`` is in seconds: pass it only for a job timed in seconds (see
    keys_still_awaited for one timed in blocks)."""
    commit_deadline = on_chain.score_deadline - on_chain.score_period // 2
    deadline = commit_deadline - on_chain.score_period // KEY_WAIT_SHARE
    if training_seen_over is not None:
        deadline = min(deadline, training_seen_over + KEY_WAIT_S)
    return deadline


def keys_still_awaited(on_chain, now: int, seen_over: int, seen_at: float) -> bool:
    """Whether a missing key is still waited for: before key_deadline, and at most KEY_WAIT_S
    seconds after this member saw the training over. A job timed in blocks counts those seconds
    on this process's clock (``seen_at``, monotonic): a block number plus KEY_WAIT_S would be
    KEY_WAIT_S blocks, minutes on a slow chain."""
    if getattr(on_chain, "use_blocks", False):
        return now < key_deadline(on_chain) and time.monotonic() - seen_at < KEY_WAIT_S
    return now < key_deadline(on_chain, seen_over)


def score_round(
    ctx: NodeContext, job: mirror.Job, config: JobConfig, round_: int, claim: RoundAction
) -> Outcome:
    """Score the round's updates as they arrive; commit to the scores once all are in, and reveal
    them once every member committed (or the commit deadline passed).

    Commit-reveal: no member sees another's scores before it is bound to its own, so the last
    scorer cannot tailor its scores and a lazy member cannot copy. The salt and the exact scores
    committed are kept in the database (ScoreCommitment) before the commitment is sent: a
    restarted node reveals what it committed (noisy scores are never recomputed). If this reveal
    completes the set, the contract finalizes the round in the same transaction (its receipt
    carries RoundFinalized, or JobFailed).

    Scoring an update while the other trainers still train takes it off the round's critical
    path: when the last update arrives only that one is left to score. The scores are kept by
    (trainer, content hash) in the node's memory; a restarted node scores again what it lost.
    """
    on_chain = chain.job_state(ctx, job.job_id)
    if on_chain.round != round_ or on_chain.phase != chain.RoundPhase.TRAINING:
        return Outcome(True, "the round has moved on")
    committed = mirror.ScoreCommitment.objects.filter(
        node=ctx.address, job_id=job.job_id, round=round_
    ).first()
    if committed is not None:
        return _commit_or_reveal(ctx, job, round_, on_chain, committed, claim)
    updates = list(job.updates.filter(round=round_).order_by("index"))
    if len(updates) < on_chain.update_count:
        return Outcome(False, "waiting for the event mirror to catch up with the updates")
    memory = ctx.memory.committee
    workspace.keep_round(memory.scored, job.job_id, round_)
    workspace.keep_round(memory.score_spends, job.job_id, round_)
    known = memory.scored.setdefault((job.job_id, round_), {})
    dataset = state.my_dataset(job, ctx.address)
    now = chain.contract_now(ctx, on_chain)
    over = key_release.training_over(on_chain, round_, now)  # the keys are released
    if over:
        seen_over, seen_at = workspace.training_seen_over(ctx, job.job_id, round_, now)
        _gather_keys(ctx, job.job_id, round_, updates, known, asking_until=seen_at + KEY_ASK_S)
    # Before the training is over this fetches the sealed blobs as they come; after, the keys
    # gathered at once are read with them, and the holders asked for the rest one by one.
    _score_new(ctx, job, config, round_, updates, known, claim, dataset, ask_keys=over)
    RoundAction.objects.filter(pk=claim.pk).update(scored=len(updates))  # the planner's cue
    expected = on_chain.reveal_count - on_chain.committee_size  # the drawn participants train
    if not over:
        return Outcome(
            False, f"fetched {len(updates)} of {expected} sealed updates as they came; waiting for the rest"
        )
    keyless = [u for u in updates if (u.trainer, u.content_hash) not in known]
    if keyless:
        if keys_still_awaited(on_chain, now, seen_over, seen_at):
            return Outcome(False, f"waiting for the keys of {len(keyless)} updates", recheck_s=1.0)
        for update in keyless:  # unreadable: nobody can aggregate it either
            known[(update.trainer, update.content_hash)] = 0
    if scoring(config).relative and BASE not in known:  # read, not scored yet: all scored together
        known.update(_robust_scores(ctx, job, config, round_, known, dataset))
    key = (job.job_id, round_)
    committed, created = mirror.ScoreCommitment.objects.get_or_create(
        node=ctx.address,
        job_id=job.job_id,
        round=round_,
        defaults=dict(
            salt="0x" + secrets.token_hex(32),
            scores=[[u.trainer, known[(u.trainer, u.content_hash)]] for u in updates],
            base_score=known.get(BASE, 0),
        ),
    )
    memory.scored.pop(key, None)
    # A row created just now was never committed (the row is written before the commitment is
    # sent): the contract need not be asked, and the clock read above still serves.
    return _commit_or_reveal(ctx, job, round_, on_chain, committed, claim, now=now if created else None)


def _gather_keys(
    ctx: NodeContext, job_id: int, round_: int, updates, known: dict, *, asking_until: float
) -> None:
    """Ask for the keys of the updates not scored yet, all at once (key_gathering.gather_keys), and again
    for the missing ones until ``asking_until`` (monotonic). The keys got are offered to the reads
    of _score_new, which check them on the blobs (one whose key opens it to other content than its
    hash on chain scores 0 there, at once), and ask the holders themselves for the rest.
    """
    keyless = [u for u in updates if (u.trainer, u.content_hash) not in known]
    while keyless:
        keyless = key_gathering.gather_keys(ctx, job_id, round_, keyless)
        if not keyless or time.monotonic() + KEY_ASK_PAUSE_S > asking_until:
            return
        time.sleep(KEY_ASK_PAUSE_S)


def _commit_or_reveal(
    ctx: NodeContext,
    job: mirror.Job,
    round_: int,
    on_chain,
    committed,
    claim: RoundAction,
    *,
    now: int | None = None,
) -> Outcome:
    """Send the commitment if it is not on chain yet, else the reveal once reveals are open.

    The round's score spend (sent when scoring began) is awaited before the scores are revealed,
    not before the commitment: a commitment hides the scores (a secret 32-byte salt), so it goes
    out while the spend is in flight and both land in one block; the reveal, which publishes the
    scores, waits for the spend's receipt (and the contract refuses it without the spend,
    SpendMissing). Awaiting before the commitment cost every round a block of its own.

    ``now``: the contract's clock, read by the caller for a commitment it has just created (so
    neither sent nor revealed); None asks the contract what this member sent."""
    spend_key = (job.job_id, round_)
    spending = ctx.memory.committee.score_spends.get(spend_key)

    def spend_recorded() -> None:
        """Nothing computed on the data is published before the chain recorded its cost."""
        with timing.part(timing.PRIVACY):
            round_privacy.await_spend(claim, spending)
        ctx.memory.committee.score_spends.pop(spend_key, None)

    scores = {trainer: int(score) for trainer, score in committed.scores}
    salt = bytes.fromhex(committed.salt.removeprefix("0x"))
    commit_round: int | None = None  # the round this member last committed and revealed in
    score_round: int | None = None
    if now is None:
        me = chain.participant(ctx, job.job_id)
        now = chain.contract_now(ctx, on_chain)
        commit_round, score_round = me.commit_round, me.score_round
    commit_deadline = on_chain.score_deadline - on_chain.score_period // 2
    dataset = state.my_dataset(job, ctx.address)
    if commit_round != round_:
        try:
            spend_in_flight = spending is not None and not spending.done()
            if on_chain.commit_count + 1 >= on_chain.committee_size and not spend_in_flight:
                # Every other member is bound already (a committee of one: there is none), so
                # a separate commitment would hide nothing: commit and reveal in one transaction.
                # (With the spend still in flight a plain commitment goes beside it instead: the
                # reveal then comes one block later, as the others' do, not two.)
                spend_recorded()
                receipt = chain.commit_and_reveal_scores(
                    ctx, job.job_id, round_, scores, committed.base_score, salt
                )
                round_privacy.released(dataset, job.job_id, round_, "score_count")
                return _revealed(scores, receipt)
            receipt = chain.commit_scores(ctx, job.job_id, round_, scores, committed.base_score, salt)
        except ledger_errors.ScoringNotOpen:
            return Outcome(False, "scoring is not open yet (updates still due)")
        except ledger_errors.DeadlinePassed:
            return Outcome(True, "the commit deadline passed: this member is absent this round")
        on_chain = chain.job_state(ctx, job.job_id)
        if on_chain.commit_count < on_chain.committee_size:
            return Outcome(
                False, "committed to the scores; revealing once every member committed", receipt.tx_hash
            )
        # the last commitment after all (another member committed meanwhile): reveal at once
    elif score_round == round_:
        return Outcome(True, "scores already revealed")
    if on_chain.commit_count < on_chain.committee_size and now <= commit_deadline:
        return Outcome(False, f"waiting for {on_chain.committee_size - on_chain.commit_count} commitments")
    spend_recorded()
    try:
        receipt = chain.reveal_scores(ctx, job.job_id, round_, scores, committed.base_score, salt)
    except ledger_errors.RevealNotOpen:
        return Outcome(False, "reveals are not open yet")
    except ledger_errors.DuplicateScores:  # sent by an attempt that died before it recorded so
        round_privacy.released(dataset, job.job_id, round_, "score_count")
        return Outcome(True, "scores already on chain")
    except ledger_errors.DeadlinePassed:
        return Outcome(True, "the score deadline passed before the reveal: this member is absent")
    round_privacy.released(dataset, job.job_id, round_, "score_count")
    return _revealed(scores, receipt)


def _revealed(scores: dict[str, int], receipt) -> Outcome:
    """The outcome of the transaction that revealed this member's scores."""
    detail = f"revealed {len(scores)} scores"
    events = {e.name: e for e in receipt.events}
    if "RoundFinalized" in events:  # this reveal completed the set
        detail += "; round finalized with the scores"
    elif "JobFailed" in events:  # completed the set, but too few updates arrived
        failed = events["JobFailed"].args
        detail += (
            f"; job failed with the scores ({failed['updates']} updates, {failed['minTrainers']} needed)"
        )
    return Outcome(True, detail, receipt.tx_hash)


def _score_new(
    ctx: NodeContext,
    job,
    config: JobConfig,
    round_: int,
    updates,
    known: dict,
    claim: RoundAction,
    dataset,
    *,
    ask_keys: bool,
) -> None:
    """Score the updates not scored yet, on this node's validation data (of ``dataset``), into ``known``.

    ``ask_keys``: the round's training is over, so the trainers (and relays) are asked for the keys;
    before that only the sealed blobs are fetched. An update whose key is not here stays unscored.
    """
    new = [u for u in updates if (u.trainer, u.content_hash) not in known]
    if not new and BASE in known:
        return
    with timing.part(timing.PREPARE):
        plan = round_privacy.node_plan(ctx, job, config, dataset)
        round_key = (job.job_id, round_)
        spends = ctx.memory.committee.score_spends
        release = plan.score_release(plan.scores_per_round)
        if release is not None and round_key not in spends:
            # Before the first noisy score of the round: the whole set is one release.
            with timing.part(timing.PRIVACY):
                spends[round_key] = round_privacy.reserve(claim, dataset, job.job_id, round_, release)
        _, val = workspace.local_split(ctx, dataset, config)
        reference, model_hash = state.base_model(job, round_)
        _, global_state, _ = workspace.global_model(ctx, reference, model_hash, config)
        bound = blobs.update_max_bytes(global_state)
        scratch = workspace.scratch_model(ctx, config)
        x_val, y_val = val.tensors()
        records = round_privacy.score_records(config, dataset)

    spec = update_spec(global_state)
    rule = scoring(config)  # the job's scoring (fl_node.job.scoring), the simulator's too

    def decoded(blob: bytes):
        """The update of ``blob``, or None if it is malformed or above the job's norm bound."""
        try:
            update = decode_update(blob, expected=spec)
        except CodecError:
            return None
        return update if within_norm_bound(update, rule.norm_bound) else None

    def score(update, model: torch.nn.Module = scratch) -> int:
        if rule.norm_bound and isinstance(update, bytes):
            update = decoded(update)
            if update is None:
                return 0
        return score_update_int(
            model,
            global_state,
            update,
            x_val,
            y_val,
            metric=rule.metric,
            noise_multiplier=plan.score_noise_multiplier,
            records=records,
        )

    if rule.relative:
        # Read now (the decoded update, None if unusable), scored together once all are read: the
        # clip norm is their median norm (_robust_scores).
        for update in new:
            try:
                blob = reader.read_update(ctx, job.job_id, round_, update, max_bytes=bound, ask=ask_keys)
            except reader.KeyUnavailable:
                continue  # read once its key arrives, or scored 0 at the key deadline (score_round)
            except (blobs.BlobMismatch, SwarmError, ValueError):
                known[(update.trainer, update.content_hash)] = None
                continue
            known[(update.trainer, update.content_hash)] = decoded(blob)
        return
    if BASE not in known:
        # The unchanged global model, scored like an update (a zero one) in the same release:
        # the contract accepts only updates whose median beats the base median by the margin.
        with timing.part(timing.SCORE):
            known[BASE] = score(
                {name: torch.zeros_like(t) for name, t in global_state.items() if t.is_floating_point()}
            )
    read: list[tuple[tuple[str, str], bytes]] = []
    for update in new:
        key = (update.trainer, update.content_hash)
        try:
            blob = reader.read_update(ctx, job.job_id, round_, update, max_bytes=bound, ask=ask_keys)
        except reader.KeyUnavailable:
            continue  # scored once its key arrives, or 0 at the key deadline (score_round)
        except (blobs.BlobMismatch, SwarmError, ValueError):
            known[key] = 0  # unavailable or altered: nobody can aggregate it either
            continue
        read.append((key, blob))
    with timing.part(timing.SCORE):
        scores = score_each([blob for _, blob in read], score, scratch)
    known.update(zip([key for key, _ in read], scores, strict=True))


def score_each(
    items: Sequence, score: Callable[[object, torch.nn.Module], int], scratch: torch.nn.Module
) -> list[int]:
    """``score(item, model)`` of every item, in order, on up to SCORE_THREADS threads: each thread
    scores its share on its own module (``scratch``, or a copy of it: a module is loaded with
    the weights it scores). Every score draws its own noise, so the threads share no state."""
    threads = min(SCORE_THREADS, len(items))
    if threads <= 1:
        return [score(item, scratch) for item in items]
    models = [scratch] + [copy.deepcopy(scratch) for _ in range(threads - 1)]
    with ThreadPoolExecutor(threads, thread_name_prefix="score") as pool:
        shares = [
            pool.submit(lambda m, part: [score(i, m) for i in part], models[t], items[t::threads])
            for t in range(threads)
        ]
        results = [share.result() for share in shares]
    ordered: list[int] = [0] * len(items)
    for t, part in enumerate(results):
        ordered[t::threads] = part
    return ordered


def _robust_scores(ctx: NodeContext, job, config: JobConfig, round_: int, read: dict, dataset) -> dict:
    """Relative scores (the job's scoring rule says so, fl_node.job.scoring) of the round's updates and of the base model, from ``read`` (by
    (trainer, content hash): the decoded update; None or a score of 0 already: unreadable, malformed,
    above the norm bound or keyless, scores 0): :func:`fl_node.score.member_scores`, the simulator's
    scoring, on this node's validation data. Each update at its 1/top_k share, clipped to the median
    norm of the usable ones, relative to the unchanged model, whose score is BASE_SCORE; the noise is
    the plan's, as for absolute scores."""
    updates = {key: value if isinstance(value, dict) else None for key, value in read.items() if key != BASE}
    rule = scoring(config)
    with timing.part(timing.PREPARE):
        plan = round_privacy.node_plan(ctx, job, config, dataset)
        _, val = workspace.local_split(ctx, dataset, config)
        reference, model_hash = state.base_model(job, round_)
        _, global_state, _ = workspace.global_model(ctx, reference, model_hash, config)
        scratch = workspace.scratch_model(ctx, config)
        x_val, y_val = val.tensors()
    with timing.part(timing.SCORE):
        scores = member_scores(
            scratch,
            global_state,
            updates,
            x_val,
            y_val,
            scale=rule.scale,
            norm_bound=rule.norm_bound,
            clip_to_median=rule.clip_to_median,
            metric=rule.metric,
            noise_multiplier=plan.score_noise_multiplier,
            records=round_privacy.score_records(config, dataset),
        )
    return scores | {BASE: BASE_SCORE}


def finalize_round(ctx: NodeContext, job: mirror.Job, round_: int, first_seen: float) -> Outcome:
    """Finalize a round whose score deadline passed with scores missing.

    A round whose scores are all in needs nothing here: the scores that complete the set
    finalize it on chain in the same transaction (see score_round), so the mirror shows it
    aggregating as soon as it shows the last scores. When the deadline ends the scoring
    instead, one node sends the finalize, not every node at once (all but one would revert):
    seat 0 of the committee. Every other node, and a designated one that went away, is a
    fallback: it sends only once ``proposer_fallback_s`` passed since it first saw the round
    finalizable, if the round is still open then.
    """
    if job.rounds_set.filter(number=round_).exclude(status=mirror.Round.Status.TRAINING).exists():
        return Outcome(True, "round finalized already")
    seats = state.seats(job, round_)
    all_scored = len(state.scorers(job.job_id, round_)) >= job.committee_size
    designated = not all_scored and bool(seats) and seats[0] == ctx.address
    waited = time.time() - first_seen
    if not designated and waited < ctx.proposer_fallback_s:
        return Outcome(
            False,
            f"standing by; finalizing after {ctx.proposer_fallback_s:.0f}s if still open",
            recheck_s=ctx.proposer_fallback_s - waited,
        )
    on_chain = chain.job_state(ctx, job.job_id)
    if on_chain.round != round_ or on_chain.phase != chain.RoundPhase.TRAINING:
        return Outcome(True, "another node finalized the round")
    return _send_finalize(ctx, job.job_id, round_)


def _send_finalize(ctx: NodeContext, job_id: int, round_: int) -> Outcome:
    try:
        receipt = chain.finalize(ctx, job_id, round_)
    except ledger_errors.RoundNotFinalizable:
        return Outcome(False, "scores still due")
    except (ledger_errors.WrongPhase, ledger_errors.WrongRound, ledger_errors.JobNotRunning):
        return Outcome(True, "another node finalized the round")
    return Outcome(True, "round finalized", receipt.tx_hash)
