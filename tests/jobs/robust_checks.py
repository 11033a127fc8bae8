"""What a robust job's round must be on every honest node: the simulator's functions on the same blobs.

A job with ``robust`` set scores and aggregates as fl_node.simulate does (issue 14): each committee
member's scores are fl_node.score.member_scores of the round's updates on its own validation split
(base score BASE_SCORE), and the fixed model is fl_node.robust.defended_aggregate of the accepted
updates with the votes and the clip norm of the round's submissions. These checks recompute both
from the blobs with those functions, apart from the node's driver code, and compare them with the
chain.
"""

from __future__ import annotations

from jobs_helpers import CLASSES, acting_as, npz_bytes

from backend.jobs import blobs
from backend.jobs.driver import state, workspace
from backend.jobs.sealed import reader as sealed_reader
from backend.ledger import models as mirror
from fl_node.aggregate import WeightedUpdate, get_strategy
from fl_node.codec import content_hash, decode_update, encode_model, update_spec
from fl_node.job import aggregation, training
from fl_node.job.plan import update_samples
from fl_node.robust import (
    aggregation_clip_norm,
    defended_aggregate,
    update_norm,
    vote_roles,
    vote_signs,
)
from fl_node.score import BASE_SCORE, member_scores


def add_public_dataset(node, monkeypatch, x, y, *, name: str, epsilon_cap: float = 50.0):
    """jobs_helpers.add_dataset with its hold-out declared public: exact scores, nothing charged, so
    the revealed scores can be recomputed."""
    from backend.datasets import services

    upload = services.Upload(
        name=name,
        format="npz",
        data=npz_bytes(x, y),
        epsilon_cap=epsilon_cap,
        delta=1e-5,
        classes=CLASSES,
        public_holdout=True,
        disjoint=True,  # another simulated node's data: a provider of its own (jobs_helpers.add_dataset)
    )
    with acting_as(node, monkeypatch):
        return services.create_dataset(upload)


def check_robust_round(nodes, monkeypatch, job_id: int, round_: int, config) -> dict:
    """Assert that every honest scorer's revealed scores and the fixed model of ``round_`` are the
    simulator's functions of the round's blobs; returns what was compared (for the caller's checks)."""
    reader = nodes[0]
    with acting_as(reader, monkeypatch):
        job = mirror.Job.objects.get(job_id=job_id)
        reference, model_hash = state.base_model(job, round_)
        _, global_state, server_state = workspace.global_model(reader.ctx, reference, model_hash, config)
        spec = update_spec(global_state)
        rows = list(job.updates.filter(round=round_).order_by("index"))
        bound = blobs.update_max_bytes(global_state)
        updates = {
            row.trainer: decode_update(
                sealed_reader.read_update(reader.ctx, job_id, round_, row, max_bytes=bound), spec
            )
            for row in rows
        }
    # Scores: each member's, on its own validation split, with the simulator's scoring.
    revealed = mirror.ChainEvent.objects.filter(
        contract="FederatedLearning", name="ScoresSubmitted", args__jobId=job_id, args__round=round_
    )
    by_member = {e.args["member"].lower(): e.args for e in revealed}
    assert by_member, "no scores were revealed"
    compared = 0
    for node in nodes:
        args = by_member.get(node.ctx.address.lower())
        if args is None:
            continue
        assert args["baseScore"] == BASE_SCORE  # relative scores: the base model at BASE_SCORE
        with acting_as(node, monkeypatch):
            _, val = workspace.local_split(node.ctx, state.my_dataset(job, node.ctx.address), config)
        x_val, y_val = val.tensors()
        expected = member_scores(
            training.build_model(config),
            global_state,
            updates,
            x_val,
            y_val,
            scale=1 / config.top_k,
            norm_bound=config.norm_bound or None,
            metric=config.score_metric,
        )
        got = dict(zip(args["trainers"], args["scores"], strict=True))
        assert got == {t: expected[t] for t in got}, (node.ctx.address, got, expected)
        compared += 1
    # The fixed model: the defended aggregate of the accepted updates.
    round_row = job.rounds_set.get(number=round_)
    medians = {row.trainer: int(row.median or 0) for row in rows}
    scored = set(
        mirror.Score.objects.filter(job=job, round=round_, score__gt=0).values_list("trainer", flat=True)
    )
    candidates = [row.trainer for row in rows if row.trainer in scored]
    voting, witnessing = vote_roles(
        candidates, medians, base_median=int(round_row.base_median or 0), margin=int(job.margin)
    )
    accepted = list(job.accepted.filter(round=round_).order_by("position").values_list("trainer", flat=True))
    samples = {row.trainer: int(row.samples) for row in rows}
    # Each update names its trainer's public planned count (from its registered size), never the
    # count of its secret split, which differs between neighbouring datasets (fl_node.job.plan).
    named_by = {trainer.lower(): named for trainer, named in samples.items()}
    checked = 0
    for node in nodes:
        named = named_by.get(node.ctx.address.lower())
        if named is None:
            continue
        with acting_as(node, monkeypatch):
            dataset = state.my_dataset(job, node.ctx.address)
            train, _ = workspace.local_split(node.ctx, dataset, config)
        planned = update_samples(config, samples=dataset.num_samples, public_holdout=dataset.public_holdout)
        assert named == planned, (node.ctx.address, named, planned, len(train))
        checked += 1
    assert checked, "no update of these nodes to check"
    hashes = {row.trainer: row.content_hash for row in rows}
    weighted = [WeightedUpdate(updates[t], samples[t], hashes[t]) for t in accepted]
    defense = aggregation.round_defense(config)  # the job's, as every member's aggregator
    assert defense.clip_to_median and defense.sign_vote == "zero" and defense.verified_step
    strategy = get_strategy(config.strategy, **config.strategy_params)
    new_state, new_server = defended_aggregate(
        strategy,
        global_state,
        weighted,
        defense=defense,
        server_state=server_state or None,
        clip_norm=aggregation_clip_norm(
            [update_norm(updates[t]) for t in voting], [update_norm(updates[t]) for t in witnessing]
        ),
        voters=[v for v in (vote_signs(updates[t]) for t in voting) if v is not None],
        witnesses=[v for v in (vote_signs(updates[t]) for t in witnessing) if v is not None],
        backers=[updates[t] for t in (*voting, *witnessing)] if defense.backed_magnitude else [],
    )
    expected_hash = "0x" + content_hash(encode_model(new_state, new_server or None))
    fixed = job.global_models.get(round=round_)
    assert fixed.model_hash == expected_hash
    plain_state, plain_server = strategy.aggregate(global_state, weighted, server_state or None)
    plain_hash = "0x" + content_hash(encode_model(plain_state, plain_server or None))
    return {
        "scorers": compared,
        "accepted": accepted,
        "plain_hash": plain_hash,
        "fixed_hash": fixed.model_hash,
    }
