"""A consortium chain on one machine: one Clique validator per organization, each with its own key.

Each validator is a real Ethereum client, the EthereumJS client (npm ``@ethereumjs/client``,
pinned in package.json) started through ``deploy/validator/clique-validator.mjs``, with its own
data directory, sealing key, devp2p key and JSON-RPC port on loopback. The chain is london (the
client's Clique does not go past the merge): contracts are deployed with ``evm_version="london"``.

    with CliqueNetwork(root, validators=3, block_time=2, funded=[node.address ...]) as chain:
        chain.validators[0].url   # one organization's own RPC endpoint

Startup order. Started together, each sealer seals its own block 1 before it has heard of the
others, and the client does not always leave a fork it sealed itself (the one probe of three
kept one validator on its fork). So the validators join one at a time: the first one is the
in-turn sealer of block 1 and seals it alone (a Clique signer may seal only one block in any
floor(n/2)+1, so it then waits); each next one starts with the validators already running as its
bootnodes and must hold the first one's block 1 before the next starts. One that sealed its own
block 1 instead is stopped, its data wiped and started again (a few tries). ``start`` returns
only once every validator follows one head (the same hash at a common height, and the chain
moved on since). A validator restarted later (``restart``) keeps its data and catches up from
the others.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eth_account.signers.local import LocalAccount
from eth_keys import keys

from devnet.anvil import free_port
from devnet.consortium import dev_account
from devnet.process import REPO_ROOT, stop_process

VALIDATOR_SCRIPT = REPO_ROOT / "deploy" / "validator" / "clique-validator.mjs"
CHAIN_ID = 4242
GAS_LIMIT = 30_000_000
FUNDING_WEI = 10**24


class CliqueError(RuntimeError):
    """A validator did not come up, or the validators did not agree on one chain."""


def clique_genesis(
    *,
    signers: Sequence[str],
    funded: Sequence[str],
    block_time: int,
    chain_id: int = CHAIN_ID,
    gas_limit: int = GAS_LIMIT,
) -> dict:
    """A geth-format genesis for a london Clique chain: ``signers`` seal, ``funded`` have gas money.

    The signers are written into extraData sorted by address (Clique's order: block n's in-turn
    sealer is the (n mod count)-th).
    """
    if block_time < 1:
        raise ValueError("a Clique chain's period (block time) is at least 1 s")
    ordered = sorted(signers, key=lambda a: int(a, 16))
    forks = ["homestead", "eip150", "eip155", "eip158", "byzantium", "constantinople", "petersburg"]
    forks += ["istanbul", "berlin", "london"]
    config: dict = {"chainId": chain_id, **{f"{fork}Block": 0 for fork in forks}}
    config["clique"] = {"period": block_time, "epoch": 30_000}
    return {
        "config": config,
        "nonce": "0x0",
        "timestamp": hex(int(time.time())),
        "extraData": "0x" + "00" * 32 + "".join(a[2:].lower() for a in ordered) + "00" * 65,
        "gasLimit": hex(gas_limit),
        "difficulty": "0x1",
        "mixHash": "0x" + "00" * 32,
        "coinbase": "0x" + "00" * 20,
        "number": "0x0",
        "gasUsed": "0x0",
        "parentHash": "0x" + "00" * 32,
        "baseFeePerGas": hex(10**9),
        "alloc": {address: {"balance": hex(FUNDING_WEI)} for address in funded},
    }


def in_turn_order(signers: Sequence[str]) -> list[str]:
    """The signers in the order they are in turn for blocks 1, 2, 3, ..."""
    ordered = sorted(signers, key=lambda a: int(a, 16))
    return [ordered[n % len(ordered)] for n in range(1, len(ordered) + 1)]


def enode_of(p2p_key: bytes, host: str, port: int) -> str:
    """The devp2p address other validators dial: the key's public key, host and port."""
    public = keys.PrivateKey(p2p_key).public_key.to_bytes().hex()
    return f"enode://{public}@{host}:{port}"


@dataclass
class CliqueValidator:
    """One organization's validator: its sealing key, devp2p key, ports and data directory."""

    data_dir: Path
    genesis: Path
    account: LocalAccount  # seals blocks (a Clique signer of the genesis)
    p2p_key: bytes  # its devp2p identity (the enode's id)
    p2p_port: int = field(default_factory=free_port)
    rpc_port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return self.account.address

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rpc_port}"

    @property
    def enode(self) -> str:
        return enode_of(self.p2p_key, "127.0.0.1", self.p2p_port)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, bootnodes: Sequence[str] = (), *, rejoining: bool = False) -> None:
        """Start the client; ``rejoining``: its data was wiped while the chain ran on, so it
        syncs and never seals a block of a chain's first rotation on its own (the shim's doc, 4)."""
        if self.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        key_file, p2p_file = self.data_dir / "sealer.key", self.data_dir / "p2p.key"
        key_file.write_text(bytes(self.account.key).hex())
        p2p_file.write_text(self.p2p_key.hex())
        args = [
            "node", str(VALIDATOR_SCRIPT),
            "--gethGenesis", str(self.genesis), "--dataDir", str(self.data_dir / "chain"),
            "--port", str(self.p2p_port),
            "--rpc", "--rpcAddr", "127.0.0.1", "--rpcPort", str(self.rpc_port),
            "--unlock", str(key_file), "--mine", "--discDns", "false",
            "--logLevel", "info",
        ]  # fmt: skip
        if bootnodes:
            args += ["--bootnodes", ",".join(bootnodes)]
        log = open(self.data_dir / "validator.log", "ab")  # noqa: SIM115 - owned by the child
        env = {
            "PATH": _path(),
            "CLIQUE_P2P_KEY_FILE": str(p2p_file),
            "NODE_OPTIONS": "--max-old-space-size=1024",
        }
        if rejoining:
            env["CLIQUE_REJOINING"] = "1"
        # cwd is the validator's own directory: anything the client writes beside it stays there,
        # never in the checkout.
        self.process = subprocess.Popen(
            args, cwd=self.data_dir, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()

    def wait_ready(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running:
                raise CliqueError(f"validator {self.address} exited; see {self.data_dir / 'validator.log'}")
            try:
                self.rpc("eth_chainId")
                return
            except OSError:
                time.sleep(0.2)
        raise CliqueError(f"validator {self.address} did not answer on {self.url} within {timeout_s}s")

    def stop(self, timeout_s: float = 20) -> None:
        stop_process(self.process, timeout_s=timeout_s)
        self.process = None

    def kill(self) -> None:
        """A crash: SIGKILL, its data kept."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def wipe(self) -> None:
        shutil.rmtree(self.data_dir / "chain", ignore_errors=True)

    def rpc(self, method: str, params: list | None = None, timeout: float = 10.0):
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}).encode()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
        if "error" in answer:
            raise CliqueError(f"{method}: {answer['error']}")
        return answer["result"]

    def head(self) -> int:
        return int(self.rpc("eth_blockNumber"), 16)

    def block_hash(self, number: int) -> str | None:
        block = self.rpc("eth_getBlockByNumber", [hex(number), False])
        return None if block is None else block["hash"]


@dataclass
class CliqueNetwork:
    """N validators of one london Clique chain on loopback, started in a safe order (module doc)."""

    root: Path
    validators_count: int = 3
    block_time: int = 2
    funded: Sequence[str] = ()
    seed: str = "defl-validator"
    join_tries: int = 4
    fork_patience_s: float = 20.0  # apart from the majority this long: a fork, not a lagging import
    log: Callable[[str], None] = print
    validators: list[CliqueValidator] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [v.url for v in self.validators]

    def start(self) -> CliqueNetwork:
        """Start the validators in the safe order (module doc); on any failure every validator
        started so far is stopped before the error propagates (none is left running)."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> CliqueNetwork:
        self.root = Path(self.root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        accounts = [dev_account(i, self.seed) for i in range(self.validators_count)]
        p2p_keys = [bytes(dev_account(i, self.seed + ":p2p").key) for i in range(self.validators_count)]
        genesis_path = self.root / "genesis.json"
        genesis = clique_genesis(
            signers=[a.address for a in accounts], funded=list(self.funded), block_time=self.block_time
        )
        genesis_path.write_text(json.dumps(genesis, indent=1))
        self.validators = [
            CliqueValidator(self.root / f"validator-{i}", genesis_path, account, p2p_keys[i])
            for i, account in enumerate(accounts)
        ]
        by_address = {v.address: v for v in self.validators}
        order = [by_address[a] for a in in_turn_order(list(by_address))]
        first, started = order[0], [order[0]]
        first.start()
        first.wait_ready()
        self._wait(lambda: first.head() >= 1, f"validator {first.address} sealed no block 1", 60)
        anchor = first.block_hash(1)
        for validator in order[1:]:
            self._join(validator, [v.enode for v in started], anchor)
            started.append(validator)
        self.wait_one_head(heal=True)
        self.log(
            f"chain: {len(self.validators)} Clique validators, block time {self.block_time} s, "
            + ", ".join(v.url for v in self.validators)
        )
        return self

    def _join(self, validator: CliqueValidator, bootnodes: list[str], anchor: str | None) -> None:
        """Start ``validator`` until it holds the anchor block 1 (not a block 1 of its own)."""
        for attempt in range(1, self.join_tries + 1):
            validator.start(bootnodes)
            validator.wait_ready()
            deadline = time.monotonic() + 30 * attempt
            while time.monotonic() < deadline:
                own = validator.block_hash(1) if validator.head() >= 1 else None
                if own == anchor:
                    return
                time.sleep(0.5)
            self.log(f"validator {validator.address} forked at block 1 (try {attempt}); wiping it")
            validator.stop()
            validator.wipe()
        raise CliqueError(f"validator {validator.address} did not join the chain in {self.join_tries} tries")

    def wait_one_head(
        self,
        timeout_s: float = 120,
        validators: Sequence[CliqueValidator] | None = None,
        *,
        heal: bool = False,
    ) -> int:
        """Wait until the (running) validators hold the same block at a common height, and again
        a full rotation later (each had its turn to seal in between, none forked): they follow one
        head. Returns that height.

        ``heal`` (the start): a validator that holds another block than a strict majority of them
        at their common height, for ``fork_patience_s``, sealed a fork of its own, which this
        client never leaves (a lagging in-turn sealer catching up just as the next in line fills
        its turn: two blocks of one height). It is stopped, wiped and rejoins from the majority
        (``_rejoin``), at most ``join_tries`` times in all."""
        members = [v for v in (validators or self.validators) if v.running]
        agreed: list[int] = []
        apart_since: dict[str, float] = {}
        heals = [0]

        def one_head() -> bool:
            height = min(v.head() for v in members)
            held = {v.address: v.block_hash(height) for v in members}
            if len(set(held.values())) != 1:
                agreed.clear()
                if heal:
                    self._heal_forked(members, held, apart_since, heals)
                return False
            apart_since.clear()
            if not agreed:
                agreed.append(height)
            return height >= agreed[0] + len(self.validators)

        self._wait(one_head, "the validators do not follow one head", timeout_s)
        return min(v.head() for v in members)

    def _heal_forked(
        self,
        members: Sequence[CliqueValidator],
        held: dict[str, str | None],
        apart_since: dict[str, float],
        heals: list[int],
    ) -> None:
        """Rejoin each validator apart from a strict majority's block for ``fork_patience_s``."""
        counts = Counter(held.values())
        majority = next((b for b, c in counts.items() if b is not None and 2 * c > len(members)), None)
        if majority is None:
            return  # no side to rejoin to: wait (a fresh chain is the caller's remedy)
        now = time.monotonic()
        for validator in members:
            if held[validator.address] == majority:
                apart_since.pop(validator.address, None)
                continue
            since = apart_since.setdefault(validator.address, now)
            if now - since < self.fork_patience_s:
                continue
            if heals[0] >= self.join_tries:
                return  # they keep forking: the wait runs out and says so
            heals[0] += 1
            apart_since.pop(validator.address, None)
            self._rejoin(validator, [v for v in members if held[v.address] == majority])

    def _rejoin(self, validator: CliqueValidator, sources: Sequence[CliqueValidator]) -> None:
        """Wipe a forked validator and start it again with ``sources`` as its bootnodes; it seals
        nothing of its own before it has heard the live chain announced."""
        self.log(f"validator {validator.address} sealed a fork of its own; wiping it, it rejoins")
        validator.stop()
        validator.wipe()
        validator.start([v.enode for v in sources], rejoining=True)
        validator.wait_ready()

    def restart(self, validator: CliqueValidator) -> None:
        """Start a stopped or killed validator again on its own data, the others as bootnodes."""
        validator.start([v.enode for v in self.validators if v is not validator and v.running])
        validator.wait_ready()

    def stop(self) -> None:
        for validator in self.validators:
            if validator.running and validator.process is not None:
                validator.process.terminate()
        for validator in self.validators:
            validator.stop()

    def __enter__(self) -> CliqueNetwork:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def _wait(condition, message: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except (OSError, CliqueError):
                pass
            time.sleep(0.25)
        raise CliqueError(f"{message} within {timeout_s:.0f}s")


def _path() -> str:
    import os

    return os.environ.get("PATH", "/usr/bin:/bin")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devnet.clique genesis|enode``: the files a consortium's organizations share.

    genesis: the chain's genesis from the validators' sealing keys (their addresses are the
    Clique signers) and the node keys to fund, read from environment variables named on the
    command line (keys never on a command line); written once by the organization that founds
    the consortium and handed to the others with the contracts file.
    enode: an organization's bootnode address (from its devp2p key), for the others' BOOTNODES.
    """
    import argparse
    import os
    import sys

    from eth_account import Account

    parser = argparse.ArgumentParser(prog="python -m devnet.clique", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    genesis = sub.add_parser("genesis", help="write a london Clique genesis")
    genesis.add_argument("--validator-key-env", action="append", required=True, metavar="VAR")
    genesis.add_argument("--fund-key-env", action="append", default=[], metavar="VAR")
    genesis.add_argument("--block-time", type=int, default=2)
    genesis.add_argument("--chain-id", type=int, default=CHAIN_ID)
    genesis.add_argument("--out", type=Path, required=True)
    enode = sub.add_parser("enode", help="print validators' enode addresses, one a line")
    enode.add_argument("--p2p-key-file", type=Path, action="append", required=True, help="repeatable")
    enode.add_argument(
        "--host",
        action="append",
        required=True,
        help="its IPv4 address, one per key (the client dials addresses)",
    )
    enode.add_argument("--port", type=int, default=30303)
    args = parser.parse_args(argv)

    def address_of(variable: str) -> str:
        key = os.environ.get(variable, "")
        if not key:
            parser.exit(2, f"error: {variable} is not set\n")
        try:
            return Account.from_key(key).address
        except (ValueError, TypeError):
            parser.exit(2, f"error: {variable} is not a hex private key\n")

    if args.command == "enode":
        if len(args.p2p_key_file) != len(args.host):
            parser.exit(2, "error: give one --host for each --p2p-key-file\n")
        for key_file, host in zip(args.p2p_key_file, args.host, strict=True):
            print(enode_of(bytes.fromhex(key_file.read_text().strip().removeprefix("0x")), host, args.port))
        return 0
    if args.out.exists():  # a chain's genesis is written once: a new one is another chain
        print(f"{args.out} exists; kept", file=sys.stderr)
        return 0
    try:
        record = clique_genesis(
            signers=[address_of(v) for v in args.validator_key_env],
            funded=[address_of(v) for v in args.fund_key_env],
            block_time=args.block_time,
            chain_id=args.chain_id,
        )
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
