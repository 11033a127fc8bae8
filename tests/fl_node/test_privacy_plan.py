"""One privacy plan per participant: delta against n, scores that never raise the job's epsilon,
the 2C sensitivity of the update mechanism, and an independent audit of what is recorded."""

import pytest

from fl_node.privacy import PrivacyHistory, ReleasePlan, rdp_epsilon
from fl_node.privacy_audit import UnderstatedEpsilon, assert_claim_holds, audit
from fl_node.privacy_plan import check_delta, max_delta, plan_privacy

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
    lower = ReleasePlan("score_count", plan.score_noise_multiplier * 0.9, 1.0, 4)
    history = PrivacyHistory()
    for _ in range(plan.rounds):
        history.record(**_run(lower))
    assert rdp_epsilon(history, delta=plan.delta) > plan.target_epsilon


def test_public_holdout_and_non_private_jobs_release_exact_scores():
    assert plan_privacy(**SGD, scores_per_round=3, public_holdout=True).score_release(3) is None
    plain = plan_privacy(**{**SGD, "mode": "none", "target_epsilon": None}, scores_per_round=3)
    assert not plain.private and plain.score_release(3) is None


def test_update_mode_accounts_for_the_2c_sensitivity():
    plan = plan_privacy(**{**SGD, "mode": "update"}, clip_norm=0.5, scores_per_round=2)
    assert plan.train.kind == "update_gaussian" and plan.train.sample_rate == 1.0
    # The std the node adds is the plan's multiplier times 2C, and rounds releases hit the target.
    assert plan.update_noise_std == pytest.approx(plan.train.noise_multiplier * 2 * 0.5)
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
    # A claim computed as if the update mechanism's sensitivity were C (the old under-statement).
    half = PrivacyHistory()
    for _ in range(plan.rounds):
        half.record(noise_multiplier=plan.train.noise_multiplier * 2, sample_rate=1.0, steps=1)
    honest = PrivacyHistory()
    for _ in range(plan.rounds):
        honest.record(noise_multiplier=plan.train.noise_multiplier, sample_rate=1.0, steps=1)
    assert not audit(honest, delta=plan.delta, claimed_epsilon=rdp_epsilon(half, delta=plan.delta)).holds


def _run(release):
    return dict(
        noise_multiplier=release.noise_multiplier, sample_rate=release.sample_rate, steps=release.steps
    )
