"""In-process stand-ins for swarm tests: a recording sink and networks of local stores."""

from __future__ import annotations

from pathlib import Path

from eth_account import Account

from backend.swarm.client import LocalTransport
from backend.swarm.network import Network, Node
from backend.swarm.peers import Peer
from backend.swarm.store import ChunkStore


class ListSink:
    def __init__(self) -> None:
        self.chunks: dict[bytes, bytes] = {}

    def put(self, address: bytes, data: bytes) -> None:
        self.chunks[address] = data

    def get_many(self, addresses):
        for address in addresses:
            yield self.chunks[address]


def local_network(tmp: Path, count: int, *, replication: int = 3) -> tuple[Network, list[ChunkStore]]:
    """``count`` nodes, each a store on disk behind a LocalTransport; node 0 is "this" node."""
    stores, nodes = [], []
    for i in range(count):
        store = ChunkStore(tmp / f"node{i}", fsync=False)
        stores.append(store)
        nodes.append(Node(Peer(Account.create().address, ""), LocalTransport(store), local=i == 0))
    return Network(nodes, replication=replication, threads=4), stores


def operator_token(node, username: str = "operator", role: str = "operator") -> str:
    """Create a user with ``role`` in ``node``'s (migrated) database; return its API token.

    Call before ``prepare_nodes`` copies the first node's database to the others, so the
    same token works on every node.
    """
    code = (
        "from backend.nodes.accounts import api_token, create_or_update_user; "
        f"print(api_token(create_or_update_user({username!r}, {role!r})[0]))"
    )
    return node.manage("shell", "-c", code).stdout.strip().splitlines()[-1]
