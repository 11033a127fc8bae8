"""The proposer's draw secret goes out once: its start request and its agent share one claim.

The start request reveals the proposer's secret at once; the proposer's agent, ticking on the
start's block, plans the same reveal. Both estimated before either was mined, and both were sent
(the second reverted: tests/faults/test_rpc_outage.py caught it as a duplicate). The request now
reveals through the agent's REVEAL claim (backend.jobs.driver.actions.run_now): whichever takes
the claim first sends, and the other sends nothing.
"""

from __future__ import annotations

import pytest
from jobs_helpers import acting_as, add_dataset, digits_parts, job_request, make_nodes
from web3 import Web3

from backend.jobs.driver import actions, agent
from backend.jobs.driver.planner import Due
from backend.jobs.models import RoundAction

pytestmark = pytest.mark.django_db

REVEAL_SELECTOR = bytes(Web3.keccak(text="revealDrawSecret(uint256,bytes32)")[:4])


def _reveals_sent_by(node) -> int:
    """revealDrawSecret transactions ``node`` sent, mined (reverted ones too), read block by block."""
    w3 = node.ctx.ledger.client.w3
    sent = 0
    for number in range(w3.eth.block_number + 1):
        for tx in w3.eth.get_block(number, full_transactions=True).transactions:
            if (
                tx["from"] == node.ctx.address
                and bytes(tx.get("input", tx.get("data", b"")))[:4] == REVEAL_SELECTOR
            ):
                sent += 1
    return sent


def _open_job(operator_client, monkeypatch, seed: str):
    nodes = make_nodes(3, seed=seed)
    parts = digits_parts(3)
    datasets = [add_dataset(node, monkeypatch, *parts[i], name=f"digits-{i}") for i, node in enumerate(nodes)]
    with acting_as(nodes[0], monkeypatch):
        job_id = operator_client.post(
            "/api/jobs", job_request(datasets[0].pk, committee_size=1, min_trainers=2), format="json"
        ).json()["id"]
    for node, dataset in zip(nodes, datasets, strict=True):
        with acting_as(node, monkeypatch):
            joined = operator_client.post(f"/api/jobs/{job_id}/join", {"dataset": dataset.pk}, format="json")
            assert joined.status_code == 200, joined.content
    return nodes, job_id


def _claim(node, job_id: int) -> RoundAction | None:
    return RoundAction.objects.filter(
        node=node.ctx.address, job_id=job_id, round=0, kind=RoundAction.Kind.REVEAL
    ).first()


def test_the_start_reveals_through_the_agents_claim_and_the_agent_sends_nothing_more(
    operator_client, monkeypatch
):
    nodes, job_id = _open_job(operator_client, monkeypatch, "start-reveal-a")
    proposer = nodes[0]
    with acting_as(proposer, monkeypatch):
        assert operator_client.post(f"/api/jobs/{job_id}/start", {}, format="json").status_code == 200
        claim = _claim(proposer, job_id)
        assert claim is not None and claim.state == RoundAction.State.DONE and claim.tx_hash
        assert proposer.ctx.ledger.fl.get_participant(job_id, proposer.ctx.address).drawn
        agent.tick(proposer.ctx, lambda due: actions.run(proposer.ctx, due))
    assert _reveals_sent_by(proposer) == 1


def test_a_reveal_the_agent_claimed_first_is_not_sent_by_the_start(operator_client, monkeypatch):
    """The agent offered the reveal on the start's block before the request could: the request
    leaves it to the agent, which sends it once."""
    nodes, job_id = _open_job(operator_client, monkeypatch, "start-reveal-b")
    proposer = nodes[0]
    due = Due(job_id, 0, RoundAction.Kind.REVEAL)
    with acting_as(proposer, monkeypatch):
        assert actions.offer(proposer.ctx, due)  # the agent's claim, queued
        assert operator_client.post(f"/api/jobs/{job_id}/start", {}, format="json").status_code == 200
        assert _reveals_sent_by(proposer) == 0
        outcome = actions.run(proposer.ctx, due)  # the agent's worker runs its claim
        assert outcome is not None and outcome.tx_hash
    assert _reveals_sent_by(proposer) == 1
