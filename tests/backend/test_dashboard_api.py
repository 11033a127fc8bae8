"""The dashboard's read endpoints (/api/dashboard/*, backend/web) and the overview's peers and events.

Rows of the chain's mirror are written directly where the chain itself is not the subject;
peers, health checks and block times use the in-process chain and real HTTP servers.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from eth_account import Account

from backend.jobs.models import JobRecord, Membership, RoundMetric
from backend.ledger import models as mirror
from backend.nodes import overview
from tests.builders import stored_dataset

pytestmark = pytest.mark.django_db

ME = Account.from_key("0x" + "4c" * 32).address
B = "0x" + "b0" * 20
C = "0x" + "c0" * 20


def _member(address, name):
    return mirror.Node.objects.create(
        address=address, name=name, endpoint="http://127.0.0.1:9", pubkey="0x", overlay="0x",
        status=mirror.Node.Status.MEMBER, updated_block=1,
    )  # fmt: skip


def _dataset(dataset_id, owner, cap, spent):
    return mirror.Dataset.objects.create(
        dataset_id=dataset_id, owner=owner, commitment="0x", swarm_ref="0x", schema_hash="0x",
        samples=600, privacy_cap=cap, privacy_spent=spent, registered_block=1,
    )  # fmt: skip


def _job(job_id, status, *, proposer=ME, committee=1, min_trainers=2):
    return mirror.Job.objects.create(
        job_id=job_id, proposer=proposer, config_hash="0x", initial_model_ref="0x", initial_model_hash="0x",
        rounds=5, committee_size=committee, top_k=2, min_trainers=min_trainers, join_deadline=0,
        train_period=0, score_period=0, status=status, current_round=1 if status == "running" else 0,
        proposed_block=1,
    )  # fmt: skip


def test_every_role_reads_them_and_nobody_writes(viewer, operator, anonymous):
    for path in ("overview", "join-candidates", "granted-datasets", "models"):
        assert viewer.get(f"/api/dashboard/{path}").status_code == 200, path
        assert anonymous.get(f"/api/dashboard/{path}").status_code == 401, path
        assert viewer.post(f"/api/dashboard/{path}", {}).status_code == 403, path
        assert operator.post(f"/api/dashboard/{path}", {}).status_code == 405, path


def test_join_candidates_list_each_member_with_own_and_granted_datasets_and_budget_left(viewer):
    _member(ME, "org-a")
    _member(B, "org-b")
    _member(C, "org-c")
    mirror.Node.objects.create(
        address="0x" + "d0" * 20, name="applicant", endpoint="", pubkey="0x", overlay="0x",
        status=mirror.Node.Status.APPLIED, updated_block=1,
    )  # fmt: skip
    own = _dataset(1, ME, 10_000_000, 2_500_000)
    _dataset(2, B, 3_000_000, 3_000_000)
    mirror.Grant.objects.create(dataset=own, grantee=C, wrapped_key="k", active=True, granted_block=2)
    mirror.Grant.objects.create(dataset=own, grantee=B, wrapped_key="k", active=False, granted_block=2)

    stored_dataset(name="clinic-a", onchain_id="1")  # this node's own record of dataset #1

    body = viewer.get("/api/dashboard/join-candidates").json()
    assert body["address"] == ME
    assert body["allow_small_committees"] is None  # no chain in this test: unknown
    rows = {m["name"]: m for m in body["members"]}
    assert set(rows) == {"org-a", "org-b", "org-c"}  # not the applicant
    assert rows["org-a"]["self"] is True
    assert rows["org-a"]["datasets"] == [
        {"id": 1, "name": "clinic-a", "owned": True, "samples": 600, "schema_hash": "0x",
         "epsilon_cap": 10.0, "epsilon_left": 7.5}
    ]  # fmt: skip
    assert [d["id"] for d in rows["org-b"]["datasets"]] == [2]  # the revoked grant does not count
    assert rows["org-b"]["datasets"][0]["epsilon_left"] == 0.0
    assert rows["org-b"]["datasets"][0]["name"] == ""  # another member's dataset: its name is not known here
    assert rows["org-c"]["datasets"][0] == {
        "id": 1, "name": "clinic-a", "owned": False, "samples": 600, "schema_hash": "0x",
        "epsilon_cap": 10.0, "epsilon_left": 7.5,
    }  # fmt: skip


def test_granted_datasets_show_what_others_granted_to_this_node_with_owner_and_state(viewer):
    _member(B, "org-b")
    active = _dataset(7, B, 4_000_000, 1_000_000)
    revoked = _dataset(8, C, 4_000_000, 0)
    _dataset(9, B, 4_000_000, 0)  # granted to someone else
    mirror.Grant.objects.create(dataset=active, grantee=ME, wrapped_key="k", active=True, granted_block=5)
    mirror.Grant.objects.create(
        dataset=revoked, grantee=ME.lower(), wrapped_key="k", active=False, granted_block=3, revoked_block=6
    )
    body = viewer.get("/api/dashboard/granted-datasets").json()
    assert [(g["dataset"], g["owner_name"], g["state"], g["epsilon_left"]) for g in body] == [
        (7, "org-b", "active", 3.0),
        (8, "", "revoked", 4.0),
    ]


def test_overview_shows_active_jobs_with_phase_and_latest_accuracy(viewer):
    running = _job(4, "running")
    _job(5, "open", proposer=B)
    _job(3, "finished")
    JobRecord.objects.create(
        onchain_id=4, name="mnist-dp", config={}, config_hash="0x", initial_model_ref="0x",
        initial_model_hash="0x", proposer=ME,
    )  # fmt: skip
    mirror.Round.objects.create(
        job=running, number=1, status="training", base_model_hash="0x", update_deadline=0, score_deadline=0,
        opened_block=2,
    )  # fmt: skip
    mirror.Score.objects.create(job=running, round=1, member=B, trainer=C, score=9000)
    local = stored_dataset("clinic", num_samples=600, epsilon_cap=10)
    Membership.objects.create(node=ME, job_id=4, dataset=local)
    RoundMetric.objects.create(
        node=ME, job_id=4, round=1, accuracy=0.81, loss=0.6, epsilon=1.0, model_hash="0x"
    )

    body = viewer.get("/api/dashboard/overview").json()
    jobs = {j["id"]: j for j in body["jobs"]}
    assert set(jobs) == {4, 5}  # the finished one is not "in progress"
    assert (jobs[4]["name"], jobs[4]["phase"], jobs[4]["latest_accuracy"]) == ("mnist-dp", "scoring", 0.81)
    assert (jobs[4]["joined"], jobs[4]["mine"]) == (True, True)
    assert (jobs[5]["phase"], jobs[5]["needed"], jobs[5]["mine"], jobs[5]["joined"]) == (
        "open",
        3,
        False,
        False,
    )


def test_overview_warns_in_sentences_when_something_is_wrong(viewer):
    _dataset(1, ME, 10_000_000, 9_500_000)
    body = viewer.get("/api/dashboard/overview").json()
    kinds = {w["kind"]: w for w in body["warnings"]}
    assert kinds["chain"]["level"] == "error"
    assert "cannot be reached" in kinds["chain"]["text"]
    assert "ε 9.50 of its cap 10.00" in kinds["budget"]["text"]
    assert body["chain"]["available"] is False
    # The node card's data comes along (the overview page needs no separate GET /api/node).
    assert body["node"]["address"] == ME and body["node"]["chain"]["available"] is False
    assert set(body["node"]) >= {"name", "endpoint", "overlay", "storage", "workers", "device"}


def test_model_catalog_names_the_job_gives_accuracy_and_marks_the_served_version(viewer):
    from backend.serving.models import GlobalModel

    JobRecord.objects.create(
        onchain_id=4, name="mnist-dp", config={}, config_hash="0x", initial_model_ref="0x",
        initial_model_hash="0x", proposer=ME,
    )  # fmt: skip
    for number in (1, 2):
        GlobalModel.objects.create(
            job="4", round=number, architecture="mlp", input_shape=[784], num_classes=10,
            content_hash="ab", onchain_hash="0xab", reference="r",
        )  # fmt: skip
    RoundMetric.objects.create(
        node=ME, job_id=4, round=2, accuracy=0.9, loss=0.3, epsilon=2.0, model_hash="0x"
    )
    rows = {m["round"]: m for m in viewer.get("/api/dashboard/models").json()}
    assert (rows[2]["job_name"], rows[2]["accuracy"], rows[2]["served"]) == ("mnist-dp", 0.9, True)
    assert (rows[1]["accuracy"], rows[1]["served"]) == (None, False)


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_peer_probe_answers_only_for_a_live_health_endpoint(health_server, monkeypatch):
    monkeypatch.setattr(overview, "_PROBES", overview._ProbeCache())
    answers = overview._probe_all(
        {"live": health_server, "dead": "http://127.0.0.1:9", "bogus": "file:///etc/passwd", "empty": ""}
    )
    assert answers == {"live": True, "dead": False, "bogus": None, "empty": None}
    assert overview._PROBES.last_ok("live") is not None
    assert overview._PROBES.last_ok("dead") is None


def test_peers_say_unreachable_and_last_seen_from_their_last_transaction(viewer, on_chain, monkeypatch):
    from backend.ledger.models import ChainEvent

    monkeypatch.setattr(overview, "_PROBES", overview._ProbeCache())
    grantee = on_chain["grantee"].address
    ChainEvent.objects.create(
        contract="NodeRegistry", address="0x" + "11" * 20, name="NodeAdmitted", block_number=1,
        tx_hash="0x" + "01" * 32, log_index=0, args={"node": grantee, "memberCount": 2},
    )  # fmt: skip
    peers = viewer.get("/api/peers").json()
    assert [(p["address"], p["healthy"]) for p in peers] == [(grantee, False)]  # :8001 is not listening
    assert peers[0]["last_seen"] is not None

    events = viewer.get("/api/events?limit=5").json()
    assert events[0]["timestamp"] is not None
