"""The chain's RPC endpoint unreachable for 10 s in the middle of a round (real processes).

Every node reaches anvil through a TCP proxy that cuts all connections and refuses new ones
for 10 s while anvil keeps its state. The nodes retry; the job completes; and no node sends
any once-per-round call twice (counted over every transaction on chain, reverted ones too).
"""

from __future__ import annotations

import pytest
from faultnet import REAL_PROCESS_FAULT_MARKS, ProxiedFederation
from scenarios import ROUNDS, run_rpc_outage

from devnet.localnet import NodeSpec

pytestmark = REAL_PROCESS_FAULT_MARKS


@pytest.fixture(scope="module")
def outage(tmp_path_factory):
    specs = [NodeSpec("org-a"), NodeSpec("org-b"), NodeSpec("org-c")]
    with ProxiedFederation(
        tmp_path_factory.mktemp("faults-rpc"), specs, log=lambda _line: None
    ) as federation:
        yield run_rpc_outage(federation, outage_s=10.0)


def test_the_job_completes_after_the_outage(outage):
    assert outage["job"]["status"] == "finished", outage["job"]
    fixed = {e.args["round"] for e in outage["events"] if e.name == "GlobalModelFixed"}
    finalized = {e.args["round"] for e in outage["events"] if e.name == "RoundFinalized"}
    assert finalized == set(range(1, ROUNDS + 1)), finalized
    assert fixed, "no global model was fixed"


def test_no_transaction_is_sent_twice(outage):
    assert outage["duplicates"] == {}, outage["duplicates"]


def test_the_nodes_resume_sending_after_the_outage(outage):
    assert outage["first_block_after_outage"] is not None
