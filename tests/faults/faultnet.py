"""Faults for a LocalFederation (devnet/localnet.py): kill a node, bring it back, read the chain.

Kept beside the fault tests and bench/faults.py rather than in localnet.py: a fault is
something a test does to a federation, not part of running one.

``sent_transactions`` reads every transaction on the chain (not only the events of the ones
that succeeded), decodes its call with the contracts' ABIs, and keys it by sender, function,
job and round: a key sent twice is a duplicate (a retry that did not know its first try went
through), whether or not the second one reverted.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from web3 import HTTPProvider, Web3

from backend.ledger.abi import EventDecoder
from devnet.localnet import LocalFederation, LocalNode
from devnet.process import REPO_ROOT

# The marks of a test that runs a job on real node processes with a fault injected: minutes on a
# quiet machine, far more on a loaded one (the default 900 s was passed in node start-up alone
# under load 20).
REAL_PROCESS_FAULT_MARKS = [
    pytest.mark.e2e,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(3600),
]

ARTIFACTS = Path(REPO_ROOT) / "contracts" / "artifacts"
# Calls a round needs at most once per (sender, job, round): sending one twice is a duplicate.
ONCE_PER_ROUND = {
    "submitUpdate",
    "commitScores",
    "revealScores",
    "commitAndRevealScores",
    "skipAggregation",
    "finalizeRound",
    "voteGlobalModel",
    # once per job (no round): the draw secret committed at join, and the draw after its deadline
    "revealDrawSecret",
    "drawCommittee",
}
# Calls a round may take several of, each about something else: a duplicate is the same one again.
# spendPrivacy records one release (its amount); a node may record several in a round (a training
# release it withheld, then the one it submitted), never the same release twice.
SAME_ARGUMENTS_ONCE = {"spendPrivacy"}


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux /proc), e.g. a gunicorn master's workers."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass  # the task ended meanwhile
    return found


def kill_node(node: LocalNode) -> None:
    """SIGKILL every process of the node (agent, worker, web server and its workers): a crash.

    The web server's workers first: killed alone, the master leaves a worker holding the port
    and answering /api/health, so a "restarted" node would still be the old one.
    """
    for process in (node.agent, node.worker):
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
    node.agent = node.worker = None
    web = node.web.process
    if web is not None and web.poll() is None:
        web.send_signal(signal.SIGSTOP)  # no new worker is forked while its workers are killed
        for worker in _children(web.pid):
            try:
                os.kill(worker, signal.SIGKILL)
            except ProcessLookupError:
                pass
    node.web.kill()
    try:
        requests.get(f"{node.web.url}/api/health", timeout=2)
    except requests.RequestException:
        return  # nothing of the node answers: it is down
    raise AssertionError(f"killed node {node.spec.name} still answers /api/health: a process of it survived")


def restart_node(node: LocalNode, *, wait_s: float = 180) -> None:
    """The same node again: same data directory, database, key and chunk store."""
    node.web.start(wait=True, wait_s=wait_s)
    node.start_agent()
    if node.spec.celery:
        node.start_worker()


def chain(federation: LocalFederation) -> Web3:
    return Web3(HTTPProvider(federation.anvil.url, request_kwargs={"timeout": 60}))


def events(federation: LocalFederation, job_id: int | None = None) -> list:
    w3 = chain(federation)
    decoder = EventDecoder()
    logs = w3.eth.get_logs({"fromBlock": 0, "toBlock": "latest"})
    decoded = [e for e in (decoder.decode(log) for log in logs) if e is not None]
    if job_id is None:
        return decoded
    return [e for e in decoded if int(e.args.get("jobId", -1)) == int(job_id)]


@dataclass(frozen=True)
class SentCall:
    sender: str
    function: str
    job: int | None
    round: int | None
    status: int  # 1 succeeded, 0 reverted
    # What the call is about beyond its round (spendPrivacy: its amount).
    subject: tuple = ()


def _contracts(w3: Web3) -> list:
    return [
        w3.eth.contract(abi=json.loads(path.read_text())["abi"])
        for path in sorted(ARTIFACTS.glob("*.json"))
        if path.stem != "CommitteeRuleHarness"
    ]


def sent_transactions(federation: LocalFederation) -> list[SentCall]:
    w3 = chain(federation)
    contracts = _contracts(w3)
    calls = []
    for number in range(w3.eth.block_number + 1):
        for tx in w3.eth.get_block(number, full_transactions=True).transactions:
            if not tx.get("to"):
                continue  # a deployment
            for contract in contracts:
                try:
                    function, args = contract.decode_function_input(tx["input"])
                except ValueError:
                    continue
                status = w3.eth.get_transaction_receipt(tx["hash"])["status"]
                job = args.get("jobId")
                round_ = args.get("round")
                subject = tuple(sorted(str(t).lower() for t in args.get("trainers", ())))
                if function.fn_name in SAME_ARGUMENTS_ONCE:
                    subject = (int(args.get("amount", 0)),)
                calls.append(
                    SentCall(
                        tx["from"].lower(),
                        function.fn_name,
                        None if job is None else int(job),
                        None if round_ is None else int(round_),
                        int(status),
                        subject,
                    )
                )
                break
    return calls


def duplicates(calls: list[SentCall]) -> dict[tuple, int]:
    """(sender, function, job, round, ...) sent more than once, among the once-per-round calls
    (a member commits and reveals its scores once a round); for spendPrivacy, the same release
    (amount) recorded twice."""
    counts: Counter = Counter()
    for c in calls:
        if c.function in ONCE_PER_ROUND:
            counts[(c.sender, c.function, c.job, c.round)] += 1
        elif c.function in SAME_ARGUMENTS_ONCE:
            counts[(c.sender, c.function, c.job, c.round, *c.subject)] += 1
    return {key: n for key, n in counts.items() if n > 1}


# ----------------------------------------------------------------------------- a chain outage


class TcpProxy:
    """A TCP forwarder between the nodes and anvil that can go dark for a while.

    During an outage every open connection is cut and new ones are accepted and closed at
    once (connection reset), as when an RPC endpoint's host drops off the network; anvil
    itself keeps running, so the chain's state is kept.
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        import socket
        import threading

        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dark = threading.Event()
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set = set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        import socket
        import threading

        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.dark.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source, sink) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                self._close(sock)

    def _close(self, sock) -> None:
        import socket

        with self._lock:
            self._sockets.discard(sock)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def outage(self, seconds: float) -> None:
        """Go dark for ``seconds`` (blocking), cutting every open connection."""
        self.go_dark()
        time.sleep(seconds)
        self.come_back()

    def go_dark(self) -> None:
        """Cut every open connection and refuse new ones until ``come_back``."""
        self.dark.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            self._close(sock)

    def come_back(self) -> None:
        self.dark.clear()

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            self._close(sock)


class ProxiedFederation(LocalFederation):
    """A LocalFederation whose nodes reach anvil only through a TcpProxy (``self.proxy``)."""

    proxy: TcpProxy | None = None

    def _start_chain(self) -> list[str]:
        """The anvil started, and every node's chain endpoint the proxy in front of it (the
        federation sets each node's DEFL_CHAIN_URL from what this returns)."""
        from urllib.parse import urlparse

        urls = super()._start_chain()
        assert self.anvil is not None, "a proxied federation runs on anvil"
        parsed = urlparse(self.anvil.url)
        self.proxy = TcpProxy(parsed.hostname or "127.0.0.1", int(parsed.port or 8545))
        return [self.proxy.url] * len(urls)

    def stop(self) -> None:
        super().stop()
        if self.proxy is not None:
            self.proxy.close()
