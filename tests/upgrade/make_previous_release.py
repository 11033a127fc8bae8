"""Build the "previous release" snapshot the upgrade tests start from (run once per release).

    .venv/bin/python -m tests.upgrade.make_previous_release [--rounds 2]

Runs a small local federation (anvil, three SQLite node processes) through what an operator does
in a release's life: users of every role, three encrypted datasets, grants (one given, one
revoked), a DP job run to its end (rounds, updates, scores, actions, privacy releases, served
models, cluster tasks), and a second job proposed and left open. It then copies org-a's database
with SQLite's online backup API into ``previous_release/node.sqlite``, records the last migration
of every app (``migrations.json``: the migration tests rebuild the same schema on MariaDB by
migrating an empty database to exactly these names and loading the SQLite file's rows), and keeps
a copy of the compiled contracts of that release (``contracts/``) for the contract-upgrade test.

The snapshot is committed: a later release's code cannot build it again (its migrations and
contracts are newer), which is the point.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

from devnet.demo import _partitions
from devnet.localnet import OPERATOR, LocalFederation, NodeSpec
from devnet.process import REPO_ROOT

SNAPSHOT = Path(__file__).resolve().parent / "previous_release"
PASSWORD = "previous-release-operator"  # of a throwaway federation; the migration test logs in with it


def _job(name: str, dataset: int, *, rounds: int) -> dict:
    return {
        "name": name,
        "model": "mlp",
        "dataset": dataset,
        "rounds": rounds,
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


def _grant(federation: LocalFederation, owner, dataset: int, grantee: str, *, revoke: bool = False) -> None:
    session = owner.api()
    response = session.post(f"{owner.url}/api/datasets/{dataset}/grants", json={"node": grantee}, timeout=120)
    assert response.status_code < 300, response.text
    if revoke:
        response = session.delete(f"{owner.url}/api/datasets/{dataset}/grants/{grantee}", timeout=120)
        assert response.status_code < 300, response.text


def _api_answers(node, *, job: int, dataset: int) -> dict:
    """What org-a's API said about its data at the end: the migrated node must say the same."""
    session = node.api()
    paths = {
        "dataset": f"/api/datasets/{dataset}",
        "job": f"/api/jobs/{job}",
        "rounds": f"/api/jobs/{job}/rounds",
        "models": "/api/models",
        "jobs": "/api/jobs",
    }
    answers = {}
    for name, path in paths.items():
        response = session.get(node.url + path, timeout=60)
        assert response.status_code == 200, (path, response.text)
        answers[name] = response.json()
    return answers


def _migration_leaves(database: Path) -> dict[str, str]:
    """The last applied migration of every app: the schema this snapshot was built with."""
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT app, name FROM django_migrations ORDER BY app, name").fetchall()
    leaves: dict[str, str] = {}
    for app, name in rows:
        leaves[app] = max(leaves.get(app, name), name)
    return leaves


def _copy_database(source: Path, target: Path) -> None:
    """A consistent copy of a WAL database (the online backup API), compacted, in one file."""
    target.unlink(missing_ok=True)
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    with sqlite3.connect(target) as dst:
        dst.execute("PRAGMA journal_mode=DELETE")
        dst.execute("DELETE FROM defl_cache")  # throttle counters: nothing to carry
        dst.execute("DELETE FROM django_session")
    connection = sqlite3.connect(target)
    connection.execute("VACUUM")
    connection.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="defl-previous-release-"))
    specs = [NodeSpec(name=f"org-{c}") for c in "abc"]
    federation = LocalFederation(root, specs, allow_small_committees=True, password=PASSWORD)
    with federation:
        a, b, c = federation.nodes
        a.web.manage("node", "adduser", "viewer-user", "--role", "viewer")  # a token, no password
        a.web.manage(
            "node", "adduser", "provider-user", "--role", "provider", "--password-env", "DEFL_DEMO_PASSWORD"
        )
        splits, parts = _partitions(3, "iid", seed=0)
        classes = list(range(splits.num_classes))
        datasets = [
            federation.upload_dataset(
                node, part.x, part.y, name=f"{node.spec.name}-mnist", classes=classes, epsilon_cap=10.0
            )["id"]
            for node, part in zip(federation.nodes, parts, strict=True)
        ]
        _grant(federation, a, datasets[0], b.address)
        _grant(federation, a, datasets[0], c.address, revoke=True)
        _grant(federation, b, datasets[1], a.address)
        job = federation.create_job(a, _job("previous-release", datasets[0], rounds=args.rounds))["id"]
        for node, dataset in zip(federation.nodes, datasets, strict=True):
            federation.join(node, job, dataset)
        federation.wait_prepared(job)
        federation.start_job(a, job)
        final = federation.wait_for_job(job, timeout_s=1800)
        assert final["status"] == "finished", final
        left_open = federation.create_job(a, _job("left-open", datasets[0], rounds=1))["id"]
        federation.join(a, left_open, datasets[0])  # waits for the mirror to have it
        api = _api_answers(a, job=job, dataset=datasets[0])
    SNAPSHOT.mkdir(parents=True, exist_ok=True)
    database = root / "org-a" / "db.sqlite3"
    _copy_database(database, SNAPSHOT / "node.sqlite")
    record = {
        "commit_schema": "the migrations of the release this snapshot was built with",
        "node": a.address,
        # org-a's key, of a throwaway development chain: the upgraded node answers as org-a
        "node_key": a.web.private_key,
        "operator": OPERATOR,
        "password": PASSWORD,
        "job": job,
        "open_job": left_open,
        "datasets": datasets,
        "migrations": _migration_leaves(SNAPSHOT / "node.sqlite"),
    }
    (SNAPSHOT / "api.json").write_text(json.dumps(api, indent=2, sort_keys=True) + "\n")
    (SNAPSHOT / "migrations.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    contracts = SNAPSHOT / "contracts"
    contracts.mkdir(exist_ok=True)
    for artifact in sorted((REPO_ROOT / "contracts" / "artifacts").glob("*.json")):
        shutil.copyfile(artifact, contracts / artifact.name)
    shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {"snapshot": str(SNAPSHOT), "job": job, "bytes": (SNAPSHOT / "node.sqlite").stat().st_size}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
