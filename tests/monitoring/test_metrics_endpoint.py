"""GET /metrics: who may scrape, and the node's state read at scrape time (no node processes)."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from backend.telemetry import counters


def _scrape(client: Client, **headers) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def _mirror_job(job_id: int, *, rounds_done: int) -> None:
    from backend.ledger import models as mirror

    job = mirror.Job.objects.create(
        job_id=job_id, proposer="0x" + "a" * 40, config_hash="0x1", initial_model_ref="0x2",
        initial_model_hash="0x3", rounds=5, committee_size=1, top_k=3, min_trainers=3, join_deadline=0,
        train_period=60, score_period=60, status=mirror.Job.Status.RUNNING, current_round=rounds_done + 1,
        proposed_block=1,
    )  # fmt: skip
    for number in range(1, rounds_done + 2):
        job.rounds_set.create(
            number=number, base_model_hash="0x4", update_deadline=0, score_deadline=0,
            status=mirror.Round.Status.DONE if number <= rounds_done else mirror.Round.Status.TRAINING,
            opened_block=10 * number, finalized_block=10 * number + 4 if number <= rounds_done else None,
        )  # fmt: skip


@pytest.mark.django_db
def test_a_scrape_reports_the_mirror_the_actions_and_the_counters():
    from backend.jobs.models import RoundAction

    _mirror_job(3, rounds_done=2)
    for round_, kind, state, seconds in [
        (1, "train", "done", 2.0),
        (2, "train", "done", 4.0),
        (3, "train", "failed", None),
    ]:
        RoundAction.objects.create(
            node="0x" + "b" * 40, job_id=3, round=round_, kind=kind, state=state, attempts=1 + (state == "failed"),
            seconds=seconds, started_at=1000.0 * round_ if seconds else None, parts={"train": seconds or 0.0},
        )  # fmt: skip
    before = _scrape(Client())
    counters.transaction_sent("submitUpdate", 90_000, "mined")
    counters.swarm_transfer("sent", 4096)
    after = _scrape(Client())

    assert after[("defl_jobs", (("status", "running"),))] == 1
    assert after[("defl_job_round", (("job", "3"), ("of", "current")))] == 3
    assert after[("defl_rounds", (("status", "done"),))] == 2
    assert (
        after[("defl_round_training_blocks_count", ())] == 2
        and after[("defl_round_training_blocks_sum", ())] == 8
    )
    assert after[("defl_actions", (("kind", "train"), ("state", "done")))] == 2
    assert after[("defl_actions", (("kind", "train"), ("state", "failed")))] == 1
    assert after[("defl_action_attempts_total", (("kind", "train"),))] == 4
    assert after[("defl_action_duration_seconds_sum", (("kind", "train"),))] == 6.0
    assert after[("defl_action_part_seconds_total", (("part", "train"),))] == 6.0
    assert after[("defl_swarm_stored_chunks", ())] == 0
    sent = ("defl_transactions_total", (("function", "submitUpdate"), ("outcome", "mined")))
    assert after[sent] == before.get(sent, 0) + 1
    gas = ("defl_transaction_gas_used_total", (("function", "submitUpdate"),))
    assert after[gas] == before.get(gas, 0) + 90_000
    bytes_sent = ("defl_swarm_peer_bytes_total", (("direction", "sent"),))
    assert after[bytes_sent] == before.get(bytes_sent, 0) + 4096
    assert all(v == 0 for (name, _), v in after.items() if name == "defl_scrape_errors")
    assert after[("defl_chain_up", ())] == 1  # the in-process chain, deployed for this node
    assert after[("defl_indexer_lag_blocks", ())] >= 0
    assert ("process_resident_memory_bytes", ()) in after  # the web process's own figures


@pytest.mark.django_db
def test_metrics_are_refused_to_other_addresses_unless_they_present_the_token(settings):
    outsider = Client(REMOTE_ADDR="203.0.113.9")
    refused = outsider.get("/metrics")
    assert refused.status_code == 403 and b"DEFL_METRICS_TOKEN" in refused.content
    settings.DEFL_METRICS_TOKEN = "s3cret-scrape-token"
    assert outsider.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert outsider.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token").status_code == 200
    settings.DEFL_METRICS_ALLOWED_NETS = ["203.0.113.0/24"]
    settings.DEFL_METRICS_TOKEN = ""
    assert outsider.get("/metrics").status_code == 200
    assert Client().post("/metrics").status_code == 405


@pytest.mark.django_db
def test_a_failing_part_is_reported_and_the_rest_of_the_scrape_answers(settings):
    settings.DEFL_CHUNK_DIR = "/proc/defl-no-such-store"  # the chunk index cannot be opened
    from backend.swarm import factory

    factory.local_store.cache_clear()
    found = _scrape(Client())
    assert found[("defl_scrape_errors", (("part", "storage"),))] == 1
    assert found[("defl_scrape_errors", (("part", "mirror"),))] == 0
    assert ("defl_swarm_stored_chunks", ()) not in found


@pytest.mark.django_db
def test_the_grafana_dashboard_asks_only_for_metrics_the_node_exports():
    import json
    import re
    from pathlib import Path

    dashboard = json.loads(
        (Path(__file__).resolve().parents[2] / "deploy/grafana/defl-node.json").read_text()
    )
    asked = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(?:defl|process)_[a-z_]+", target["expr"])
    }
    suffixes = {
        "counter": ["_total"],
        "summary": ["_sum", "_count"],
        "histogram": ["_bucket", "_sum", "_count"],
    }
    response = Client().get("/metrics")
    families = [(f.name, f.type) for f in text_string_to_metric_families(response.content.decode())]
    # counters appear once counted: their declared names too
    families += [
        (m._name, m._type) for m in vars(counters).values() if hasattr(m, "_type") and hasattr(m, "_name")
    ]
    exported = {name + suffix for name, kind in families for suffix in suffixes.get(kind, [""])}
    assert asked and asked <= exported, sorted(asked - exported)
