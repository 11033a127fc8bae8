"""Dataset uploads: good CSV and npz are stored encrypted; every bad upload is a 400 that leaves nothing."""

from __future__ import annotations

import numpy as np
import pytest
from dataset_files import GOOD_CSV, csv_file, form, good_npz, npz_file

from backend.datasets import budget, chain, services, storage
from backend.datasets.formats import deserialize
from backend.datasets.models import Dataset
from fl_node.dp_count import COUNT_NOISE_STD, count_release
from fl_node.privacy import ADD_REMOVE, rdp_epsilon

pytestmark = pytest.mark.django_db


def _stored_chunks() -> int:
    from backend.swarm.factory import local_store

    return local_store().usage().chunks


def _pinned_chunks() -> int:
    from backend.swarm.factory import local_store

    return local_store().usage().pinned_chunks


def test_good_csv_is_parsed_encrypted_and_stored(provider):
    response = provider.post("/api/datasets", form(csv_file(GOOD_CSV), "csv", label_column="species"))
    assert response.status_code == 201, response.content
    body = response.json()
    # The size registered is a DP count of the 4 records (at least 1); the true one stays here.
    assert body["records"] == 4 and body["num_samples"] >= 1
    assert body["count_noise_std"] == COUNT_NOISE_STD
    assert body["num_features"] == 2
    assert body["classes"] == ["bird", "cat", "dog"]
    assert body["status"] == "stored"  # no ledger in this build: registration skipped
    # The count is the dataset's first release, charged to its budget.
    count_epsilon = rdp_epsilon(count_release().history(), delta=1e-5, adjacency=ADD_REMOVE)
    assert body["budget"] == {
        "epsilon_cap": 8.0,
        "delta": 1e-5,
        "epsilon_spent": pytest.approx(count_epsilon),
        "epsilon_reserved": 0.0,
        "epsilon_left": pytest.approx(8.0 - count_epsilon),
        "spent_by_jobs": [{"job": "registration", "epsilon": pytest.approx(count_epsilon), "rounds": 1}],
        "budget_group": [body["id"]],
        "adjacency": ADD_REMOVE,
        "explanation": budget.EXPLANATION,
    }
    replication = body["replication"]
    assert replication["chunks"] >= 1
    assert replication["healthy"] == replication["chunks"]  # a single node: R = 1, all local
    assert replication["pinned_here"] is True
    assert "encrypted_reference" not in body  # the data key never leaves the node

    dataset = Dataset.objects.get()
    assert len(dataset.encrypted_reference) == 128  # address + key: an encrypted reference
    assert dataset.owner.username == "provider-user"
    x, y = services.load_dataset_arrays(dataset)
    assert x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(y, [1, 2, 1, 0])
    np.testing.assert_allclose(x[1], [3.5, 4.0])


def test_stored_chunks_hold_no_plaintext(provider, settings):
    from pathlib import Path

    provider.post("/api/datasets", form(csv_file(GOOD_CSV), "csv", label_column="species"))
    canonical = deserialize(storage.fetch(Dataset.objects.get().encrypted_reference)).serialized
    chunk_bytes = b"".join(p.read_bytes() for p in Path(settings.DEFL_CHUNK_DIR).rglob("*") if p.is_file())
    assert canonical[:64] not in chunk_bytes


def test_good_npz_with_image_shaped_x(operator):
    response = operator.post("/api/datasets", form(good_npz(), "npz", classes="a,b,c"))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["feature_shape"] == [1, 4, 4]
    assert body["num_features"] == 16
    assert body["classes"] == ["a", "b", "c"]
    assert len(body["schema_hash"]) == 64 and len(body["content_hash"]) == 64


def test_same_content_twice_is_refused(operator):
    first = operator.post("/api/datasets", form(good_npz(seed=1), "npz"))
    assert first.status_code == 201
    response = operator.post("/api/datasets", form(good_npz(seed=1), "npz", name="again"))
    assert response.status_code == 400
    assert f"already registered as dataset {first.json()['id']}" in response.json()["detail"]
    assert Dataset.objects.count() == 1


BAD_UPLOADS = [
    ("csv", csv_file("f1,f2,species\n1,2,cat\n"), {}, "label_column"),
    ("csv", csv_file(GOOD_CSV), {"label_column": "label"}, "not in the header"),
    ("csv", csv_file("f1,species\n1,cat\nabc,dog\n"), {"label_column": "species"}, "numeric"),
    ("csv", csv_file("f1,species\n1,cat\n2\n"), {"label_column": "species"}, "fields"),
    ("csv", csv_file("f1,species\n1,cat\nnan,dog\n"), {"label_column": "species"}, "NaN"),
    (
        "csv",
        csv_file("f1,species\n1,cat\n2,cat\n"),
        {"label_column": "species", "classes": "cat"},
        "two classes",
    ),
    # Undeclared, the class list would be read from the labels present and published (schema hash).
    ("csv", csv_file(GOOD_CSV), {"label_column": "species", "classes": ""}, "declare the class names"),
    ("npz", good_npz(), {"classes": " , "}, "declare the class names"),
    ("csv", csv_file("f1,species\n"), {"label_column": "species"}, "no samples"),
    (
        "csv",
        csv_file("f1,species\n1,cat\n2,dog\n"),
        {"label_column": "species", "classes": "cat"},
        "not in classes",
    ),
    ("npz", csv_file(GOOD_CSV, name="x.npz"), {}, "not a .npz"),
    ("npz", npz_file(x=np.zeros((3, 2))), {}, "lacks"),
    ("npz", npz_file(x=np.zeros(3), y=np.zeros(3, dtype=np.int64)), {}, "2-D"),
    ("npz", npz_file(x=np.zeros((3, 2)), y=np.zeros(3)), {}, "integers"),
    ("npz", npz_file(x=np.zeros((3, 2)), y=np.array([0, 1])), {}, "samples"),
    ("npz", npz_file(x=np.zeros((2, 2)), y=np.array([0, -1])), {}, ">= 0"),
    ("npz", npz_file(x=np.zeros((2, 2)), y=np.zeros((2, 1), dtype=np.int64)), {}, "1-D"),
    ("npz", npz_file(x=np.array([["a", "b"], ["c", "d"]]), y=np.array([0, 1])), {}, "numeric"),
    ("parquet", csv_file(GOOD_CSV), {}, "format"),
]


@pytest.mark.parametrize(("fmt", "file", "extra", "message"), BAD_UPLOADS)
def test_bad_upload_is_400_and_leaves_nothing(provider, settings, fmt, file, extra, message):
    response = provider.post("/api/datasets", form(file, fmt, **extra))
    assert response.status_code == 400, response.content
    assert message in response.json()["detail"]
    assert Dataset.objects.count() == 0
    assert _stored_chunks() == 0
    assert not any(__import__("os").scandir(settings.FILE_UPLOAD_TEMP_DIR))


@pytest.mark.parametrize(("field", "value"), [("epsilon_cap", 0), ("delta", 1.5), ("name", "")])
def test_bad_form_fields_are_400(provider, field, value):
    response = provider.post("/api/datasets", form(good_npz(), "npz", **{field: value}))
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert Dataset.objects.count() == 0


@pytest.mark.parametrize("limit", [1000, 200_000])  # cut off while streaming / refused from Content-Length
def test_over_size_upload_is_413_and_never_hits_the_disk(provider, settings, limit):
    settings.DEFL_MAX_UPLOAD_BYTES = limit
    big = csv_file("f1,species\n" + "1.0,cat\n2.0,dog\n" * (limit // 8))
    response = provider.post("/api/datasets", form(big, "csv", label_column="species"))
    assert response.status_code == 413
    assert f"exceeds this node's limit of {limit} bytes" in response.json()["detail"]
    assert Dataset.objects.count() == 0
    assert _stored_chunks() == 0
    assert not any(__import__("os").scandir(settings.FILE_UPLOAD_TEMP_DIR))


def test_failed_chain_registration_unpins_the_stored_blob(provider, monkeypatch):
    def reverted(**_kwargs):
        from backend.ledger.errors import LedgerError

        raise LedgerError("DataRegistry reverted: NotMember")

    monkeypatch.setattr(chain, "register_dataset", reverted)
    response = provider.post("/api/datasets", form(good_npz(), "npz"))
    assert response.status_code == 409
    assert "NotMember" in response.json()["detail"]
    assert Dataset.objects.count() == 0
    assert _pinned_chunks() == 0


def test_list_and_detail_are_readable_by_viewers(provider, viewer):
    created = provider.post("/api/datasets", form(good_npz(), "npz")).json()
    listing = viewer.get("/api/datasets").json()
    assert listing["count"] == 1 and listing["results"][0]["id"] == created["id"]
    assert viewer.get(f"/api/datasets/{created['id']}").json()["content_hash"] == created["content_hash"]
    assert viewer.get("/api/datasets/12345").status_code == 404


class _Unread:
    """A request body that records whether anyone read it."""

    def __init__(self) -> None:
        self.read_bytes = 0

    def read(self, size=-1):
        self.read_bytes += 1
        return b""

    def readline(self, size=-1):
        return self.read(size)


def test_an_upload_too_large_by_its_content_length_is_413_before_its_body_is_read(provider, settings):
    """The README's promise: a 135 MB upload learns its 413 at once, not after sending 135 MB."""
    settings.DEFL_MAX_UPLOAD_BYTES = 128 * 1024 * 1024
    body = _Unread()
    response = provider.generic(
        "POST",
        "/api/datasets",
        content_type="multipart/form-data; boundary=x",
        CONTENT_LENGTH=str(135 * 1000 * 1000),
        **{"wsgi.input": body},
    )
    assert response.status_code == 413, response.content
    assert body.read_bytes == 0
