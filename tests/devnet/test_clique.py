"""The consortium chain without nodes: three EthereumJS Clique validators (devnet/clique.py, issue 38).

Started in the harness's order they follow one head; each runs contract transactions sent to it
(the shim's fixes: without them the client sealed empty blocks only) and every other validator
holds them; one killed, the other two go on; restarted on its data, it catches up on the same
chain. The genesis tool's output is what Clique reads.
"""

from __future__ import annotations

import json
import time

import pytest
from eth_account import Account

from backend.ledger.chains import connect
from backend.ledger.client import ChainClient
from backend.ledger.deployment import Ledger, deploy_contracts
from devnet import clique
from devnet.anvil import free_port
from devnet.consortium import dev_account, overlay_of, public_key

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _wait(condition, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def _settle(validators) -> None:
    """Every validator holds the newest block any of them has now."""
    target = max(v.head() for v in validators)
    _wait(lambda: min(v.head() for v in validators) >= target, f"validators at block {target}")


def test_genesis_lists_the_sorted_signers_and_funds_the_accounts():
    signers = [dev_account(i, "genesis").address for i in range(3)]
    funded = [dev_account(9, "genesis").address]
    genesis = clique.clique_genesis(signers=signers, funded=funded, block_time=2)
    extra = bytes.fromhex(genesis["extraData"][2:])
    listed = ["0x" + extra[32 + 20 * i : 52 + 20 * i].hex() for i in range(3)]
    assert listed == sorted(a.lower() for a in signers) and len(extra) == 32 + 60 + 65
    assert genesis["config"]["clique"]["period"] == 2 and genesis["config"]["londonBlock"] == 0
    assert list(genesis["alloc"]) == funded
    with pytest.raises(ValueError):
        clique.clique_genesis(signers=signers, funded=[], block_time=0)
    assert clique.in_turn_order(signers) == [
        sorted(signers, key=lambda a: int(a, 16))[n % 3] for n in (1, 2, 3)
    ]


def test_validators_run_contracts_follow_one_head_and_a_killed_one_catches_up(tmp_path):
    members = [dev_account(i, "clique-test") for i in range(3)]
    with clique.CliqueNetwork(tmp_path, funded=[m.address for m in members], log=lambda _: None) as network:
        validators = network.validators
        assert json.loads((tmp_path / "genesis.json").read_text())["config"]["chainId"] == clique.CHAIN_ID
        # each member sends through its own validator: the contracts deploy (london) and run
        clients = [ChainClient(connect(v.url), m) for v, m in zip(validators, members, strict=True)]
        deployment = deploy_contracts(clients[0], evm_version="london", allow_small_committees=True)
        ledgers = [Ledger(client, deployment) for client in clients]
        _wait(
            lambda: all(c.has_code(deployment.address("FederatedLearning")) for c in clients),
            "code everywhere",
        )
        for i, ledger in enumerate(ledgers):  # as bootstrap_consortium, each step seen everywhere first
            account = ledger.client.account
            ledger.nodes.register_node(
                f"node-{i}", f"http://c{i}.test", public_key(account), overlay_of(account.address)
            )
            for voter in ledgers[:i]:
                _settle(validators)
                if not ledger.nodes.is_member(ledger.client.address):
                    voter.nodes.vote_admission(ledger.client.address)
        _settle(validators)
        reader = Account.create()
        for validator in validators:  # every validator's chain has what every other one was sent
            view = Ledger(ChainClient(connect(validator.url), reader), deployment)
            _wait(
                lambda view=view: all(view.nodes.is_member(m.address) for m in members), "members everywhere"
            )

        victim, live = validators[2], validators[:2]
        victim.kill()
        down_at = max(v.head() for v in live)
        _wait(lambda: min(v.head() for v in live) >= down_at + 3, "the chain stopped with one validator down")
        network.restart(victim)
        height = network.wait_one_head(timeout_s=300)
        assert height >= down_at + 3
        assert len({v.block_hash(height) for v in validators}) == 1


def test_five_validators_start_and_follow_one_head(tmp_path):
    """A fresh chain of five: each block of the first rotation is sealed by its in-turn validator.
    Clique bars a signer within floor(n/2)+1 blocks, so the sealers of blocks 1 and 2 cannot seal
    block 3, and a validator that joined after them had synced its blocks rather than heard them
    announced: the chain stopped at block 2 until the in-turn sealer of each first-rotation block
    could seal without an announcement."""
    with clique.CliqueNetwork(tmp_path, validators_count=5, log=lambda _: None) as network:
        validators = network.validators
        start = max(v.head() for v in validators)
        assert start >= 5  # start() returned: one head, a whole rotation on
        _wait(lambda: min(v.head() for v in validators) >= start + 5, "a second rotation", timeout_s=60)
        height = network.wait_one_head()
        assert len({v.block_hash(height) for v in validators}) == 1


def test_a_validator_on_a_fork_of_its_own_is_wiped_and_rejoins(tmp_path):
    """The fork this client never leaves, forced: block 1's in-turn sealer is wiped and started
    alone on another port (nobody can dial it), seals a block 1 of its own and waits for a peer.
    The start's one-head wait (heal=True) finds it apart from the majority at their common height,
    wipes it and has it rejoin from them without sealing a first-rotation block of its own: all
    three then follow one head, and its block 1 is theirs."""
    said: list[str] = []
    with clique.CliqueNetwork(tmp_path, log=said.append, fork_patience_s=6) as network:
        by_address = {v.address: v for v in network.validators}
        order = [by_address[a] for a in clique.in_turn_order(list(by_address))]
        forker, others = order[0], order[1:]
        forker.stop()
        forker.wipe()
        forker.p2p_port = free_port()
        forker.start()  # no bootnode: alone, the in-turn sealer of block 1 seals one at once
        forker.wait_ready()
        _wait(lambda: forker.head() >= 1, "the lone validator's block 1", timeout_s=60)
        assert forker.block_hash(1) != others[0].block_hash(1)
        assert not [line for line in said if "rejoins" in line]
        height = network.wait_one_head(heal=True, timeout_s=180)
        assert [line for line in said if forker.address in line and "rejoins" in line]
        assert len({v.block_hash(height) for v in network.validators}) == 1
        assert forker.block_hash(1) == others[0].block_hash(1)
