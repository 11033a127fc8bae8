"""A dataset's secret, and everything public or shared that is derived from its records.

The DP adversary knows every record but one and a candidate x: any public value that is a
function of the records alone (an unkeyed hash, a hold-out reference derived from it, a split
seeded by it) tells it whether x is in. So each dataset gets a 32-byte secret, drawn at upload
and kept in this node's database only, and every such value is keyed with a key derived from
it, one label per use (HMAC-SHA256 as a PRF, as HKDF-Expand derives its keys):

* the **commitment** registered on chain: HMAC over the sorted record digests. Binding (the
  provider can open it by revealing the secret) and, to anyone without the secret, a uniform
  value independent of the records;
* the **public hold-out commitment** (``publicHoldoutHash`` on chain) over the hold-out's
  record digests;
* the **split key**: each record's side of a job's train / validation split, and of the
  public hold-out, is a keyed hash of that record alone (``fl_node.data.keyed_split``).

Nothing here is seeded by the content hash any more. What the node can no longer tell from
the chain (an upload of records another node registered) is in docs/PRIVACY.md.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

SECRET_BYTES = 32
PUBLIC_HOLDOUT_LABEL = "public-holdout"
_COMMITMENT = "commitment"
_HOLDOUT_COMMITMENT = "public-holdout-commitment"
_SPLIT = "split"
_COMMITMENT_DOMAIN = b"defl-dataset-commitment-v2\n"


def new_secret() -> str:
    """A fresh dataset secret (hex), from the operating system's random source."""
    return secrets.token_hex(SECRET_BYTES)


def _key(secret: str, use: str) -> bytes:
    raw = bytes.fromhex(secret)
    if len(raw) != SECRET_BYTES:
        raise ValueError(f"a dataset secret has {SECRET_BYTES} bytes")
    return hmac.new(raw, f"defl/{use}/v2".encode(), hashlib.sha256).digest()


def _keyed_set_hash(key: bytes, digests: Sequence[bytes]) -> str:
    """Order-insensitive: the same records in another order commit to the same value."""
    return hmac.new(key, _COMMITMENT_DOMAIN + b"".join(sorted(digests)), hashlib.sha256).hexdigest()


def commitment(secret: str, digests: Sequence[bytes]) -> str:
    """The dataset's commitment as the chain registers it (hex, 32 bytes)."""
    return _keyed_set_hash(_key(secret, _COMMITMENT), digests)


def split_key(secret: str) -> bytes:
    """The key of every split of this dataset's records (``fl_node.data.record_positions``)."""
    return _key(secret, _SPLIT)


def job_split_label(job_seed: int | str) -> str:
    """The split of one job: its public seed names it, so a restarted node splits the same way."""
    return f"job-seed:{job_seed}"


def public_holdout(secret: str, digests: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held out) indices of the dataset's one public hold-out, the same for every job."""
    # Imported here: the models import this module for new_secret, and these pull in torch.
    from fl_node.data import keyed_holdout
    from fl_node.privacy_plan import PUBLIC_HOLDOUT_FRACTION

    return keyed_holdout(split_key(secret), digests, PUBLIC_HOLDOUT_FRACTION, label=PUBLIC_HOLDOUT_LABEL)


def holdout_commitment(secret: str, digests: Sequence[bytes]) -> str:
    """The commitment to the public hold-out's records (``publicHoldoutHash`` on chain, hex)."""
    _, held = public_holdout(secret, digests)
    return _keyed_set_hash(_key(secret, _HOLDOUT_COMMITMENT), [digests[i] for i in held])


def job_holdout(
    secret: str, digests: Sequence[bytes], *, public: bool, val_fraction: float, job_seed: int | str
) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices of the dataset in one job.

    A dataset that declared its hold-out public validates on that hold-out in every job (its
    exactly-scored records never change and are never trained on); any other is split for the
    job, each record by its keyed position.
    """
    if public:
        return public_holdout(secret, digests)
    from fl_node.data import keyed_holdout

    return keyed_holdout(split_key(secret), digests, val_fraction, label=job_split_label(job_seed))
