"""A content hash counts once per round on chain: a copier's submitUpdate reverts (issue 14)."""

from __future__ import annotations

import pytest

from backend.ledger import errors

REF = b"\x11" * 32


def test_a_copied_content_hash_reverts_and_names_the_first_submitter(fed):
    job, committee, trainers = fed.running_job()
    honest, copier, other = trainers[:3]
    content = b"\x5a" * 32
    receipt = fed.member(honest).fl.submit_update(job, 1, REF, content, 10)
    assert receipt.event("UpdateSubmitted").args["index"] == 0
    with pytest.raises(errors.DuplicateContent) as caught:  # its own reference does not help
        fed.member(copier).fl.submit_update(job, 1, b"\x66" * 32, content, 10)
    assert caught.value.args_ == {"contentHash": "0x" + "5a" * 32, "first": fed.address(honest)}
    # The copier is not recorded: it may still submit an update of its own, and indexes stay dense.
    assert (
        fed.member(copier)
        .fl.submit_update(job, 1, REF, b"\x5b" * 32, 10)
        .event("UpdateSubmitted")
        .args["index"]
        == 1
    )
    assert (
        fed.member(other)
        .fl.submit_update(job, 1, REF, b"\x5c" * 32, 10)
        .event("UpdateSubmitted")
        .args["index"]
        == 2
    )


def test_the_same_content_hash_is_fine_in_another_job(fed):
    first, _, trainers = fed.running_job()
    second, _, trainers_2 = fed.running_job()
    content = b"\x77" * 32
    fed.member(trainers[0]).fl.submit_update(first, 1, REF, content, 10)
    fed.member(trainers_2[1]).fl.submit_update(second, 1, REF, content, 10)
