"""A node whose contracts speak a protocol version it does not speak refuses to run, and says why.

Real processes: an anvil chain with this release's contracts, except FederatedLearning's address
in the node's contracts file, which holds a contract answering version 99. The agent's start
(`manage.py node run`) exits 1 with the reason, and the web server's readiness names the chain.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import requests

from backend.ledger.artifacts import Artifact
from backend.ledger.chains import connect, ensure_funds
from backend.ledger.client import ChainClient
from backend.ledger.deployment import deploy_contracts, save_deployment
from devnet.anvil import AnvilProcess
from devnet.consortium import dev_account
from devnet.process import NodeProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
# Runtime code answering every call with the word 99 (tests/ledger/test_versions.py).
VERSION_99 = bytes.fromhex("69" + "6063600052602060" + "00f3" + "600052600a6016f3")


def test_the_agent_and_readiness_refuse_a_protocol_version_the_node_does_not_speak(tmp_path):
    anvil = AnvilProcess().start()
    node = None
    try:
        w3 = connect(anvil.url)
        deployer = dev_account(0, "protocol-refusal")
        ensure_funds(w3, deployer.address)
        client = ChainClient(w3, deployer)
        deployment = deploy_contracts(client, allow_small_committees=True)
        foreign = client.deploy(Artifact("Version99", [], VERSION_99)).contract_address
        assert foreign is not None
        deployment.addresses["FederatedLearning"] = foreign
        contracts = tmp_path / "contracts.json"
        save_deployment(deployment, contracts)

        node = NodeProcess(
            tmp_path / "node", env={"DEFL_CHAIN_URL": anvil.url, "DEFL_CONTRACTS_FILE": str(contracts)}
        )
        node.migrate()
        agent = subprocess.run(
            [sys.executable, "manage.py", "node", "run", "--once"],
            cwd=ROOT,
            env=node.environ(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert agent.returncode == 1, agent.stdout + agent.stderr
        lines = [line for line in agent.stderr.splitlines() if line.strip()]
        assert lines[-1].startswith(
            "CommandError: cannot start the agent: FederatedLearning speaks protocol version 99"
        )
        assert "docs/OPERATIONS.md" in lines[-1]

        node.start()
        ready = requests.get(f"{node.url}/api/health/ready", timeout=60)
        assert ready.status_code == 503
        body = ready.json()
        assert "chain" in body["not_ready"]
        assert "protocol version 99" in body["checks"]["chain"]["detail"]
    finally:
        if node is not None:
            node.stop()
        anvil.stop()
