"""The decentralized round protocol, five node identities on one chain: two rounds end to end.

Each node's agent tick (index, plan, run its due actions) is driven in turn, as five agent
processes would run side by side. Node 4 flips its labels (the DEFL_ATTACK test hook); the
committee's scores must keep its updates out. The API's rounds must equal the chain's events.
"""

from __future__ import annotations

import time

import pytest
from jobs_helpers import acting_as, add_dataset, digits_parts, job_request, make_nodes
from privacy_checks import check_published_figures

from backend.datasets.budget import budget_ledger, compose
from backend.datasets.models import PrivacyRelease
from backend.jobs.driver import actions, agent, aggregator, workspace
from backend.jobs.models import Membership, RoundAction, RoundMetric
from backend.ledger.abi import EventDecoder
from backend.ledger.resources import JobStatus
from backend.serving.models import GlobalModel
from fl_node.committee import _tie_key
from fl_node.job import training
from fl_node.privacy_audit import assert_claim_holds

# Two whole rounds of five nodes with DP training, the draw and every deadline: about 100 s on the
# 2-core machine, so `make test` runs it and `make test-fast` leaves it out.
pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def run_until(nodes, monkeypatch, done, *, limit_s: float = 150.0) -> None:
    """Tick the nodes in turn until ``done()``, asked after every node's tick: the test can stop
    exactly where the protocol got to (a pass over all nodes may finalize a round and fix its
    model too)."""
    deadline = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < deadline, "the federation did not get there in time"
        for node in nodes:
            with acting_as(node, monkeypatch):
                agent.tick(node.ctx, lambda due, node=node: actions.run(node.ctx, due))
            if done():
                return


def chain_rounds(ledger, job_id: int) -> dict[int, dict]:
    """The job's history straight from the chain's logs (not from the indexer's tables)."""
    client = ledger.client
    decoder = EventDecoder()
    logs = client.get_logs([ledger.deployment.address("FederatedLearning")], 0, client.block_number())
    rounds: dict[int, dict] = {}
    for event in filter(None, map(decoder.decode, logs)):
        args = event.args
        if args.get("jobId") != job_id or "round" not in args:
            continue
        r = rounds.setdefault(args["round"], {"updates": {}, "scores": {}, "accepted": None, "model": None})
        if event.name == "UpdateSubmitted":
            r["updates"][args["trainer"]] = (args["contentHash"], args["samples"], event.tx_hash)
        elif event.name == "ScoresSubmitted":
            for trainer, score in zip(args["trainers"], args["scores"], strict=True):
                r["scores"].setdefault(trainer, {})[args["member"]] = score
        elif event.name == "RoundFinalized":
            r["accepted"] = args["accepted"]
            r["medians"] = dict(zip(args["trainers"], args["medians"], strict=True))
            r["seed"] = bytes.fromhex(args["seed"].removeprefix("0x"))
            r["base"] = args["baseMedian"]
            r["next"] = args["nextCommittee"]
        elif event.name == "GlobalModelFixed":
            r["model"] = args["modelHash"]
    return rounds


def mirror_events(node, job_id: int) -> list:
    """The job's FederatedLearning events from the chain's logs, in chain order."""
    ledger = node.ctx.ledger
    decoder = EventDecoder()
    logs = ledger.client.get_logs(
        [ledger.deployment.address("FederatedLearning")], 0, ledger.client.block_number()
    )
    return [e for e in filter(None, map(decoder.decode, logs)) if e.args.get("jobId") == job_id]


def diverging_aggregate(monkeypatch) -> dict:
    """Make the first trainer that trains ahead see a different aggregate than the committee fixes.

    Returns what happened: the victim's address. It sends its update early, trained on that
    aggregate; the committee scores it against the model the round opened on.
    """
    from backend.jobs.driver import state
    from fl_node.codec import content_hash, decode_model, encode_model

    real = aggregator.aggregate
    seen: dict = {}

    def aggregate(ctx, job, config, round_):
        model_hash, data = real(ctx, job, config, round_)
        if ctx.address in state.seats(job, round_ + 1) or seen.get("victim", ctx.address) != ctx.address:
            return model_hash, data
        seen["victim"] = ctx.address
        model, server = decode_model(data)
        model = {k: v + 0.01 if v.is_floating_point() else v for k, v in model.items()}
        forged = encode_model(model, server or None)
        return "0x" + content_hash(forged), forged

    monkeypatch.setattr(aggregator, "aggregate", aggregate)
    return seen


def test_two_rounds_with_a_label_flipping_trainer(operator_client, monkeypatch, caplog):
    nodes = make_nodes(5, seed="jobs-protocol")
    datasets = [
        add_dataset(node, monkeypatch, x, y, name=f"digits-{i}")
        for i, (node, (x, y)) in enumerate(zip(nodes, digits_parts(5), strict=True))
    ]
    with acting_as(nodes[0], monkeypatch):
        job = operator_client.post("/api/jobs", job_request(datasets[0].pk), format="json").json()
    job_id = job["id"]
    for node, dataset in zip(nodes, datasets, strict=True):
        with acting_as(node, monkeypatch):
            response = operator_client.post(
                f"/api/jobs/{job_id}/join", {"dataset": dataset.pk}, format="json"
            )
            assert response.status_code == 200, response.content
    with acting_as(nodes[0], monkeypatch):
        response = operator_client.post(f"/api/jobs/{job_id}/start", {}, format="json")
        assert response.status_code == 200, response.content
    assert response.json()["status"] == "drawing"  # the participants reveal their draw secrets
    fl = nodes[0].ctx.ledger.fl
    run_until(nodes, monkeypatch, lambda: fl.get_job(job_id).status == JobStatus.RUNNING)
    # The contract drew the first committee from the revealed secrets; a node that trains round 1
    # (not drawn) turns label flipper.
    drawn = fl.committee(job_id)
    assert len(set(drawn)) == 2 and set(drawn) <= {node.ctx.address for node in nodes}
    flipper = next(node for node in reversed(nodes) if node.ctx.address not in drawn)
    flipper.ctx = type(flipper.ctx)(**{**flipper.ctx.__dict__, "attack": "label_flip"})

    # Round 1 up to its finalization, then "restart" every node: caches and claims in flight are
    # lost, and the agents catch up from the chain alone.
    run_until(nodes, monkeypatch, lambda: fl.get_job(job_id).phase == 1 or fl.get_job(job_id).round > 1)
    # Each node prepared the job ahead of round 1 (driver/warmup.py: data, model, noise, a dry
    # training step and encoding); a preparation that fails is only logged, so it is asked here.
    prepared = Membership.objects.filter(job_id=job_id).values_list("node", "prepared_at")
    assert len(prepared) == 5 and all(at is not None for _, at in prepared), prepared
    for node in nodes:
        node.ctx.memory.clear()
        actions.release_lost_claims(node.ctx)
    diverged = diverging_aggregate(monkeypatch)
    finished = 3
    # Round 2's trainers tick before its committee, so they train ahead of the fixed model (the
    # committee is elected from noisy scores, so who it is varies from run to run).
    elected = set(chain_rounds(nodes[0].ctx.ledger, job_id)[1]["next"])
    trainers_first = sorted(nodes, key=lambda n: n.ctx.address in elected)
    run_until(
        trainers_first,
        monkeypatch,
        lambda: (
            fl.get_job(job_id).status == finished and RoundMetric.objects.filter(job_id=job_id).count() == 10
        ),
    )

    history = chain_rounds(nodes[0].ctx.ledger, job_id)
    attacker = flipper.ctx.address
    assert sorted(history) == [1, 2]
    seated = {1: set(drawn), 2: set(history[1]["next"])}
    for number, r in history.items():
        # committees are drawn: the flipper trains in every round it was not drawn to score
        assert (attacker in r["updates"]) == (attacker not in seated[number]), f"round {number}"
        assert attacker not in r["accepted"], f"round {number}: the label flipper was accepted"
        # The contract's rule, from the round's public figures: the best top_k (2) of the updates
        # whose median beats the base model's (margin 0). Round 1 starts from an untrained model,
        # so both honest updates beat it by far; in round 2 the base is round 1's average of two
        # noisy models, which a single honest update beats only most of the time (the scores
        # and the training are noised), so the count is not fixed there.
        ranking = sorted(r["medians"], key=lambda t: (-r["medians"][t], _tie_key(r["seed"], t)))
        assert r["accepted"] == [t for t in ranking if r["medians"][t] > r["base"]][:2], r
        assert r["model"] and (number > 1 or len(r["accepted"]) == 2), r

    with acting_as(nodes[0], monkeypatch):
        rounds = operator_client.get(f"/api/jobs/{job_id}/rounds").json()
        status = operator_client.get(f"/api/jobs/{job_id}").json()
    assert status["status"] == "finished" and status["current_round"] == 2
    # Contribution accounting: the label flipper was never accepted, so its share is only what it
    # did on a committee it was drawn to: round 2's committee (scores round 2, votes round 1's model)
    # or the committee elected when round 2 finalized (votes round 2's model; quorum 2 of 2, so both
    # vote). The accepted updates of the chain's history are what the API counts.
    shares = {row["node"]: row for row in status["contributions"]}
    assert shares[attacker]["accepted_updates"] == 0
    committee_work = seated[2] | set(history[2]["next"])
    assert (shares[attacker]["share"] == 0) == (attacker not in committee_work), shares[attacker]
    assert abs(sum(row["share"] for row in shares.values()) - 1) < 1e-4
    assert sum(row["accepted_updates"] for row in shares.values()) == sum(
        len(history[n]["accepted"]) for n in (1, 2)
    )
    assert [r["round"] for r in rounds] == [1, 2]
    for api_round in rounds:
        chain_round = history[api_round["round"]]
        assert api_round["phase"] == "done"
        assert api_round["global_model"]["hash"] == chain_round["model"]
        assert {
            u["trainer"]: (u["content_hash"], u["samples"], u["tx_hash"]) for u in api_round["updates"]
        } == (chain_round["updates"])
        assert {u["trainer"]: u["scores"] for u in api_round["updates"]} == chain_round["scores"]
        assert {u["trainer"]: u["median"] for u in api_round["updates"]} == chain_round["medians"]
        assert [u["trainer"] for u in api_round["updates"] if u["accepted"]] == sorted(
            chain_round["accepted"], key=lambda t: [u["trainer"] for u in api_round["updates"]].index(t)
        )
        # each transaction named by its call (the reveal that finalizes is a reveal, the vote that
        # fixes the model a vote)
        assert {"UpdateSubmitted", "ScoresSubmitted", "GlobalModelVoted"} <= {
            t["name"] for t in api_round["transactions"]
        }
        assert api_round["metrics"]["accuracy"] > 0.3

    # Round 2's committee is the one drawn when round 1 was finalized.
    assert rounds[1]["committee"] == history[1]["next"]
    # Every node served the final model and measured every round; trainers spent privacy, on chain too.
    assert GlobalModel.objects.filter(job=str(job_id)).count() == 2
    assert RoundMetric.objects.filter(job_id=job_id).count() == 10
    data = nodes[0].ctx.ledger.data
    victim = diverged["victim"]
    for node, dataset in zip(nodes, datasets, strict=True):
        epsilon = RoundMetric.objects.get(node=node.ctx.address, job_id=job_id, round=2).epsilon
        releases = PrivacyRelease.objects.filter(dataset_id=dataset.pk, job=str(job_id))
        # Nothing is left reserved; every release is accounted: training rounds and score rounds.
        assert not releases.filter(status=PrivacyRelease.Status.RESERVED).exists()
        kinds = {(r.round, r.kind, r.status) for r in releases}
        assert kinds, node.ctx.address
        # An auditor recomputes the dataset's claim from the recorded releases with Google's
        # dp-accounting (RDP curve and PLD): no claim may be below it.
        ledger = budget_ledger(dataset)
        everything = PrivacyRelease.objects.filter(dataset_id=dataset.pk)  # the count included
        assert_claim_holds(
            compose(everything),
            delta=ledger.delta,
            claimed_epsilon=ledger.spent(),
            adjacency=ledger.adjacency,
        )
        assert releases.order_by("-id").first().epsilon_after == pytest.approx(ledger.spent())
        if node.ctx.address in drawn:  # round 1's committee: its noisy scores were a charged release
            assert (1, "score_count", PrivacyRelease.Status.RELEASED) in kinds, kinds
        if node.ctx.address == victim:
            # It sent its update early, trained on its own (diverging) aggregate: released, charged
            # once, scored by the committee against the model the round opened on.
            assert (2, "dp_sgd", PrivacyRelease.Status.RELEASED) in kinds
        if not releases.filter(status=PrivacyRelease.Status.WITHHELD).exists():
            # A node that lost or discarded nothing spent within the job's target (the
            # "restart" above may have cost some nodes an extra, withheld release).
            assert 0 < epsilon <= 20.0 + 1e-6
        assert data.privacy_spent_by_job(int(dataset.onchain_id), job_id) > 0

    # One finalize per round: the submitScores that completed the set finalized the round on
    # chain; no node sent a finalize of its own (none reverted).
    for number in (1, 2):
        scored = RoundAction.objects.filter(job_id=job_id, round=number, kind=RoundAction.Kind.SCORE)
        assert sum("round finalized" in a.detail for a in scored) == 1, [a.detail for a in scored]
    assert not RoundAction.objects.filter(job_id=job_id, kind=RoundAction.Kind.FINALIZE).exclude(tx_hash="")
    # Every spendPrivacy charged locally reached the chain before the update went out.
    assert not RoundAction.objects.filter(job_id=job_id, privacy_unsent__gt=0).exists()

    # Round 2's trainers did not wait for its model to be fixed: they trained on their own
    # aggregate of round 1 and sent their updates early, while round 1 still aggregated, so the
    # vote that fixed round 1's model opened round 2 with its updates in.
    trained = RoundAction.objects.filter(job_id=job_id, round=2, kind=RoundAction.Kind.TRAIN)
    ahead = {a.node for a in trained if "trained ahead of the round" in a.detail}
    assert ahead and victim in ahead and victim in history[2]["updates"], [a.detail for a in trained]
    logs = mirror_events(nodes[0], job_id)
    early = [e for e in logs if e.name == "UpdateSubmitted" and e.args["round"] == 2]
    fixed_1 = next(e for e in logs if e.name == "GlobalModelFixed" and e.args["round"] == 1)
    assert any((e.block_number, e.log_index) < (fixed_1.block_number, fixed_1.log_index) for e in early)

    # Idempotent: more ticks find nothing to do, and no action ran twice.
    before = RoundAction.objects.count()
    for node in nodes:
        with acting_as(node, monkeypatch):
            assert agent.tick(node.ctx, lambda due: pytest.fail(f"{due} offered again")) == []
    assert RoundAction.objects.count() == before
    assert not RoundAction.objects.exclude(state=RoundAction.State.DONE).exists()

    # Every member shows each participant's own epsilon in the job, recomputed from the chain's
    # records, equal to that participant's own records; the victim's discarded speculative update
    # is on chain as a withheld release.
    check_published_figures(nodes, datasets, job_id, operator_client, monkeypatch, withheld_by=[])

    curious_member_replays_an_update(nodes, job_id, history, attacker, monkeypatch)


def curious_member_replays_an_update(nodes, job_id, history, attacker, monkeypatch) -> None:
    """Attack class: regenerating a node's DP noise from public values (config seed, round, index).

    The curious member has everything public (the config in the swarm, the chain, the update blob)
    and, beyond that, the victim's own training data. It replays the victim's round 2 with the
    randomness it can derive from public values: the residual stays at least at the noise's own
    scale, so subtracting the replay does not strip the noise.
    """
    import math

    import torch

    from backend.jobs import blobs
    from backend.jobs.discovery import config_of, job_record
    from backend.jobs.driver import state
    from backend.jobs.driver.privacy import node_plan
    from backend.jobs.sealed import reader
    from backend.ledger import models as mirror
    from fl_node.codec import decode_update, update_spec
    from fl_node.local_round import local_round
    from fl_node.secure_random import TorchRandom

    victim = next(n for n in nodes if n.ctx.address in history[2]["updates"] and n.ctx.address != attacker)
    with acting_as(victim, monkeypatch):
        job = mirror.Job.objects.get(job_id=job_id)
        config = config_of(job_record(victim.ctx, job_id))
        dataset = state.my_dataset(job, victim.ctx.address)
        train, _ = workspace.local_split(victim.ctx, dataset, config)
        reference, model_hash = state.base_model(job, 2)
        _, base, _ = workspace.global_model(victim.ctx, reference, model_hash, config)
        update = job.updates.get(round=2, trainer=victim.ctx.address)
        # Sealed (backend.jobs.sealed): readable once the round's training is over, with its key.
        opened = reader.read_update(victim.ctx, job_id, 2, update, max_bytes=blobs.update_max_bytes(base))
        released = decode_update(opened, expected=update_spec(base))
        plan = node_plan(victim.ctx, job, config, dataset)
    seed = training.round_seed(config, 2, state.participant_index(job, victim.ctx.address))
    replay = local_round(
        training.build_model(config),
        base,
        train,
        training.train_config(config, seed, plan),
        num_classes=config.num_classes,
        randomness=TorchRandom(torch.Generator().manual_seed(seed)),
    ).update
    residual = math.sqrt(sum(float((released[k] - replay[k]).double().pow(2).sum()) for k in replay))
    params = sum(v.numel() for v in replay.values())
    steps = plan.train.steps
    # The noise alone: each step adds lr * sigma * C / batch per coordinate (momentum only adds).
    noise_floor = config.lr * plan.train.noise_multiplier * config.dp.max_grad_norm / config.batch_size
    noise_floor *= math.sqrt(params * steps)
    assert residual > 0.5 * noise_floor, (residual, noise_floor)
