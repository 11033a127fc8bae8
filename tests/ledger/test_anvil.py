"""The ledger against a real anvil process: configured URL, nonces under concurrency, retries."""

from __future__ import annotations

import http.client
import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings
from web3 import HTTPProvider, Web3

from backend.ledger import chains, errors, factory
from backend.ledger.client import ChainClient, RetryPolicy
from backend.ledger.deployment import Ledger, deploy_contracts
from backend.ledger.heads import Head, HeadWatcher
from backend.ledger.resources import JobSpec
from devnet.anvil import AnvilProcess
from devnet.consortium import bootstrap_consortium, dev_account, overlay_of, public_key

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def anvil():
    with AnvilProcess() as process:
        yield process


def _client(url: str, index: int, anvil: AnvilProcess, **kw) -> ChainClient:
    account = dev_account(index, "anvil-tests")
    anvil.fund(account.address)
    return ChainClient(Web3(HTTPProvider(url)), account, **kw)


@pytest.fixture(scope="module")
def deployed(anvil):
    client = _client(anvil.url, 0, anvil)
    ledger = Ledger(client, deploy_contracts(client, allow_small_committees=True))  # a committee of 1 below
    bootstrap_consortium([ledger], ["http://a0.test"])
    return ledger


@pytest.mark.django_db
def test_configured_url_deploy_index_and_typed_errors(anvil, tmp_path):
    key = "0x" + dev_account(50, "anvil-tests").key.hex().removeprefix("0x")
    contracts_file = tmp_path / "contracts.json"
    with override_settings(
        DEFL_CHAIN_URL=anvil.url,
        DEFL_NODE_KEY=key,
        DEFL_CONTRACTS_FILE=str(contracts_file),
        DEFL_LEDGER_LOCK_DIR=str(tmp_path / "locks"),
    ):
        factory.reset()
        try:
            call_command("ledger", "deploy")
            assert set(json.loads(contracts_file.read_text())["contracts"]) == {
                "NodeRegistry",
                "DataRegistry",
                "JobLogic",
                "FederatedLearning",
            }
            ledger = factory.get_ledger()
            # a plain deploy on a real chain is a production one: committees odd and >= 3
            assert ledger.fl.allow_small_committees() is False
            account = ledger.client.account
            ledger.nodes.register_node(
                "me", "http://me.test", public_key(account), overlay_of(account.address)
            )
            with pytest.raises(errors.AlreadyMember) as caught:
                ledger.nodes.register_node(
                    "me", "http://me.test", public_key(account), overlay_of(account.address)
                )
            assert caught.value.args_ == {"account": account.address}
            ledger.data.register_dataset(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, 10, 100)
            with pytest.raises(errors.DuplicateDataset):  # the same records again: refused on chain
                ledger.data.register_dataset(b"\x01" * 32, b"\x09" * 32, b"\x03" * 32, 10, 100)
            call_command("ledger", "index")
            from backend.ledger.models import Dataset, Node

            assert Node.objects.get(address=account.address).status == "member"
            assert Dataset.objects.get(dataset_id=1).owner == account.address
        finally:
            factory.reset()


def test_deadline_in_seconds_after_time_travel(anvil, deployed):
    now = deployed.client.w3.eth.get_block("latest")["timestamp"]
    spec = JobSpec(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, 1, 1, 1, 1, now + 100, 60, 60)
    job = deployed.fl.propose_job(spec)
    deployed.data.register_dataset(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, 10, 100)
    anvil.increase_time(200)
    with pytest.raises(errors.DeadlinePassed):
        deployed.fl.join(job, deployed.data.get_dataset(1).dataset_id)


def test_a_contract_read_is_one_request_and_a_transaction_asks_no_chain_id(anvil, deployed):
    # web3's default validation middleware asked for the chain id twice on every eth_call and
    # eth_estimateGas, so a read was three requests. chains.connect drops it.
    client = ChainClient(chains.connect(anvil.url), deployed.client.account)
    ledger = deployed.for_account(client)
    requests: list[str] = []
    send = client.w3.provider.make_request

    def counted(method, params):
        requests.append(method)
        return send(method, params)

    client.w3.provider.make_request = counted  # type: ignore[method-assign]
    assert ledger.nodes.is_member(client.address)
    assert requests == ["eth_call"]
    ledger.nodes.update_endpoint("http://lean-1.test")  # the first reads the chain id and the fee
    requests.clear()
    ledger.nodes.update_endpoint("http://lean-2.test")
    assert requests == [
        "eth_estimateGas",
        "eth_getTransactionCount",
        "eth_sendRawTransaction",
        "eth_getTransactionReceipt",
    ]
    assert ledger.nodes.get_node(client.address).endpoint == "http://lean-2.test"


def test_threads_of_one_node_never_collide(anvil, deployed):
    client = deployed.client
    start = client.w3.eth.get_transaction_count(client.address)
    failures = []

    def worker(n: int):
        try:
            for i in range(6):
                deployed.nodes.update_endpoint(f"http://t{n}-{i}.test")
        except Exception as exc:  # surfaced below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert client.w3.eth.get_transaction_count(client.address) == start + 24


SENDER = """
import sys
from pathlib import Path
from web3 import HTTPProvider, Web3
from backend.ledger.client import ChainClient
from devnet.consortium import dev_account
from backend.ledger.contracts import NodeRegistry
url, registry, lock, tag = sys.argv[1:]
client = ChainClient(Web3(HTTPProvider(url)), dev_account(0, "anvil-tests"), nonce_lock_path=Path(lock))
nodes = NodeRegistry(registry, client)
for i in range(8):
    nodes.update_endpoint(f"http://{tag}-{i}.test")
"""


def test_processes_of_one_node_never_collide(anvil, deployed, tmp_path):
    client = deployed.client
    start = client.w3.eth.get_transaction_count(client.address)
    lock = tmp_path / "nonce.lock"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SENDER, anvil.url, deployed.nodes.address, str(lock), f"p{n}"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert client.w3.eth.get_transaction_count(client.address) == start + 16


class FlakyProxy:
    """Forwards JSON-RPC to anvil, but drops the first `drop` requests before forwarding and loses
    the answer to the first `lose_send_answers` eth_sendRawTransaction after forwarding them."""

    def __init__(self, upstream_port: int, *, drop: int = 0, lose_send_answers: int = 0):
        self.drop, self.lose = drop, lose_send_answers
        self.sends = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if proxy.drop > 0:
                    proxy.drop -= 1
                    self.close_connection = True
                    return  # no answer: the client sees a dropped connection
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=10)
                conn.request("POST", "/", body, {"Content-Type": "application/json"})
                answer = conn.getresponse().read()
                if b"eth_sendRawTransaction" in body:
                    proxy.sends += 1
                    if proxy.lose > 0:
                        proxy.lose -= 1
                        self.close_connection = True
                        return  # the node has the transaction; the client never hears so
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("drop,lose", [(3, 0), (0, 1), (2, 2)])
def test_retries_never_duplicate_a_transaction(anvil, deployed, drop, lose):
    proxy = FlakyProxy(anvil.port, drop=drop, lose_send_answers=lose)
    try:
        flaky = deployed.for_account(
            ChainClient(
                Web3(HTTPProvider(proxy.url)),
                dev_account(0, "anvil-tests"),
                retry=RetryPolicy(attempts=6, base_delay=0.05),
            )
        )
        start = deployed.client.w3.eth.get_transaction_count(deployed.client.address)
        receipt = flaky.nodes.update_endpoint(f"http://retry-{drop}-{lose}.test")
        assert receipt.status == 1
        assert deployed.client.w3.eth.get_transaction_count(deployed.client.address) == start + 1
        assert proxy.sends == lose + 1  # resent exactly as often as answers were lost
    finally:
        proxy.close()


def test_unreachable_chain_raises_chain_unavailable(anvil):
    client = ChainClient(
        Web3(HTTPProvider("http://127.0.0.1:9")),
        dev_account(0, "x"),
        retry=RetryPolicy(attempts=2, base_delay=0.01),
    )
    with pytest.raises(errors.ChainUnavailable):
        client.block_number()


def test_head_watcher_wakes_on_each_new_block_through_its_subscription(anvil):
    client = _client(anvil.url, 0, anvil)
    heads = HeadWatcher(client, poll=30.0)  # a poll this slow could not see a block in time
    try:
        deadline = time.monotonic() + 10
        while not heads.subscribed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert heads.subscribed, "anvil serves newHeads on its HTTP port"
        heads.wait(0.05)  # the wake-up for whatever came before the subscription
        assert not heads.wait(0.3), "no block, no wake-up"
        for _ in range(3):
            mined = time.monotonic()
            client.w3.provider.make_request("evm_mine", [])
            assert heads.wait(5.0)
            assert time.monotonic() - mined < 0.5
            # the notification carries the header: the tick needs no request for it
            block = client.w3.eth.get_block("latest")
            assert heads.latest == Head(block["number"], block["timestamp"])
    finally:
        heads.close()


def test_head_watcher_polls_where_there_is_no_subscription(anvil):
    proxy = FlakyProxy(anvil.port)  # plain HTTP: the WebSocket handshake fails
    try:
        client = ChainClient(Web3(HTTPProvider(proxy.url)), dev_account(0, "anvil-tests"))
        heads = HeadWatcher(client, poll=0.02)
        time.sleep(0.3)
        assert not heads.subscribed
        assert not heads.wait(0.2)
        client.w3.provider.make_request("evm_mine", [])
        assert heads.wait(2.0)
        assert heads.latest is None  # no header to offer: the tick asks the chain
        heads.close()
    finally:
        proxy.close()
