"""The committee rule: which updates a round accepts and who sits on the next committee.

This is the reference implementation of the rule that the FederatedLearning
contract executes on chain (committee consensus as in BFLC, Li et al. 2020,
"A Blockchain-based Decentralized Federated Learning Framework with Committee
Consensus"). Both sides must agree bit for bit, so the rule works on integers
only and every tie is broken the same way:

* A score is an integer in ``[0, MAX_SCORE]`` (accuracy in basis points).
  A malformed or non-finite update is scored 0 by every honest member.
* An update's score is the median of the scores that the committee members who
  submitted gave it; for an even count it is the floor of the mean of the two
  middle values. An update nobody scored has median 0.
* Ranking: higher median first; equal medians are ordered by
  ``keccak256(abi.encode(tie_seed, trainer))``, smaller first. The contract draws
  ``tie_seed`` from the block that finalizes the round (``RoundFinalized.tieSeed``),
  after every update was sent, so no trainer can grind an address that wins ties
  (a lowest-address rule would reward exactly that).
* Accepted: the first ``top_k`` ranked updates whose median beats the base
  model's by more than the job's margin: ``median > base + margin``, where
  ``base`` is the median of the committee's scores of the unchanged global model
  (0 when the round has no base scores, which gives the plain "median above 0").
  So a constant or random model, which scores no better than the model it would
  replace, is never accepted.
* Next committee: the first ``committee_size`` ranked trainers (score 0 included,
  ranked last). Committee members do not train, so a member is never elected
  twice in a row and no node stays on the committee forever. Where the round
  had fewer trainers than seats, the remaining seats are filled by the current
  committee in its order.
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


def _tie_key(tie_seed: bytes, address: str) -> bytes:
    """keccak256(abi.encode(bytes32 tie_seed, address trainer)), as CommitteeRule computes it."""
    from eth_utils import keccak  # the one keccak this package needs; eth-utils comes with web3

    return keccak(tie_seed + bytes(12) + int(address, 16).to_bytes(20, "big"))


@dataclass(frozen=True)
class RoundOutcome:
    medians: dict[str, int]
    ranking: list[str]
    accepted: list[str]
    next_committee: list[str]
    base_median: int = 0


def decide_round(
    trainers: Sequence[str],
    scores: Mapping[str, Mapping[str, int]],
    *,
    top_k: int,
    committee_size: int,
    current_committee: Sequence[str] = (),
    base_scores: Mapping[str, int] | None = None,
    margin: int = 0,
    tie_seed: bytes = bytes(32),
) -> RoundOutcome:
    """Apply the committee rule to one round.

    ``trainers`` are the addresses that submitted an update (hex strings);
    ``scores[member][trainer]`` is the score that committee member gave the
    trainer's update (members who did not submit are simply absent);
    ``base_scores[member]`` is the score that member gave the unchanged global model;
    ``tie_seed`` (32 bytes) orders equal medians (the chain's is in RoundFinalized).
    """
    if len(tie_seed) != 32:
        raise ValueError("tie_seed must be 32 bytes")
    if top_k < 1:
        raise ValueError("top_k must be at least 1")
    if committee_size < 1:
        raise ValueError("committee_size must be at least 1")
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
    ranking = sorted(trainers, key=lambda t: (-medians[t], _tie_key(tie_seed, t)))
    base = median_score(list((base_scores or {}).values()))
    accepted = [t for t in ranking if medians[t] > base + margin][:top_k]
    next_committee = ranking[:committee_size]
    for member in current_committee:
        if len(next_committee) >= committee_size:
            break
        if member not in next_committee:
            next_committee.append(member)
    return RoundOutcome(
        medians=medians, ranking=ranking, accepted=accepted, next_committee=next_committee, base_median=base
    )
