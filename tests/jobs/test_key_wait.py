"""The committee's wait for a withheld key is bounded by the score period AND by KEY_WAIT_S."""

from __future__ import annotations

import time
from types import SimpleNamespace

from backend.jobs.driver.committee import KEY_WAIT_S, key_deadline, keys_still_awaited


def test_a_withheld_key_holds_the_round_at_most_key_wait_s_past_the_training():
    # a long score period: the quarter rule alone would wait 15 minutes past the update deadline
    on_chain = SimpleNamespace(score_deadline=10_000 + 3_600, score_period=3_600)
    assert key_deadline(on_chain) == 10_000 + 900
    # training seen over early (every update in at t=2000): the wait ends KEY_WAIT_S later
    assert key_deadline(on_chain, 2_000) == 2_000 + KEY_WAIT_S
    # seen over late: the score period's own bound still wins
    assert key_deadline(on_chain, 10_890) == 10_000 + 900


def test_a_job_timed_in_blocks_waits_key_wait_s_seconds_not_blocks():
    # score period of 3,600 blocks; the training was seen over at block 2,000
    on_chain = SimpleNamespace(score_deadline=10_000 + 3_600, score_period=3_600, use_blocks=True)
    just_seen = time.monotonic()
    assert keys_still_awaited(on_chain, 2_000 + KEY_WAIT_S + 5, 2_000, just_seen)  # blocks past: still waits
    long_ago = just_seen - KEY_WAIT_S - 1
    assert not keys_still_awaited(on_chain, 2_001, 2_000, long_ago)  # KEY_WAIT_S seconds passed
    assert not keys_still_awaited(on_chain, 10_900, 2_000, just_seen)  # the score period's bound
    # timed in seconds: the contract's clock, as before
    timed = SimpleNamespace(score_deadline=10_000 + 3_600, score_period=3_600, use_blocks=False)
    assert keys_still_awaited(timed, 2_000 + KEY_WAIT_S - 1, 2_000, long_ago)
    assert not keys_still_awaited(timed, 2_000 + KEY_WAIT_S, 2_000, just_seen)
