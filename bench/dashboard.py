"""Dashboard load: cold-cache Largest Contentful Paint and JavaScript transferred, on loopback.

Starts one node (embedded defaults: SQLite, in-process chain) serving the built dashboard
(frontend/dist), then drives headless Chromium (frontend/e2e/bench-dashboard.mjs): five cold
loads of the overview after signing in, a cold deep link to a job page with its chart, and the
same loads with ``Accept-Encoding: identity`` as the uncompressed side. Goals (issue 19):
``overview_lcp_ms`` <= 800, ``initial_js_kb_transferred`` <= 200, ``job_page_js_kb_transferred``
<= 350. The last printed line is one JSON object.

Run from the repository root after ``npm --prefix frontend run build``:
``.venv/bin/python bench/dashboard.py [--runs 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devnet.anvil import free_port  # noqa: E402

FRONTEND = REPO / "frontend"
CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
USER, PASSWORD = "bench-operator", "bench-password-123"
GOALS = {"overview_lcp_ms": 800, "initial_js_kb_transferred": 200, "job_page_js_kb_transferred": 350}


def start_node(data_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "DEFL_CHAIN_URL")
        },
        "DEFL_DATA_DIR": str(data_dir),
        "DEFL_NODE_KEY": "0x" + "5b" * 32,  # throwaway: the chain is in-process
        "DEFL_NODE_NAME": "bench-node",
        "DEFL_NODE_ENDPOINT": url,
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True)
    make_user = f"from backend.nodes.accounts import create_or_update_user\ncreate_or_update_user({USER!r}, 'operator', {PASSWORD!r})"
    subprocess.run([*manage, "shell", "-c", make_user], cwd=REPO, env=env, check=True)
    serve = (
        "from django.core.management import call_command\n"
        "from backend.identity.key import node_account\n"
        "from backend.nodes.registration import register_node_on_chain\n"
        "register_node_on_chain(node_account())\n"
        f"call_command('runserver', '--noreload', '127.0.0.1:{port}')\n"
    )
    log = (data_dir / "node.log").open("w")
    process = subprocess.Popen(
        [*manage, "shell", "-c", serve], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the node exited: {(data_dir / 'node.log').read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/health", timeout=2):
                return process, url
        except OSError:
            time.sleep(0.5)
    process.terminate()
    raise SystemExit("the node did not start within 120 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="cold overview loads (median)")
    args = parser.parse_args()
    if not (FRONTEND / "dist" / "index.html").exists():
        print("build the dashboard first: npm --prefix frontend run build", file=sys.stderr)
        return 2
    if not CHROMIUM.exists() or shutil.which("node") is None:
        print(f"needs {CHROMIUM} and node", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="defl-bench-dashboard-") as tmp:
        process, url = start_node(Path(tmp))
        try:
            print(f"node up at {url}; {args.runs} cold loads of the overview, then the job page", flush=True)
            env = {
                **os.environ,
                "DEFL_URL": url,
                "DEFL_USER": USER,
                "DEFL_PASSWORD": PASSWORD,
                "DEFL_RUNS": str(args.runs),
            }
            result = subprocess.run(
                ["node", str(FRONTEND / "e2e" / "bench-dashboard.mjs")],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
            )  # fmt: skip
        finally:
            process.terminate()
            process.wait(timeout=20)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        print(result.stdout[-2000:], file=sys.stderr)
        return 1
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"{'figure':32} {'compressed':>11} {'uncompressed':>13} {'ratio':>6}   goal")
    for name, raw in (("initial_js_kb_transferred", "initial_js_kb_uncompressed"),
                      ("job_page_js_kb_transferred", "job_page_js_kb_uncompressed")):  # fmt: skip
        ratio = figures[name] / figures[raw] if figures[raw] else float("nan")
        figures[name.replace("_transferred", "_ratio")] = round(ratio, 3)
        print(f"{name:32} {figures[name]:>11} {figures[raw]:>13} {ratio:>6.3f}   <= {GOALS[name]}")
    print(
        f"{'overview_lcp_ms (median)':32} {figures['overview_lcp_ms']:>11} runs {figures['overview_lcp_ms_runs']}   <= 800"
    )
    figures["goals_met"] = all(figures[name] <= goal for name, goal in GOALS.items())
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
