"""The DP adversary at the dataset boundary: it knows every record but one (S) and the candidates
x and y, reads the chain, the swarm and the provider's API, and tries to tell D = S + x from
D' = S + y (replace-one: the size is public and the same) WITHOUT the DP releases.

Before keyed commitments it won with certainty: the chain held SHA-256 over the sorted record
digests, and the public hold-out's reference was derived from it. Each check below replays that
attack, or the next one an adversary would try, against what an upload publishes now.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from dataset_files import form, npz_file

from backend.datasets import commitment
from backend.datasets.formats import CanonicalDataset
from backend.datasets.models import Dataset, RecordHash
from fl_node.data import record_digests

pytestmark = pytest.mark.django_db

CLASSES = ("0", "1", "2")


def _worlds(samples: int = 60):
    rng = np.random.default_rng(33)
    x = rng.random((samples + 1, 6)).astype(np.float32)
    y = rng.integers(0, 3, samples + 1).astype(np.int64)
    candidate_y = (rng.random((1, 6)).astype(np.float32), np.array([1], dtype=np.int64))
    with_x = (x, y)
    with_y = (np.concatenate([x[:-1], candidate_y[0]]), np.concatenate([y[:-1], candidate_y[1]]))
    return with_x, with_y


def _publish(client, chain, x, y) -> dict:
    """Upload as the provider (a fresh node each time: no local row remembers the records) and
    return what anyone can read: the API's dataset, the chain's record, the swarm root."""
    Dataset.objects.all().delete()
    RecordHash.objects.all().delete()
    response = client.post(
        "/api/datasets", form(npz_file(x=x, y=y), "npz", classes=",".join(CLASSES), public_holdout="true")
    )
    assert response.status_code == 201, response.content
    body = response.json()
    record = chain["ledger"].data.get_dataset(int(body["onchain_id"]))
    return {
        "api": body["commitment"],
        "api_content_hash": body["content_hash"],
        "chain": bytes(record.commitment).hex(),
        "holdout": bytes(record.public_holdout_hash).hex(),
        "swarm": bytes(record.swarm_ref).hex(),
        "samples": record.samples,
    }


def _guesses(x, y) -> set[str]:
    """Every value the adversary can compute from a candidate dataset alone."""
    canonical = CanonicalDataset(x, y, CLASSES)
    plain = canonical.content_hash
    return {
        plain,
        canonical.blob_hash,
        hashlib.sha256(b"defl-public-holdout-v1\n" + bytes.fromhex(plain)).hexdigest(),  # v1 hold-out
        hashlib.sha256(b"".join(sorted(canonical.record_digests))).hexdigest(),
    }


def test_no_published_value_matches_a_function_of_either_candidate(provider, on_chain):
    with_x, with_y = _worlds()
    published = [_publish(provider, on_chain, *world) for world in (with_x, with_y)]
    guesses = _guesses(*with_x) | _guesses(*with_y)
    for seen in published:
        assert seen["api"] == seen["api_content_hash"] == seen["chain"]
        assert not {seen["chain"], seen["holdout"], seen["swarm"]} & guesses
    # n is the same in both worlds: under replace-one adjacency it tells nothing.
    assert published[0]["samples"] == published[1]["samples"] == 61


def test_a_record_with_a_label_no_other_record_has_leaves_the_schema_unchanged(provider, on_chain):
    """The schema (its hash on chain) holds the class list. Read from the labels present, it would
    grow by the one record whose label nobody else has: membership, certain. Declared, it is
    the same with or without that record; an upload that declares none is refused."""
    rng = np.random.default_rng(34)
    x, y = rng.random((41, 6)).astype(np.float32), rng.integers(0, 2, 41).astype(np.int64)
    y[-1] = 2  # the record only x has: the one rare label
    schemas = []
    for rows in (slice(0, 40), slice(0, 41)):
        Dataset.objects.all().delete()
        RecordHash.objects.all().delete()
        response = provider.post(
            "/api/datasets", form(npz_file(x=x[rows], y=y[rows]), "npz", classes="0,1,2")
        )
        assert response.status_code == 201, response.content
        record = on_chain["ledger"].data.get_dataset(int(response.json()["onchain_id"]))
        schemas.append(bytes(record.schema_hash).hex())
    assert schemas[0] == schemas[1]
    Dataset.objects.all().delete()
    RecordHash.objects.all().delete()
    undeclared = provider.post("/api/datasets", form(npz_file(x=x, y=y), "npz", classes=""))
    assert undeclared.status_code == 400 and "classes" in undeclared.json()["errors"]


def test_the_same_records_published_twice_look_unrelated(provider, on_chain):
    """Not a function of the records: the same D gives fresh values at every upload (a fresh
    secret and data key), so no value an adversary computes from candidates can match it."""
    world, _ = _worlds()
    first, second = (_publish(provider, on_chain, *world) for _ in range(2))
    for key in ("chain", "holdout", "swarm"):
        assert first[key] != second[key]
    assert first["samples"] == second["samples"]


def test_the_split_tells_nothing_without_the_secret():
    """Same secret, D and D': every record of S is on the same side in both worlds, so the
    split differs in the replaced record alone. Over fresh secrets x's side is a coin with the
    split's odds: the adversary's best guess is the prior."""
    with_x, with_y = _worlds(samples=400)
    digests_x, digests_y = record_digests(*with_x), record_digests(*with_y)
    secret = commitment.new_secret()
    for public in (True, False):
        a = commitment.job_holdout(secret, digests_x, public=public, val_fraction=0.1, job_seed=5)
        b = commitment.job_holdout(secret, digests_y, public=public, val_fraction=0.1, job_seed=5)
        for part_a, part_b in zip(a, b, strict=True):
            assert set(part_a.tolist()) - {400} == set(part_b.tolist()) - {400}
    held = 0
    trials = 400
    for _ in range(trials):
        _, validation = commitment.job_holdout(
            commitment.new_secret(), digests_x, public=False, val_fraction=0.1, job_seed=5
        )
        held += 400 in validation
    assert 12 < held < 80  # Binomial(400, 0.1): mean 40, sd 6; outside this below one in a million
