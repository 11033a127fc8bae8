"""Adding a worker is one command against the node's broker: it appears in GET /api/cluster with
its slots, and tasks are placed on it and run there (real Redis, real Celery worker processes).

The node (gunicorn on a SQLite file), its first worker and a second worker ("on another machine":
its own process and environment, sharing only the broker and the database) are started as an
operator would, with the command README gives.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime

import pytest
import redis
import requests

from devnet.process import REPO_ROOT, NodeProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BROKER = "redis://127.0.0.1:6379/13"
WAIT_S = 240.0


def _redis_up() -> bool:
    try:
        return bool(redis.Redis.from_url(BROKER, socket_connect_timeout=2).ping())
    except redis.RedisError:
        return False


def _wait(what: str, check, wait_s: float = WAIT_S):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} within {wait_s:.0f} s")


@pytest.fixture
def node(tmp_path):
    if not _redis_up():
        pytest.skip("no Redis on 127.0.0.1:6379")
    env = {"CELERY_BROKER_URL": BROKER, "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost"}
    web = NodeProcess(tmp_path / "node", env=env, threads=4)
    web.migrate()
    code = (
        "from backend.nodes.accounts import api_token, create_or_update_user; "
        "u, _ = create_or_update_user('op', 'operator'); print(api_token(u))"
    )
    web.token = web.manage("shell", "-c", code).stdout.strip().splitlines()[-1]
    web.start(wait_s=120)
    workers: list[subprocess.Popen] = []

    def start_worker(name: str, cores: int, pool: tuple[str, ...] = ("--pool", "solo")) -> subprocess.Popen:
        # README: the command that adds a worker (here with its own core count, as another machine).
        argv = [sys.executable, "-m", "celery", "-A", "backend", "worker", "-n", name, *pool, "-l", "info"]
        environ = web.environ() | {"DEFL_CLUSTER_CPU_CORES": str(cores), "DEFL_CLUSTER_HEARTBEAT_S": "1"}
        log = open(web.data_dir / f"{name.split('@')[0]}.log", "ab")  # noqa: SIM115 - the child owns it
        process = subprocess.Popen(argv, cwd=REPO_ROOT, env=environ, stdout=log, stderr=log)
        log.close()
        workers.append(process)
        return process

    web.start_worker = start_worker
    try:
        yield web
    finally:
        for process in workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in workers:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        web.stop()


def _cluster(node) -> dict:
    response = requests.get(
        f"{node.url}/api/cluster", headers={"Authorization": f"Token {node.token}"}, timeout=30
    )
    response.raise_for_status()
    return response.json()


def _live_workers(node) -> dict[str, dict]:
    return {w["name"]: w for w in _cluster(node)["workers"] if w["live"]}


def test_a_second_worker_appears_with_its_slots_and_runs_tasks_placed_on_it(node):
    uid = uuid.uuid4().hex[:8]
    first, second = f"w1-{uid}@{'localhost'}", f"w2-{uid}@{'localhost'}"
    node.start_worker(first, 1)
    _wait("the first worker in the cluster view", lambda: first in _live_workers(node))
    assert second not in _live_workers(node)

    # The second worker runs up to 3 tasks at once: several jobs share its CPU slot.
    w2 = node.start_worker(second, 3, ("--pool", "threads", "--concurrency", "3"))
    workers = _wait(
        "the second worker in the cluster view", lambda: (w := _live_workers(node)) and second in w and w
    )
    slots = workers[second]["slots"]
    assert [(s["device"], s["capacity"], s["used"]) for s in slots if s["kind"] == "cpu"] == [("cpu", 3, 0)]
    assert workers[second]["queue"] == second and workers[second]["pid"] == w2.pid

    # Three probe tasks, placed greedily: the first on w2 (3 free cores beat 1), the second on w1
    # (1 of 1 free beats 2 of 3), the third on w2 again (2 of 3 beat none). Each goes to its
    # worker's own queue and runs there; w2's two share its CPU at the same time.
    out = node.manage(
        "cluster", "probe", "--count", "3", "--seconds", "2", "--wait", str(WAIT_S), timeout=WAIT_S + 60
    )
    assert out.stdout.count("succeeded") == 3, out.stdout + out.stderr
    tasks = requests.get(
        f"{node.url}/api/jobs/0/tasks", headers={"Authorization": f"Token {node.token}"}, timeout=30
    )
    ran = {t["round"]: t for t in tasks.json()["tasks"]}
    assert len(ran) == 3 and all(t["state"] == "succeeded" for t in ran.values()), ran
    by_round = sorted(ran.values(), key=lambda t: t["round"])
    assert [t["worker"] for t in by_round] == [second, first, second]
    assert all(t["device"] == "cpu" and t["attempts"] == 1 for t in by_round)
    shared = [by_round[0], by_round[2]]
    moment = lambda text: datetime.fromisoformat(text.replace("Z", "+00:00"))  # noqa: E731
    assert max(moment(t["started_at"]) for t in shared) < min(moment(t["finished_at"]) for t in shared), (
        shared
    )
    assert "GFLOP/s" in by_round[0]["log"] and second in by_round[0]["log"]
    # The slots are free again once the probes ended.
    after = _live_workers(node)
    assert all(s["used"] == 0 for w in after.values() for s in w["slots"])

    w2.send_signal(signal.SIGTERM)
    w2.wait(60)
    _wait("the stopped worker shown offline", lambda: second not in _live_workers(node), 60)
