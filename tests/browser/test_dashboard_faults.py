"""A node's dashboard stays open while its peer, its chain and the node itself go down and come back.

Two node processes on anvil, which they reach only through a TCP proxy (tests/faults/faultnet.py).
Headless Chromium keeps org-a's dashboard open (frontend/e2e/faults.mjs) and reports its health
banner as it changes; this test breaks one thing at a time and waits for the page to say so, then
repairs it and waits for the banner to go, all without a reload (a window marker set at the
start must survive):

1. org-b's processes killed: "Peer down: org-b"; org-b restarted: the banner clears;
2. the chain's RPC dark for a while: "The chain is unreachable"; back: it clears;
3. org-a itself (the node serving the page) killed: "This node is not answering"; back: it clears.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from devnet.localnet import OPERATOR, NodeSpec

from .conftest import CHROMIUM, FRONTEND, REPO

sys.path.insert(0, str(REPO / "tests" / "faults"))
from faultnet import ProxiedFederation, kill_node, restart_node  # noqa: E402

pytestmark = [
    pytest.mark.browser,
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Chromium is not installed"),
    pytest.mark.skipif(
        not (FRONTEND / "node_modules").exists(), reason="frontend packages are not installed"
    ),
]

WAIT_S = 180  # generous: the banner polls every 5 s, peers are probed at most every 10 s


class Banner:
    """The banner texts the script reports, read from its stdout in a thread."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.events: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process) -> None:
        for line in process.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                continue
        self.events.put({"event": "eof"})

    def wait(self, predicate, what: str, timeout_s: float = WAIT_S) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=1)
            except queue.Empty:
                continue
            self.seen.append(event)
            if event["event"] in ("eof", "error"):
                raise AssertionError(f"the page script ended while waiting for {what}: {self.seen}")
            if predicate(event):
                return event
        raise AssertionError(f"the dashboard never showed {what} within {timeout_s}s; saw {self.seen}")

    def shows(self, words: str, what: str) -> dict:
        return self.wait(lambda e: e["event"] == "banner" and words in e.get("text", ""), what)

    def clears(self, what: str) -> dict:
        return self.wait(lambda e: e["event"] == "banner" and e.get("text") == "", what)


def test_the_dashboard_says_what_is_down_and_recovers_without_a_reload(tmp_path):
    assert (FRONTEND / "dist" / "index.html").exists(), (
        "build the dashboard first (npm --prefix frontend run build)"
    )
    specs = [NodeSpec("org-a"), NodeSpec("org-b")]
    stop_file = tmp_path / "stop"
    with ProxiedFederation(tmp_path / "federation", specs, log=lambda _line: None) as federation:
        page_node, peer = federation.nodes
        env = os.environ | {
            "DEFL_URL": page_node.url,
            "DEFL_OPERATOR_USER": OPERATOR,
            "DEFL_OPERATOR_PASSWORD": federation.password,
            "DEFL_STOP_FILE": str(stop_file),
        }
        script = subprocess.Popen(
            ["node", str(FRONTEND / "e2e" / "faults.mjs")],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        banner = Banner(script)
        try:
            banner.wait(lambda e: e["event"] == "ready", "the signed-in dashboard")
            banner.clears("a quiet banner before any fault")

            kill_node(peer)
            banner.shows("Peer down", "the peer going down")
            restart_node(peer)
            banner.clears("the peer coming back")

            outage = threading.Thread(target=federation.proxy.outage, args=(40.0,))
            outage.start()
            banner.shows("chain is unreachable", "the chain going away")
            outage.join()
            banner.clears("the chain coming back")

            kill_node(page_node)
            banner.shows("not answering", "its own node going down")
            restart_node(page_node)
            banner.clears("its own node coming back")
        finally:
            Path(stop_file).touch()
            try:
                script.wait(60)
            except subprocess.TimeoutExpired:
                script.kill()
        done = banner.wait(lambda e: e["event"] == "done", "the script's summary", timeout_s=60)
    assert done["marker"] == "kept", f"the page was reloaded: {done}"
    assert "/login" not in done["url"], done
