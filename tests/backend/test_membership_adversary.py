"""The DP adversary at the dataset boundary: it knows every record but one (S) and the candidates
x and y, reads the chain, the swarm and the provider's API, and tries to tell D = S + x from
D' = S + y (replace-one), or D = S from S + x (add-remove: the registered size is a DP count and
the stored blob is padded to a size that follows from it), WITHOUT the DP releases.

Before keyed commitments it won with certainty: the chain held SHA-256 over the sorted record
digests, and the public hold-out's reference was derived from it. Each check below replays that
attack, or the next one an adversary would try, against what an upload publishes now.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from dataset_files import form, npz_file

from backend.datasets import commitment, storage
from backend.datasets.formats import CanonicalDataset
from backend.datasets.models import Dataset, PrivacyRelease, RecordHash
from fl_node.data import record_digests
from fl_node.dp_count import COUNT_NOISE_STD, blob_capacity

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
    PrivacyRelease.objects.all().delete()  # the audit record protects its datasets
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
        "blob_bytes": len(storage.fetch(Dataset.objects.get().encrypted_reference)),
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
    for seen in published:  # the size registered is a DP count: the blob's size follows from it
        assert seen["blob_bytes"] == _padded_bytes(seen["samples"])


def _padded_bytes(registered: int) -> int:
    """The plaintext size of a stored blob whose dataset registered ``registered``: one record or
    many, the same (6 float features, the declared classes)."""
    one = CanonicalDataset(np.zeros((1, 6), np.float32), np.zeros(1, np.int64), CLASSES)
    return len(one.padded(blob_capacity(registered)))


def test_adding_a_record_changes_no_public_value_but_the_dp_count(provider, on_chain):
    """Add-remove: D = S and S + x. The chain's size is a noisy count (the node keeps the true
    one), and the swarm blob's size is a function of that count alone, so neither tells."""
    with_x, _ = _worlds()
    without_x = (with_x[0][:-1], with_x[1][:-1])
    for world, records in ((without_x, 60), (with_x, 61)):
        seen = _publish(provider, on_chain, *world)
        dataset = Dataset.objects.get()
        assert dataset.records == records and dataset.num_samples == seen["samples"]
        assert dataset.count_noise_std == COUNT_NOISE_STD
        assert seen["blob_bytes"] == _padded_bytes(seen["samples"])
        count = dataset.releases.get()  # the count is the dataset's first release, charged
        assert count.kind == "count" and count.noise_multiplier == 2 * COUNT_NOISE_STD
        assert count.micro_epsilon > 0


def test_a_record_with_a_label_no_other_record_has_leaves_the_schema_unchanged(provider, on_chain):
    """The schema (its hash on chain) holds the class list. Read from the labels present, it would
    grow by the one record whose label nobody else has: membership, certain. Declared, it is
    the same with or without that record; an upload that declares none is refused."""
    rng = np.random.default_rng(34)
    x, y = rng.random((41, 6)).astype(np.float32), rng.integers(0, 2, 41).astype(np.int64)
    y[-1] = 2  # the record only x has: the one rare label
    schemas = []
    for rows in (slice(0, 40), slice(0, 41)):
        PrivacyRelease.objects.all().delete()  # the audit record protects its datasets
        Dataset.objects.all().delete()
        RecordHash.objects.all().delete()
        response = provider.post(
            "/api/datasets", form(npz_file(x=x[rows], y=y[rows]), "npz", classes="0,1,2")
        )
        assert response.status_code == 201, response.content
        record = on_chain["ledger"].data.get_dataset(int(response.json()["onchain_id"]))
        schemas.append(bytes(record.schema_hash).hex())
    assert schemas[0] == schemas[1]
    PrivacyRelease.objects.all().delete()  # the audit record protects its datasets
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
