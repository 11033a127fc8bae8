"""Adaptive local work in the node (backend.jobs.driver.adaptive_work): the job flag, the AIMD
controller kept in the database, the steps an update carries, the privacy charged for the
steps run, and FedNova aggregation of unequal work, with real training through the cluster runner."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.cluster import runner as cluster_runner
from backend.cluster.models import WorkController
from backend.jobs.driver import adaptive_work
from fl_node.aggregate import WeightedUpdate, get_strategy
from fl_node.codec import decode_update, encode_update, update_spec
from fl_node.data import ArrayDataset
from fl_node.job import aggregation, training
from fl_node.job.config import ConfigError, DPConfig, JobConfig
from fl_node.job.limits import MAX_LOCAL_STEPS
from fl_node.job.plan import privacy_plan
from fl_node.local_round import local_round
from fl_node.normalized_average import WorkUpdate, normalized_average, work_norm
from fl_node.privacy import rdp_epsilon
from fl_node.privacy_plan import train_release
from fl_node.train import step_boundary
from tests.builders import job_config

pytestmark = pytest.mark.django_db(transaction=True)

FAST, SLOW = "0x" + "aa" * 20, "0x" + "bb" * 20


def _config(**overrides) -> JobConfig:
    adaptive = dict(
        input_shape=(1, 8, 8),
        num_classes=3,
        rounds=5,
        batch_size=16,
        lr=0.1,
        momentum=0.5,
        round_timeout_s=2,
        adaptive_work=True,
        max_local_steps=40,
    )
    return job_config(**(adaptive | overrides))


def test_the_flag_is_bounded_and_old_configs_keep_their_bytes():
    plain = _config(adaptive_work=False, max_local_steps=0)
    assert b"adaptive_work" not in plain.to_bytes() and b"max_local_steps" not in plain.to_bytes()
    adaptive = _config()
    assert JobConfig.from_bytes(adaptive.to_bytes()) == adaptive
    assert b'"adaptive_work":true' in adaptive.to_bytes() and b'"max_local_steps":40' in adaptive.to_bytes()
    for bad in (0, 3, MAX_LOCAL_STEPS + 1, True, 2.5, "40", None):
        with pytest.raises(ConfigError) as caught:
            _config(max_local_steps=bad)
        assert caught.value.field == "max_local_steps"
    with pytest.raises(ConfigError):
        _config(adaptive_work=False, max_local_steps=40)  # a bound without the flag
    with pytest.raises(ConfigError):
        _config(adaptive_work="yes")
    with pytest.raises(ConfigError) as caught:
        _config(strategy="median")  # FedNova replaces the job's averaging
    assert caught.value.field == "strategy"


def test_the_controller_lives_in_the_database_and_counts_each_round_once():
    config = _config()
    assert adaptive_work.steps_for(FAST, 1, config) == 10  # nominal: a quarter of the bound
    # A quick round (0.1 s of a 1 s target): slow start doubles.
    assert adaptive_work.observe(FAST, 1, config, 1, 10, 0.1) == 20
    assert adaptive_work.observe(FAST, 1, config, 1, 10, 0.1) == 20  # the same round again: no change
    # A "restart": nothing in memory; the next round continues from the row.
    assert adaptive_work.steps_for(FAST, 1, config) == 20
    for round_ in range(2, 8):
        adaptive_work.observe(FAST, 1, config, round_, adaptive_work.steps_for(FAST, 1, config), 0.01)
    assert adaptive_work.steps_for(FAST, 1, config) == 40  # never past max_local_steps
    # A late round (3 s of a 1 s target): multiplicative decrease.
    assert adaptive_work.observe(FAST, 1, config, 8, 40, 3.0) == 32
    row = WorkController.objects.get(node=FAST, job_id=1)
    assert (row.steps, row.last_round, row.last_steps, row.target_seconds) == (32, 8, 40, 1.0)
    # A row edited into nonsense starts over from the nominal work instead of failing the round.
    WorkController.objects.filter(pk=row.pk).update(state={"steps": "many"})
    assert adaptive_work.steps_for(FAST, 1, config) == 10
    # Per node and job.
    assert adaptive_work.steps_for(SLOW, 1, config) == 10 and adaptive_work.steps_for(FAST, 2, config) == 10


def test_the_round_is_charged_for_the_steps_it_runs_within_the_planned_bound():
    config = _config(dp=DPConfig(mode="sgd", target_epsilon=3.0, delta=1e-5))
    plan = privacy_plan(config, num_train=900, num_records=1000, scores_per_round=2)
    assert plan.train.steps == 40  # the noise is calibrated for the most a round may run
    train_config = training.train_config(config, seed=0, plan=plan)
    small, release = adaptive_work.plan_round(FAST, 3, config, train_config, plan)
    assert (
        small.local_steps == release.steps == 10 and release.noise_multiplier == plan.train.noise_multiplier
    )
    for round_ in range(1, 6):
        adaptive_work.observe(FAST, 3, config, round_, adaptive_work.steps_for(FAST, 3, config), 0.01)
    big, more = adaptive_work.plan_round(FAST, 3, config, train_config, plan)
    assert big.local_steps == more.steps == 40
    # More steps are charged more; the bound is the plan's, never exceeded.
    assert rdp_epsilon(_history(more), delta=1e-5) > rdp_epsilon(_history(release), delta=1e-5)
    with pytest.raises(ValueError):
        train_release(plan, 41)
    # The lr cap: past the nominal steps a round trains at a smaller rate.
    assert small.lr == 0.1 and big.lr == pytest.approx(0.1 * work_norm(10, 0.5) / work_norm(40, 0.5))
    # Without the flag: the fixed plan, untouched.
    fixed = _config(adaptive_work=False, max_local_steps=0, dp=config.dp)
    fixed_plan = privacy_plan(fixed, num_train=900, num_records=1000, scores_per_round=2)
    same, release = adaptive_work.plan_round(
        FAST, 3, fixed, training.train_config(fixed, 0, fixed_plan), fixed_plan
    )
    assert release is fixed_plan.train and same == training.train_config(fixed, 0, fixed_plan)


def _history(release):
    from fl_node.privacy import PrivacyHistory

    history = PrivacyHistory()
    history.record(
        noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate, steps=release.steps
    )
    return history


def test_the_step_claim_is_in_the_hashed_bytes_and_bounded_on_read():
    config = _config()
    update = {"w": torch.randn(4, 3), "b": torch.randn(3)}
    blob = encode_update(update)
    tagged = adaptive_work.with_steps(blob, 17)
    assert tagged != blob and adaptive_work.claimed_steps(tagged, config) == 17
    spec = update_spec({"w": torch.zeros(4, 3), "b": torch.zeros(3)})
    for name, value in decode_update(tagged, spec).items():
        assert torch.equal(value, decode_update(blob, spec)[name])  # the tensors are untouched
    # Hostile claims: bounded to [1, max_local_steps]; missing or malformed reads as the nominal.
    assert adaptive_work.claimed_steps(adaptive_work.with_steps(blob, 10**12), config) == 40
    assert adaptive_work.claimed_steps(adaptive_work.with_steps(blob, 0), config) == 1
    assert adaptive_work.claimed_steps(adaptive_work.with_steps(blob, -5), config) == 1
    assert adaptive_work.claimed_steps(blob, config) == 10
    assert adaptive_work.claimed_steps(b"\xff" * 7, config) == 10
    assert adaptive_work.claimed_steps((10**9).to_bytes(8, "little") + b"{}", config) == 10
    # A job without the flag reads no claim, whatever an update says (no failure to aggregate).
    plain = _config(adaptive_work=False, max_local_steps=0)
    assert adaptive_work.claimed_steps(adaptive_work.with_steps(blob, 10**12), plain) == 1
    forged = tagged.replace(b'\\"steps\\":17', b'\\"steps\\":\\"17\\"')
    assert forged != tagged and adaptive_work.claimed_steps(forged, config) == 10


def _shares(parts: int = 2, n: int = 200):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(parts * n, 1, 8, 8)).astype(np.float32)
    y = (x.reshape(len(x), -1)[:, :3].argmax(axis=1)).astype(np.int64)  # a learnable rule
    return [ArrayDataset(x[i * n : (i + 1) * n], y[i * n : (i + 1) * n]) for i in range(parts)]


def test_unequal_nodes_settle_on_unequal_work_and_aggregate_by_fednova():
    """Two nodes train for real through the cluster runner, each timed by a clock of its own that
    every training step advances by that node's step time (the runner's ``clock``): the slow
    node's steps take 0.15 s, the fast one's 0.02 s, whatever the machine's load. Each node's
    controller (in the database) sets its next round's steps from the time it measured against
    the round's target, and the updates carry their steps into FedNova."""
    config = _config(round_timeout_s=4)  # target: 2 s per round; bound 40 steps
    global_state = {k: v.clone() for k, v in training.build_model(config).state_dict().items()}
    spec = update_spec(global_state)
    shares = dict(zip((FAST, SLOW), _shares(), strict=True))
    step_s = {FAST: 0.02, SLOW: 0.15}  # the slow node: 13 steps fit in 2 s; the fast one: the bound
    now = {FAST: 0.0, SLOW: 0.0}

    def pace(node):
        def hook(_step: int) -> None:
            now[node] += step_s[node]

        return hook

    def train_round(node: str, round_: int) -> bytes:
        train_config, _ = adaptive_work.plan_round(
            node, 9, config, training.train_config(config, round_), _no_dp(config)
        )

        def paced(*args, **kwargs):
            with step_boundary(pace(node)):
                return local_round(*args, **kwargs)

        started = now[node]
        result = cluster_runner.run(
            9,
            round_,
            paced,
            training.build_model(config),
            global_state,
            shares[node],
            train_config,
            num_classes=3,
            node=node,
            clock=lambda: now[node],
        )
        blob = encode_update(result.update)
        return adaptive_work.finish_round(node, 9, config, round_, train_config, blob, now[node] - started)

    history = {FAST: [], SLOW: []}
    for round_ in range(1, 6):
        blobs = {node: train_round(node, round_) for node in (FAST, SLOW)}
        for node, blob in blobs.items():
            history[node].append(adaptive_work.claimed_steps(blob, config))
    fast, slow = history[FAST], history[SLOW]
    assert fast[0] == slow[0] == 10  # both start from the nominal work
    # The fast one fills the bound; the slow one what fits in its time (decreased if it ran late).
    assert fast[-1] == 40 and 5 <= slow[-1] <= 13, history
    assert max(slow[1:]) > 10 or min(slow[1:]) < 10, history  # it moved from the nominal work

    # The aggregator's path: the claimed steps from the bytes, FedNova of the decoded updates;
    # it equals fl_node's normalized averaging of the same updates, and is not FedAvg.
    weighted = [WeightedUpdate(decode_update(b, spec), len(shares[n]), n) for n, b in blobs.items()]
    steps = {n: adaptive_work.claimed_steps(b, config) for n, b in blobs.items()}
    aggregated, _ = aggregation.strategy(config, steps).aggregate(global_state, weighted)
    expected = normalized_average(
        global_state,
        [WorkUpdate(w.update, w.num_samples, steps[w.id], w.id) for w in weighted],
        max_steps=40,
        momentum=0.5,
        tau_eff=work_norm(10, 0.5),
        cap_steps=10,
    )
    for name in expected:
        assert torch.equal(aggregated[name], expected[name]), name
    # Not FedAvg weighted by the samples each processed (biased to the node that ran more).
    by_work = [WeightedUpdate(w.update, steps[w.id] * 16, w.id) for w in weighted]
    processed, _ = get_strategy("fedavg").aggregate(global_state, by_work)
    assert any(not torch.equal(aggregated[n], processed[n]) for n in expected)
    again, _ = aggregation.strategy(config, steps).aggregate(global_state, list(reversed(weighted)))
    assert all(torch.equal(again[n], aggregated[n]) for n in expected)  # the same bytes on every member
    fixed = aggregation.strategy(_config(adaptive_work=False, max_local_steps=0), steps)
    assert not isinstance(fixed, aggregation.NormalizedAverage) and fixed.name == "fedavg"


def _no_dp(config: JobConfig):
    return privacy_plan(config, num_train=200, num_records=250, scores_per_round=1)
