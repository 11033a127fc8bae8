"""The committee rule: which updates a round accepts, and how committees are drawn.

This is the reference implementation of what the FederatedLearning contract executes on chain
(committee consensus as in BFLC, Li et al. 2020, "A Blockchain-based Decentralized Federated
Learning Framework with Committee Consensus", with the committee DRAWN rather than elected).
Both sides must agree bit for bit, so everything works on integers and bytes:

* A score is an integer in ``[0, MAX_SCORE]`` (accuracy in basis points).
  A malformed or non-finite update is scored 0 by every honest member.
* An update's score is the median of the scores that the committee members who
  revealed gave it: the LOWER of the middle pair for an even count. An update
  nobody scored has median 0.
* Accepted: the ``top_k`` best updates whose median beats the base model's by more
  than the job's margin (``median > base + margin``, ``base`` the median of the
  members' scores of the unchanged global model, 0 when none), best meaning a
  higher median, then a smaller ``keccak256(abi.encode(seed, 0, trainer))``.
  So a constant or random model, which scores no better than the model it would
  replace, is never accepted, and no trainer can grind an address that wins ties:
  the seed is unknown when it submits.
* Committees are DRAWN, never elected by rank (a ranking lets seated colluders
  elect their accomplices, who elect them back): the ``committee_size`` drawn
  participants with the smallest ``keccak256(abi.encode(seed, 1, address))``,
  participants banned for withholding a reveal only where too few others are left.
* Seeds come from secrets committed before anyone could see another's: the
  participants' draw secrets at the start (``first_seed``), the committee's score
  salts each round (``round_seed``), XORed as they are revealed (``mix_in``), so
  neither a caller nor a block producer chooses a draw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_SCORE = 10_000


def score_to_int(accuracy: float) -> int:
    """Map an accuracy in [0, 1] to the integer score that goes on chain."""
    if not accuracy == accuracy or accuracy <= 0:  # NaN or non-positive
        return 0
    return min(MAX_SCORE, int(accuracy * MAX_SCORE))


def median_score(scores: Sequence[int]) -> int:
    """The middle score, or the LOWER of the middle pair for even counts (as CommitteeRule.sol):
    an update passes only when more than half of the present scores put it above the threshold, so
    one colluder cannot carry it when an honest seat is silent (a mean would halve its 10000)."""
    if not scores:
        return 0
    ordered = sorted(scores)
    return ordered[(len(ordered) - 1) // 2]


def _keccak(data: bytes) -> bytes:
    from eth_utils import keccak  # the one keccak this package needs; eth-utils comes with web3

    return keccak(data)


def _word(value: int) -> bytes:
    return value.to_bytes(32, "big")


def _address_word(address: str) -> bytes:
    return bytes(12) + int(address, 16).to_bytes(20, "big")


def _tie_key(seed: bytes, address: str) -> bytes:
    """keccak256(abi.encode(bytes32 seed, 0, address trainer)), as CommitteeRule orders equal medians."""
    return _keccak(seed + _word(0) + _address_word(address))


def _draw_key(seed: bytes, address: str) -> int:
    """keccak256(abi.encode(bytes32 seed, 1, address)) >> 1, as JobLogic._drawCommittee ranks a seat."""
    return int.from_bytes(_keccak(seed + _word(1) + _address_word(address)), "big") >> 1


def mix_in(mix: bytes, value: bytes, address: str) -> bytes:
    """The mix after ``address`` revealed ``value`` (a draw secret or a score salt): XOR of
    keccak256(abi.encode(value, address)), so the order of reveals does not matter."""
    term = _keccak(value + _address_word(address))
    return bytes(a ^ b for a, b in zip(mix, term, strict=True))


def first_seed(mix: bytes, job_id: int) -> bytes:
    """The seed of the first committee: keccak256(abi.encode(mix, jobId)) over the draw secrets."""
    return _keccak(mix + _word(job_id))


def round_seed(seed: bytes, mix: bytes, round_: int) -> bytes:
    """The seed after round ``round_`` (RoundFinalized.seed): keccak256(abi.encode(seed, mix, round))."""
    return _keccak(seed + mix + _word(round_))


def skip_seed(seed: bytes) -> bytes:
    """The seed of the committee drawn when an aggregation is skipped: keccak256(abi.encode(seed, 2))."""
    return _keccak(seed + _word(2))


def draw_committee(
    seed: bytes, participants: Sequence[str], size: int, *, banned: Sequence[str] = ()
) -> list[str]:
    """The ``size`` participants (those that revealed their draw secret) with the smallest draw
    keys; banned ones rank after every other, so they sit only when too few others are left."""
    if len(seed) != 32:
        raise ValueError("seed must be 32 bytes")
    excluded = {b.lower() for b in banned}

    def key(address: str) -> int:
        return _draw_key(seed, address) | ((1 << 255) if address.lower() in excluded else 0)

    return sorted(participants, key=key)[:size]


@dataclass(frozen=True)
class RoundOutcome:
    medians: dict[str, int]
    ranking: list[str]  # every trainer, best first (the accepted are its head, above the threshold)
    accepted: list[str]
    base_median: int = 0


def decide_round(
    trainers: Sequence[str],
    scores: Mapping[str, Mapping[str, int]],
    *,
    top_k: int,
    base_scores: Mapping[str, int] | None = None,
    margin: int = 0,
    seed: bytes = bytes(32),
) -> RoundOutcome:
    """Apply the committee rule to one round.

    ``trainers`` are the addresses that submitted an update (hex strings);
    ``scores[member][trainer]`` is the score that committee member gave the
    trainer's update (members who did not reveal are simply absent);
    ``base_scores[member]`` is the score that member gave the unchanged global model;
    ``seed`` (32 bytes) orders equal medians (the chain's is RoundFinalized.seed).
    """
    if len(seed) != 32:
        raise ValueError("seed must be 32 bytes")
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    if len(set(trainers)) != len(trainers):
        raise ValueError("a trainer appears twice")
    if not 0 <= margin <= MAX_SCORE:
        raise ValueError(f"margin {margin} is outside [0, {MAX_SCORE}]")
    for member, value in (base_scores or {}).items():
        if not 0 <= value <= MAX_SCORE:
            raise ValueError(f"base score {value} from {member} is outside [0, {MAX_SCORE}]")
    for member_scores in scores.values():
        for trainer, value in member_scores.items():
            if not 0 <= value <= MAX_SCORE:
                raise ValueError(f"score {value} for {trainer} is outside [0, {MAX_SCORE}]")
    medians = {
        trainer: median_score([member[trainer] for member in scores.values() if trainer in member])
        for trainer in trainers
    }
    ranking = sorted(trainers, key=lambda t: (-medians[t], _tie_key(seed, t)))
    base = median_score(list((base_scores or {}).values()))
    accepted = [t for t in ranking if medians[t] > base + margin][:top_k]
    return RoundOutcome(medians=medians, ranking=ranking, accepted=accepted, base_median=base)
