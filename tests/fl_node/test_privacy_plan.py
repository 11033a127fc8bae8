"""One privacy plan per participant: delta against n, scores that never raise the job's epsilon,
the 2C distance of the update mechanism, an independent audit of what is recorded (replace-one),
and a participant's epsilon recomputed from its recorded spends alone."""

import pytest

from fl_node.privacy import PrivacyHistory, ReleasePlan, rdp_epsilon
from fl_node.privacy_audit import UnderstatedEpsilon, assert_claim_holds, audit
from fl_node.privacy_plan import (
    SPEND_SCORES,
    SPEND_UPDATE,
    SPEND_WITHHELD,
    check_delta,
    job_epsilon,
    max_delta,
    plan_privacy,
    planned_train_size,
    spend_release,
)

SGD = dict(
    mode="sgd", target_epsilon=3.0, delta=1e-5, rounds=12, num_train=720, num_records=800, batch_size=128
)


def test_delta_must_be_at_most_a_tenth_of_one_over_n():
    assert max_delta(1000) == pytest.approx(1e-4)
    check_delta(1e-4, 1000)
    with pytest.raises(ValueError, match="1/\\(10 n\\)"):
        check_delta(2e-4, 1000)
    with pytest.raises(ValueError, match="too large"):
        plan_privacy(**{**SGD, "delta": 1e-3})


@pytest.mark.parametrize("scores", [1, 4, 9])
def test_no_mix_of_training_and_scoring_rounds_passes_the_target(scores):
    """A member trains or scores each round; whatever the committees, the job stays in budget."""
    plan = plan_privacy(**SGD, scores_per_round=scores)
    for committee_rounds in range(0, plan.rounds + 1, 3):
        history = PrivacyHistory()
        for _ in range(plan.rounds - committee_rounds):
            history.record(**_run(plan.train))
        for _ in range(committee_rounds):
            history.record(**_run(plan.score_release(scores)))
        assert rdp_epsilon(history, delta=plan.delta) <= plan.target_epsilon + 1e-6


def test_score_noise_is_as_small_as_that_allows():
    plan = plan_privacy(**SGD, scores_per_round=4)
    lower = ReleasePlan("score_count", 2 * plan.score_noise_multiplier * 0.9, 1.0, 4)
    history = PrivacyHistory()
    for _ in range(plan.rounds):
        history.record(**_run(lower))
    assert rdp_epsilon(history, delta=plan.delta) > plan.target_epsilon


def test_public_holdout_and_non_private_jobs_release_exact_scores():
    assert plan_privacy(**SGD, scores_per_round=3, public_holdout=True).score_release(3) is None
    plain = plan_privacy(**{**SGD, "mode": "none", "target_epsilon": None}, scores_per_round=3)
    assert not plain.private and plain.score_release(3) is None


def test_update_mode_accounts_for_the_2c_distance():
    plan = plan_privacy(**{**SGD, "mode": "update"}, clip_norm=0.5, scores_per_round=2)
    assert plan.train.kind == "update_gaussian" and plan.train.sample_rate == 1.0
    # The std the node adds is the plan's multiplier times C (the replace-one accountant reads
    # two Gaussians 2C apart), and rounds releases hit the target.
    assert plan.update_noise_std == pytest.approx(plan.train.noise_multiplier * 0.5)
    history = PrivacyHistory()
    for _ in range(plan.rounds):
        history.record(**_run(plan.train))
    assert rdp_epsilon(history, delta=plan.delta) == pytest.approx(3.0, abs=0.01)


def test_the_independent_audit_accepts_honest_claims_and_catches_understated_ones():
    plan = plan_privacy(**SGD, scores_per_round=4)
    history = PrivacyHistory()
    for _ in range(6):
        history.record(**_run(plan.train))
    history.record(**_run(plan.score_release(4)))
    claim = rdp_epsilon(history, delta=plan.delta)
    result = assert_claim_holds(history, delta=plan.delta, claimed_epsilon=claim)
    assert result.pld_epsilon <= claim
    with pytest.raises(UnderstatedEpsilon, match="PLD"):
        assert_claim_holds(history, delta=plan.delta, claimed_epsilon=result.pld_epsilon * 0.9)
    # A claim computed as if neighbouring updates were C apart, not 2C (the old under-statement).
    half = PrivacyHistory()
    for _ in range(plan.rounds):
        half.record(noise_multiplier=plan.train.noise_multiplier * 2, sample_rate=1.0, steps=1)
    honest = PrivacyHistory()
    for _ in range(plan.rounds):
        honest.record(noise_multiplier=plan.train.noise_multiplier, sample_rate=1.0, steps=1)
    assert not audit(honest, delta=plan.delta, claimed_epsilon=rdp_epsilon(half, delta=plan.delta)).holds


def test_an_add_remove_claim_of_replace_one_releases_fails_the_audit():
    """The charge before this adjacency: noise calibrated and charged as if neighbours were one
    record more or less. dp-accounting under REPLACE_ONE shows it under-states the loss."""
    from opacus.accountants.analysis import rdp as add_remove
    from opacus.accountants.utils import get_noise_multiplier

    sigma = get_noise_multiplier(target_epsilon=3.0, target_delta=1e-5, sample_rate=128 / 720, steps=240)
    history = PrivacyHistory()
    history.record(noise_multiplier=sigma, sample_rate=128 / 720, steps=240)
    orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
    claimed = add_remove.get_privacy_spent(
        orders=orders,
        rdp=add_remove.compute_rdp(q=128 / 720, noise_multiplier=sigma, steps=240, orders=orders),
        delta=1e-5,
    )[0]
    assert claimed == pytest.approx(3.0, abs=0.02)
    result = audit(history, delta=1e-5, claimed_epsilon=claimed)
    assert not result.holds and result.pld_epsilon > 4.5


def test_the_plan_follows_from_public_values_only():
    """n (on chain) and the held-out fraction fix the training part's size the plan assumes."""
    assert planned_train_size(800, 0.1) == 720
    assert planned_train_size(800, 0.2) == 640
    assert planned_train_size(1, 0.5) == 1
    with pytest.raises(ValueError):
        planned_train_size(0, 0.1)
    with pytest.raises(ValueError):
        planned_train_size(10, 1.0)


def test_a_participants_epsilon_is_recomputed_from_its_recorded_spends():
    """Training releases (published or withheld) and score rounds, composed on their own at the
    job's delta: what any member computes from the chain's (kind, steps) records."""
    plan = plan_privacy(**SGD, scores_per_round=4)
    steps = plan.train.steps
    spends = [(SPEND_UPDATE, steps)] * 7 + [(SPEND_SCORES, 0)] * 3 + [(SPEND_WITHHELD, steps)]
    history = PrivacyHistory()
    for _ in range(8):
        history.record(**_run(plan.train))
    for _ in range(3):
        history.record(**_run(plan.score_release(4)))
    assert job_epsilon(plan, spends) == pytest.approx(rdp_epsilon(history, delta=plan.delta))
    # Every round training reaches the target; a withheld release on top passes it (it was a release).
    assert job_epsilon(plan, [(SPEND_UPDATE, steps)] * plan.rounds) == pytest.approx(3.0, abs=0.01)
    assert job_epsilon(plan, [(SPEND_UPDATE, steps)] * plan.rounds + [(SPEND_WITHHELD, steps)]) > 3.0
    # Fewer steps cost less; a record naming no steps counts as the plan's most.
    assert spend_release(plan, SPEND_UPDATE, 1).steps == 1
    assert spend_release(plan, SPEND_UPDATE, 0).steps == steps
    with pytest.raises(ValueError, match="kind"):
        spend_release(plan, 3, steps)
    # Public hold-out: scores cost nothing; a job without DP costs nothing.
    public = plan_privacy(**SGD, scores_per_round=4, public_holdout=True)
    assert spend_release(public, SPEND_SCORES, 0) is None
    plain = plan_privacy(**{**SGD, "mode": "none", "target_epsilon": None}, scores_per_round=3)
    assert job_epsilon(plain, [(SPEND_UPDATE, 5)]) == 0.0


def _run(release):
    return dict(
        noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate, steps=release.steps
    )
