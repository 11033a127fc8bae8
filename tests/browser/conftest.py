"""A real node process for the browser tests: fresh data dir, migrated database, one user per role.

The node is ``manage.py runserver --noreload`` on a free port with the embedded defaults
(SQLite, in-process tasks, in-process chain); the dashboard it serves is the build in frontend/dist.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from devnet.anvil import free_port

REPO = Path(__file__).resolve().parents[2]
FRONTEND = REPO / "frontend"
CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
# A throwaway key, so the node needs no keystore (it is never used on a real chain).
TEST_NODE_KEY = "0x" + "4b" * 32
ROLES = ("operator", "provider", "viewer")


@dataclass(frozen=True)
class Node:
    url: str
    users: dict[str, tuple[str, str]]  # role -> (username, password)
    data_dir: Path
    log: Path

    def users_env(self) -> str:
        return ",".join(f"{role}:{name}:{password}" for role, (name, password) in self.users.items())


def _wait_until_up(url: str, process: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the node exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the node did not answer within {timeout_s} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def browser_prerequisites() -> None:
    """Chromium, playwright-core and the dashboard build (README set-up) must be there."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    if not (FRONTEND / "node_modules" / "playwright-core").is_dir():
        pytest.skip("frontend/node_modules is missing: npm ci --prefix frontend")
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    if not (FRONTEND / "dist" / "index.html").exists():
        pytest.fail("the dashboard is not built: npm --prefix frontend run build")


@pytest.fixture(scope="session")
def node_server(tmp_path_factory, browser_prerequisites) -> Node:
    data_dir = tmp_path_factory.mktemp("browser-node")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    users = {role: (f"{role}-user", f"{role}-password-123") for role in ROLES}
    env = {
        **os.environ,
        "DEFL_DATA_DIR": str(data_dir),
        "DEFL_NODE_KEY": TEST_NODE_KEY,
        "DEFL_NODE_NAME": "browser-test-node",
        "DEFL_NODE_ENDPOINT": url,
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),  # a node refuses to start without its own
        "PYTHONUNBUFFERED": "1",
        # small enough that a browser test can hand Chromium a file over it (the upload form's check)
        "DEFL_MAX_UPLOAD_BYTES": str(4 * 1024 * 1024),
    }
    for name in ("DJANGO_DEBUG", "DATABASE_URL", "CELERY_BROKER_URL", "DEFL_CHAIN_URL", "DEFL_PEERS"):
        env.pop(name, None)
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True, timeout=300)
    create_users = "from backend.nodes.accounts import create_or_update_user\n" + "".join(
        f"create_or_update_user({name!r}, {role!r}, {password!r})\n"
        for role, (name, password) in users.items()
    )
    subprocess.run([*manage, "shell", "-c", create_users], cwd=REPO, env=env, check=True, timeout=300)

    # With no DEFL_CHAIN_URL the chain is in-process: it lives and dies with the server process,
    # so the node registers itself (as `node init` would) in that same process, then serves.
    serve = (
        "from django.core.management import call_command\n"
        "from backend.identity.key import node_account\n"
        "from backend.nodes.registration import register_node_on_chain\n"
        "print(register_node_on_chain(node_account()), flush=True)\n"
        f"call_command('runserver', '--noreload', '127.0.0.1:{port}')\n"
    )
    log = data_dir / "node.log"
    with log.open("w") as log_file:
        process = subprocess.Popen(
            [*manage, "shell", "-c", serve],
            cwd=REPO,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_up(url, process, log)
        yield Node(url=url, users=users, data_dir=data_dir, log=log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_e2e_script(script: str, env: dict[str, str], timeout_s: int = 600) -> subprocess.CompletedProcess:
    """Runs frontend/e2e/<script> with node; its output is printed so that pytest shows it on failure."""
    result = subprocess.run(
        ["node", str(FRONTEND / "e2e" / script)],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    print(result.stdout)
    print(result.stderr, file=sys.stderr)
    return result
