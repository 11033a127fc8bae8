"""A dataset's size, released once as a DP count, so that no exact size is ever public.

Add/remove adjacency (neighbours differ by one record added or removed) protects a record
only if nothing public tells D from D plus x. The exact size would, so a dataset registers
``registered = max(1, round(n + N(0, COUNT_NOISE_STD^2)))`` instead (from a secret stream),
and every public number of the dataset follows from that count alone: its plan (sampling rate,
steps, delta bound), each update's weight, the score normalizer, and its stored blob's size
(:func:`blob_capacity`: the records padded to a capacity of the count plus six standard
deviations). The count is the dataset's first release (``count_release``), charged to its
budget and recorded on chain with its registration.

The cost is small: a Gaussian count of sensitivity 1 costs alpha / (2 s^2) at Renyi order
alpha, 1/800 of alpha at s = 20, against about a hundredth of a job at epsilon 3 at the order
that decides it. Twenty records of uncertainty moves a plan's sampling rate by 2% for a
thousand records.
"""

from __future__ import annotations

import math

from fl_node.privacy import ReleasePlan
from fl_node.secure_random import NoiseSource, SecureRandom

# A protocol constant: every member plans every participant with it.
COUNT_NOISE_STD = 20.0
# The stored blob holds room for this many standard deviations above the count: a dataset with
# more records than that (probability 1e-9) stores its first ``capacity`` records only.
CAPACITY_SIGMAS = 6


def noisy_count(records: int, *, std: float = COUNT_NOISE_STD, randomness: NoiseSource | None = None) -> int:
    """The count a dataset of ``records`` records registers: at least 1, rounded."""
    if isinstance(records, bool) or not isinstance(records, int) or records < 1:
        raise ValueError(f"a dataset needs at least one record, got {records!r}")
    if not std > 0 or not math.isfinite(std):
        raise ValueError(f"the count's noise must be a positive number, got {std}")
    import torch

    source = randomness if randomness is not None else SecureRandom()
    noise = float(source.normal((1,), std=std, dtype=torch.float64)[0])
    return max(1, round(records + noise))


def blob_capacity(registered: int, *, std: float = COUNT_NOISE_STD) -> int:
    """How many records the stored blob of a dataset that registered ``registered`` holds
    (real ones first, then padding): a function of the public count alone."""
    if isinstance(registered, bool) or not isinstance(registered, int) or registered < 1:
        raise ValueError(f"a registered count is a positive integer, got {registered!r}")
    return registered + math.ceil(CAPACITY_SIGMAS * std)


def count_release(std: float = COUNT_NOISE_STD) -> ReleasePlan:
    """The count's release as the accountant records it: sensitivity 1 under add/remove, so a
    per-record bound of 1/2 (the multiplier is twice the std), unsampled, one step."""
    return ReleasePlan("count", 2.0 * std, 1.0, 1)
