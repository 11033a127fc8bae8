"""An operator drives a job with the `defl` client while Prometheus-style scrapes follow it (real processes).

Three organizations (anvil, three SQLite node processes). On org-a everything goes through the
installed `defl` command: login, node status, dataset upload, grant and revoke, job create, join,
start, watch (to the end), models ls, predict and download, a second job cancelled, and the
refusals (exit codes and one sentence each). Meanwhile org-a's /metrics is scraped every second:
the rounds, the round it is in, its actions, transactions and gas, swarm bytes, the chunk store
and the dataset's spent epsilon must move as the job does.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from devnet.demo import _partitions
from devnet.localnet import OPERATOR, LocalFederation, NodeSpec

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

DEFL = Path(sys.executable).with_name("defl")  # the entry point `make setup` installs
ROUNDS = 2


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    specs = [NodeSpec(f"org-{c}") for c in "abc"]
    with LocalFederation(tmp_path_factory.mktemp("cli"), specs, log=lambda _: None) as fed:
        yield fed


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli-home")


def defl(workdir: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEFL_", "DJANGO_"))}
    env["DEFL_CLI_CONFIG"] = str(workdir / "credentials.json")
    return subprocess.run(
        [str(DEFL), *args], input=stdin, capture_output=True, text=True, timeout=600, env=env, cwd=workdir
    )


def login_as_operator(workdir: Path, url: str, password: str, *extra: str) -> subprocess.CompletedProcess:
    """``defl login`` as the federation's operator, the password on stdin."""
    return defl(
        workdir,
        "login",
        "--url",
        url,
        "--username",
        OPERATOR,
        "--password-stdin",
        *extra,
        stdin=password + "\n",
    )


def defl_json(workdir: Path, *args: str):
    done = defl(workdir, "--json", *args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    response = requests.get(f"{url}/metrics", timeout=60)
    assert response.status_code == 200, response.text[:300]
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def total(metrics: dict, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels``."""
    return sum(
        value
        for (metric, sample_labels), value in metrics.items()
        if metric == name and set(labels.items()) <= set(sample_labels)
    )


def _job(name: str, dataset: int) -> dict:
    return {
        "name": name,
        "model": "mlp",
        "dataset": dataset,
        "rounds": ROUNDS,
        "local_epochs": 1,
        "batch_size": 64,
        "lr": 0.5,
        "strategy": "fedavg",
        "dp": {"mode": "sgd", "target_epsilon": 3.0, "delta": 1e-5, "max_grad_norm": 1.0},
        "committee_size": 1,
        "top_k": 2,
        "min_trainers": 2,
        "round_timeout_s": 300,
    }


def test_the_client_runs_a_job_and_the_metrics_follow_it(federation, workdir):
    a, b, c = federation.nodes
    login = login_as_operator(workdir, a.url, federation.password)
    assert login.returncode == 0, login.stderr
    status = defl_json(workdir, "node", "status")
    assert status["node"]["address"] == a.address and status["readiness"]["status"] == "ready", status

    splits, parts = _partitions(3, "iid", seed=0)
    classes = ",".join(str(i) for i in range(splits.num_classes))
    buffer = io.BytesIO()
    np.savez(buffer, x=parts[0].x, y=parts[0].y)
    (workdir / "a.npz").write_bytes(buffer.getvalue())
    dataset = defl_json(
        workdir, "datasets", "upload", "a.npz", "--epsilon-cap", "10", "--delta", "1e-5", "--classes", classes
    )
    others = [
        federation.upload_dataset(node, part.x, part.y, name=f"{node.spec.name}-mnist", classes=range(10), epsilon_cap=10.0)["id"]
        for node, part in zip((b, c), parts[1:], strict=True)
    ]  # fmt: skip
    assert (
        defl_json(workdir, "datasets", "grant", str(dataset["id"]), b.address)["node"].lower()
        == b.address.lower()
    )
    defl_json(workdir, "datasets", "grant", str(dataset["id"]), c.address)
    revoked = defl_json(workdir, "datasets", "revoke", str(dataset["id"]), c.address)
    assert revoked["node"].lower() == c.address.lower()
    listed = defl_json(workdir, "datasets", "ls")
    assert [d["id"] for d in listed] == [dataset["id"]]
    # Before any job, only the registered count is spent: the dataset's first release.
    assert [job["job"] for job in listed[0]["budget"]["spent_by_jobs"]] == ["registration"]
    assert 0 < listed[0]["budget"]["epsilon_spent"] < 0.3

    before = scrape(a.url)
    (workdir / "job.json").write_text(json.dumps(_job("cli-job", dataset["id"])))
    job = defl_json(workdir, "jobs", "create", "job.json")["id"]
    defl_json(workdir, "jobs", "join", str(job), "--dataset", str(dataset["id"]))
    for node, theirs in zip((b, c), others, strict=True):
        federation.join(node, job, theirs)
    federation.wait_prepared(job)
    defl_json(workdir, "jobs", "start", str(job))

    watcher = subprocess.Popen(
        [str(DEFL), "--json", "jobs", "watch", str(job), "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("DEFL_")},
            "DEFL_CLI_CONFIG": str(workdir / "credentials.json"),
        },
    )
    scrapes = []
    while watcher.poll() is None:
        scrapes.append(scrape(a.url))
        time.sleep(1.0)
    out, err = watcher.communicate()
    assert watcher.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["status"] == "finished" and lines[-1]["round"] == ROUNDS
    assert [line["round"] for line in lines] == sorted(line["round"] for line in lines)
    federation.wait_for_job(job, timeout_s=300)  # every node measured the last round
    after = scrape(a.url)

    # Scrapes taken while the job ran saw it running, in a round, with rounds finishing.
    running = [s for s in scrapes if total(s, "defl_jobs", status="running") == 1]
    assert running, "no scrape saw the job running"
    assert {total(s, "defl_job_round", job=str(job), of="current") for s in running} <= {1, 2}
    done = [total(s, "defl_rounds", status="done") for s in [before, *scrapes, after]]
    assert done == sorted(done) and done[0] == 0 and done[-1] == ROUNDS
    # Everything the job did is counted, and only grows.
    for name, labels in [
        ("defl_transactions_total", {"outcome": "mined"}),
        ("defl_transaction_gas_used_total", {}),
        ("defl_swarm_peer_bytes_total", {"direction": "sent"}),
        ("defl_swarm_stored_bytes", {}),
        ("defl_dataset_epsilon_spent", {"dataset": str(dataset["id"])}),
        ("defl_action_attempts_total", {}),
        ("defl_http_requests_total", {}),
    ]:
        series = [total(s, name, **labels) for s in [before, *scrapes, after]]
        assert series[-1] > series[0], (name, series[0], series[-1])
    # What node a did depends on the draws: it trained in every round whose committee did not seat
    # it (committee 1 of 3, drawn uniformly: it may sit on both rounds' committees and never train).
    shown = defl_json(workdir, "jobs", "show", str(job))
    seated = [a.address.lower() in {m.lower() for m in r["committee"]} for r in shown["rounds"]]
    assert len(seated) == ROUNDS, shown["rounds"]
    trained, scored = seated.count(False), seated.count(True)
    assert total(after, "defl_transactions_total", function="submitUpdate") == trained
    assert total(after, "defl_actions", kind="train", state="done") == trained
    assert total(after, "defl_actions", kind="score", state="done") == scored
    assert total(after, "defl_actions", state="failed") == 0
    assert total(after, "defl_indexer_lag_blocks") <= 5 and total(after, "defl_chain_up") == 1
    assert all(v == 0 for (name, _), v in after.items() if name == "defl_scrape_errors")
    assert total(after, "defl_scrape_seconds") < 10

    assert shown["job"]["status"] == "finished" and [r["phase"] for r in shown["rounds"]] == ["done"] * ROUNDS
    models = defl_json(workdir, "models", "ls")
    assert sorted(m["round"] for m in models if str(m["job"]) == str(job)) == list(range(1, ROUNDS + 1))
    last = max((m for m in models if str(m["job"]) == str(job)), key=lambda m: m["round"])
    rows = splits.test.x[:5].reshape(5, -1).tolist()
    (workdir / "rows.json").write_text(json.dumps(rows))
    predicted = defl_json(workdir, "models", "predict", str(last["id"]), "--inputs", "rows.json")
    assert len(predicted["predictions"]) == 5
    downloaded = defl_json(workdir, "models", "download", str(last["id"]), "-o", "model.safetensors")
    from safetensors.torch import load_file

    assert downloaded["bytes"] == (workdir / "model.safetensors").stat().st_size > 0
    assert load_file(str(workdir / "model.safetensors"))  # a whole safetensors file

    second = defl_json(workdir, "jobs", "create", "job.json", "--name", "cancelled-job")["id"]
    cancelled = defl_json(workdir, "jobs", "cancel", str(second))
    assert cancelled.get("cancel_tx_hash")
    assert defl_json(workdir, "jobs", "ls")  # both jobs listed (the mirror catches up on its own)


def test_refusals_are_one_sentence_and_an_exit_code(federation, workdir):
    a = federation.nodes[0]
    login = login_as_operator(workdir, a.url, federation.password)
    assert login.returncode == 0, login.stderr
    missing = defl(workdir, "jobs", "show", "999999")
    assert missing.returncode == 1 and missing.stderr.startswith("defl: ") and missing.stderr.count("\n") == 1
    bad_token = defl(workdir, "--token", "not-a-token", "--url", a.url, "jobs", "ls")
    assert bad_token.returncode == 3 and "defl login" in bad_token.stderr
    wrong_password = defl(
        workdir, "login", "--url", a.url, "--username", OPERATOR, "--password-stdin", stdin="wrong\n"
    )
    assert wrong_password.returncode == 3 and "wrong username or password" in wrong_password.stderr
    not_json = defl(
        workdir,
        "--json",
        "datasets",
        "upload",
        "nowhere.npz",
        "--epsilon-cap",
        "1",
        "--delta",
        "1e-5",
        "--classes",
        "0,1",
    )
    assert not_json.returncode == 2 and json.loads(not_json.stdout)["exit_code"] == 2
    nobody = defl(workdir, "--url", "http://127.0.0.1:1", "node", "status")
    assert nobody.returncode == 4 and "cannot reach the node" in nobody.stderr
    script = login_as_operator(workdir, a.url, federation.password, "--script", "ci")
    assert script.returncode == 0, script.stderr
    tokens = requests.get(
        f"{a.url}/api/tokens", headers={"Authorization": f"Token {a.token}"}, timeout=30
    ).json()
    names = [t["name"] for t in (tokens.get("results") if isinstance(tokens, dict) else tokens)]
    assert "ci" in names
    assert defl_json(workdir, "jobs", "ls") is not None  # the script token works
    assert defl(workdir, "logout").returncode == 0
    assert defl(workdir, "jobs", "ls").returncode == 3  # nothing saved any more
