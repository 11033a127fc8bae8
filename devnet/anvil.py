"""AnvilProcess: a local anvil chain on a free loopback port, started and stopped by its owner.

    with AnvilProcess() as anvil:
        w3 = Web3(HTTPProvider(anvil.url))
        anvil.fund(address)

The binary is node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil (started directly, so the
PID we stop is anvil itself), or $DEFL_ANVIL_BIN, or `anvil` on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BUNDLED = REPO_ROOT / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"


class AnvilError(RuntimeError):
    """anvil could not be found or did not come up."""


def anvil_binary() -> str:
    for candidate in (os.environ.get("DEFL_ANVIL_BIN"), str(BUNDLED), shutil.which("anvil")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise AnvilError("anvil not found: run `npm ci` (node_modules/@foundry-rs/anvil) or set DEFL_ANVIL_BIN")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AnvilProcess:
    def __init__(
        self,
        *,
        port: int | None = None,
        chain_id: int = 31337,
        block_time: float | None = None,
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = 30.0,
    ):
        self.port = port or free_port()
        self.chain_id = chain_id
        self.block_time = block_time
        self.extra_args = extra_args
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="anvil-", suffix=".log", delete=False)  # noqa: SIM115

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> AnvilProcess:
        if self.process is not None:
            return self
        args = [
            anvil_binary(),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--chain-id",
            str(self.chain_id),
        ]
        if self.block_time:
            args += ["--block-time", str(self.block_time)]
        self.process = subprocess.Popen(
            [*args, *self.extra_args], stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                raise AnvilError(f"anvil exited at start: {Path(self._log.name).read_text()[-2000:]}")
            try:
                self.rpc("eth_chainId")
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise AnvilError(f"anvil did not answer on {self.url} within {self.startup_timeout}s")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def rpc(self, method: str, params: list | None = None, timeout: float = 5.0):
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}).encode()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read())
        if "error" in answer:
            raise AnvilError(f"{method}: {answer['error']}")
        return answer["result"]

    def fund(self, address: str, wei: int = 1_000 * 10**18) -> None:
        self.rpc("anvil_setBalance", [address, hex(wei)])

    def increase_time(self, seconds: int) -> None:
        self.rpc("evm_increaseTime", [seconds])
        self.rpc("evm_mine")

    def __enter__(self) -> AnvilProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        Path(self._log.name).unlink(missing_ok=True)
