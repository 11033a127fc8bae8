"""The consortium chain without nodes: EthereumJS Clique validators (devnet/clique.py, issue 38).

The genesis tool's output is what Clique reads; five validators started in the harness's order
follow one head; a validator on a fork of its own is wiped and rejoins. That three validators run
the contracts' transactions sent to each, go on with one killed and take it back on the same chain
is tests/e2e/test_consortium.py's job, which a federation's nodes drive through the same harness.
"""

from __future__ import annotations

import time

import pytest

from devnet import clique
from devnet.anvil import free_port
from devnet.consortium import dev_account

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
