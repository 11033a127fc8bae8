"""Committee scoring: how good is the global model after applying one trainer's update?

In committee consensus (Li et al. 2020, "A Blockchain-based Decentralized
Federated Learning Framework with Committee Consensus", BFLC) each committee
member evaluates every submitted update on its own validation data and puts an
integer score on chain; the contract takes the median. A score here is a float
in [0, 1]: accuracy by default, or ``exp(-mean cross-entropy)`` for
``metric="likelihood"`` (1 for a perfect model, falling towards 0 as the loss
grows). :func:`fl_node.committee.score_to_int` turns it into the on-chain integer.

A score is a release of the member's validation records, so by default it is noised and
charged (``fl_node.privacy_plan``): the accuracy's correct-count gets Gaussian noise of std
``noise_multiplier`` (one record changes the count by at most 1), the likelihood's sum of
per-record cross-entropies is clipped per record to ``LOSS_CLIP`` and gets noise of std
``noise_multiplier * LOSS_CLIP``. The noise comes from a secret stream
(``fl_node.secure_random``). Without a multiplier (a job without DP, or a hold-out the
dataset declared public) the exact value is released.

Relative scores (:func:`relative_score_int`, the margin rule's honest reading): a member puts
the base model (the unchanged global model) at exactly :data:`BASE_SCORE` and every update at
``BASE_SCORE`` plus its gain over the base on the member's own data, in basis points. Every honest
member then agrees exactly on the base, so the base median cannot be dragged down by one
hostile member's base score of 0 (with absolute scores it falls to the lowest honest base, and
an accomplice's median, the highest honest score, clears it even for a free rider), and the
member-to-member spread of absolute scores (different validation sets) stays out of the median.
:func:`relative_update_score` is the whole honest reading of one update: its share of the
average, clipped to the round's bound (the norm the aggregation will allow it), scored relative
to the base.

Scoring must never crash a committee member on a hostile update: anything
malformed (undecodable bytes, wrong names or shapes, NaN/Inf, a model that
becomes non-finite) scores 0. Errors in the caller's own inputs (model,
validation data) still raise, since they are bugs, not attacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch
from torch import Tensor, nn

from fl_node.codec import CodecError, Update, check_update, decode_update, densify, update_spec
from fl_node.committee import MAX_SCORE, score_to_int
from fl_node.robust import median_norm, within_norm_bound
from fl_node.secure_random import NoiseSource, SecureRandom

K = TypeVar("K")
METRICS = ("accuracy", "likelihood")
# Per-record cross-entropy is clipped to this before it is summed: the sum's sensitivity.
LOSS_CLIP = 10.0
# The least a well-formed update's noisy score can be: one basis point.
NOISY_FLOOR = 1e-4


def _as_update(update: bytes | Update, global_state: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
    """The update as dense tensors matching the global model's float tensors, or None if malformed."""
    spec = update_spec(global_state)
    decoded: Update
    try:
        if isinstance(update, bytes | bytearray | memoryview):
            decoded = decode_update(update, expected=spec)
        elif isinstance(update, Mapping):
            check_update(update, expected=spec)
            decoded = update
        else:
            return None
        return {name: densify(value) for name, value in decoded.items()}
    except (CodecError, TypeError):
        return None


def merged_state(
    global_state: Mapping[str, Tensor], update: Mapping[str, Tensor]
) -> dict[str, Tensor] | None:
    """Global plus update; None if the sum overflows to Inf."""
    merged = {}
    for name, tensor in global_state.items():
        if name in update:
            tensor = torch.add(tensor, update[name])
            if not bool(torch.isfinite(tensor).all()):
                return None
        merged[name] = tensor
    return merged


def public_records(records: int | None) -> int:
    """The record count a noisy score is normalized by: required, positive (see :func:`evaluate`)."""
    if isinstance(records, bool) or not isinstance(records, int) or records < 1:
        raise ValueError(f"a noisy score needs the public record count it is normalized by, got {records!r}")
    return records


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x_val: Tensor,
    y_val: Tensor,
    *,
    batch_size: int,
    metric: str,
    noise_multiplier: float | None = None,
    randomness: NoiseSource | None = None,
    records: int | None = None,
) -> float:
    """Accuracy, or exp(-mean cross-entropy), of ``model`` on the validation set; 0 if an output is non-finite.

    With ``noise_multiplier`` the statistic is released with Gaussian noise (see the module
    docstring) and clamped to its range; a non-finite output then counts as a wrong record
    (or the clipped loss) rather than deciding the whole score. A noisy statistic is normalized
    by ``records``, the public count the plan assumes (:func:`public_records`), never by the
    set's own size (a count of the secret split): the release is then the accounted noisy
    statistic post-processed by public values alone.
    """
    model.eval()
    correct = 0
    loss_sum = 0.0
    for start in range(0, len(x_val), batch_size):
        logits = model(x_val[start : start + batch_size])
        targets = y_val[start : start + batch_size]
        finite = torch.isfinite(logits).all(dim=1)
        if not noise_multiplier and not bool(finite.all()):
            return 0.0
        # Under noise, whether a record's output is finite is a property of the record: it
        # must not decide the whole score. A non-finite output counts as wrong (or as the
        # clipped loss), inside the noisy statistic's sensitivity.
        if metric == "accuracy":
            correct += int(((logits.argmax(dim=1) == targets) & finite).sum())
        else:
            losses = nn.functional.cross_entropy(logits, targets, reduction="none")
            if noise_multiplier:
                usable = finite & torch.isfinite(losses)
                losses = torch.where(usable, losses.clamp(0.0, LOSS_CLIP), torch.full_like(losses, LOSS_CLIP))
            loss_sum += float(losses.sum())
    n = public_records(records) if noise_multiplier else len(x_val)
    if noise_multiplier:
        source = randomness if randomness is not None else SecureRandom()
        sensitivity = 1.0 if metric == "accuracy" else LOSS_CLIP
        noise = float(source.normal((1,), std=noise_multiplier * sensitivity, dtype=torch.float64))
        if metric == "accuracy":
            return min(max(correct + noise, 0.0), float(n)) / n
        return math.exp(-min(max(loss_sum + noise, 0.0), LOSS_CLIP * n) / n)
    if metric == "accuracy":
        return correct / n
    return math.exp(-loss_sum / n)


def score_update(
    model: nn.Module,
    global_state: Mapping[str, Tensor],
    update: bytes | Update,
    x_val: Tensor,
    y_val: Tensor,
    *,
    batch_size: int = 512,
    metric: str = "accuracy",
    noise_multiplier: float | None = None,
    randomness: NoiseSource | None = None,
    records: int | None = None,
) -> float:
    """Score in [0, 1] of ``global_state + update`` on (x_val, y_val); 0 for a malformed update.

    ``model`` is a scratch module of the right architecture: its weights are
    overwritten. ``update`` is encoded bytes or a decoded mapping; it must
    carry exactly the floating-point tensors of ``global_state``. ``noise_multiplier``
    (std of the count noise, see the module docstring) makes the score a DP release, normalized
    by the public ``records`` (required then: :func:`evaluate`); the caller charges it.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if len(x_val) == 0 or len(x_val) != len(y_val):
        raise ValueError(f"validation set is empty or mismatched: {len(x_val)} inputs, {len(y_val)} labels")
    dense = _as_update(update, global_state)
    if dense is None:
        return 0.0
    merged = merged_state(global_state, dense)
    if merged is None:
        return 0.0
    model.load_state_dict(merged, strict=True)
    value = evaluate(
        model,
        x_val,
        y_val,
        batch_size=batch_size,
        metric=metric,
        noise_multiplier=noise_multiplier,
        randomness=randomness,
        records=records,
    )
    value = min(1.0, max(0.0, value)) if value == value else 0.0
    if noise_multiplier:
        # 0 means "malformed" on chain (and is rejected); noise alone must not make a
        # well-formed update look malformed. Well-formedness was decided above from the update
        # alone, not from the records, so the floor is post-processing of the noisy release.
        value = max(value, NOISY_FLOOR)
    return value


def score_update_int(
    model: nn.Module,
    global_state: Mapping[str, Tensor],
    update: bytes | Update,
    x_val: Tensor,
    y_val: Tensor,
    *,
    batch_size: int = 512,
    metric: str = "accuracy",
    noise_multiplier: float | None = None,
    randomness: NoiseSource | None = None,
    records: int | None = None,
) -> int:
    """The on-chain integer score (basis points) of :func:`score_update`."""
    return score_to_int(
        score_update(
            model,
            global_state,
            update,
            x_val,
            y_val,
            batch_size=batch_size,
            metric=metric,
            noise_multiplier=noise_multiplier,
            randomness=randomness,
            records=records,
        )
    )


# The score an honest member gives the base model under relative scoring: the middle of the range,
# so that gains and losses up to half of it are both representable.
BASE_SCORE = MAX_SCORE // 2


def relative_score_int(value: float, base_value: float, allowance: float = 0.0) -> int:
    """The on-chain score of an update whose :func:`score_update` is ``value`` where the base
    model's is ``base_value``: ``BASE_SCORE`` plus the gain in basis points (rounded half to even),
    clamped to ``[1, MAX_SCORE]``; 0 for a malformed update (``value`` 0, see :func:`score_update`).
    ``allowance`` (:func:`noise_allowance`, 0 for exact scores) is added to the gain.

    Deterministic in its inputs; a member's base score is :data:`BASE_SCORE` itself. With the
    contract's margin rule (``median > base + margin``) an update is accepted only when the median
    member sees it gain more than ``margin`` basis points: a free rider gains exactly 0."""
    if not value == value or value <= 0.0:
        return 0
    if not base_value == base_value:
        raise ValueError("the base model's score is not a number")
    if not (allowance >= 0.0 and math.isfinite(allowance)):
        raise ValueError(f"allowance must be a finite number >= 0, got {allowance}")
    gain = round((value - base_value + allowance) * MAX_SCORE)
    return min(MAX_SCORE, max(1, BASE_SCORE + gain))


# How many standard deviations of the score noise a noisy relative score forgives (noise_allowance).
NOISE_TOLERANCE = 2.0


def noise_allowance(base_value: float, *, metric: str, noise_multiplier: float | None, records: int) -> float:
    """How far an honest update's noisy score may fall below the base model's by the noise alone:
    :data:`NOISE_TOLERANCE` standard deviations of the difference of two noisy scores (each update's
    and the base's draw their own noise). 0 for exact scores.

    Under DP a member's validation set cannot show that a 1/top_k step helps (the gain of an honest
    update is smaller than the noise), only that it clearly harms; without the allowance the margin
    rule would reject about half of the honest updates at random, and a round would average half as
    many DP-noised updates. With it a member says "not clearly harmful" instead, and the aggregation's
    defenses (median-norm clip, sign vote, backed magnitude) bound what a noisy committee lets in.
    Post-processing of the noisy base score and public values (the plan's noise, the record count):
    no privacy cost. accuracy: the count's noise is ``noise_multiplier`` records, ``/ records`` in
    score; likelihood: the clipped loss sum's noise is ``noise_multiplier * LOSS_CLIP``, the score
    ``exp(-loss / records)`` moves by about the score times the mean loss's noise."""
    if not noise_multiplier:
        return 0.0
    if records < 1:
        raise ValueError("a noisy score needs at least one record")
    if metric == "accuracy":
        score_std = noise_multiplier / records
    else:
        score_std = min(1.0, max(base_value, 0.0)) * noise_multiplier * LOSS_CLIP / records
    return NOISE_TOLERANCE * math.sqrt(2.0) * score_std


def scaled_update(
    update: bytes | Update, global_state: Mapping[str, Tensor], scale: float
) -> dict[str, Tensor] | None:
    """``scale`` times the update's float tensors (dense), or None for a malformed update."""
    if not 0.0 < scale <= 1.0:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    dense = _as_update(update, global_state)
    if dense is None:
        return None
    return {name: value * scale for name, value in dense.items()}


def _clipped(update: Mapping[str, Tensor], bound: float) -> dict[str, Tensor] | None:
    """``update`` shortened to L2 norm ``bound`` when longer; None when it is not finite."""
    total = sum(float((value.to(torch.float64) ** 2).sum()) for value in update.values())
    if not math.isfinite(total):
        return None
    norm = math.sqrt(total)
    if norm <= bound:
        return dict(update)
    return {name: value * (bound / norm) for name, value in update.items()}


def relative_update_score(
    model: nn.Module,
    global_state: Mapping[str, Tensor],
    update: bytes | Update,
    x_val: Tensor,
    y_val: Tensor,
    *,
    base_value: float,
    scale: float = 1.0,
    clip_norm: float | None = None,
    allowance: float = 0.0,
    batch_size: int = 512,
    metric: str = "likelihood",
    noise_multiplier: float | None = None,
    randomness: NoiseSource | None = None,
    records: int | None = None,
) -> int:
    """A committee member's relative on-chain score of one update (see the module docstring).

    ``base_value`` is this member's :func:`score_update` of the unchanged global model (a zero
    update, same data, metric and noise), computed once per round; the member submits
    :data:`BASE_SCORE` as its base score. ``scale`` is the share of the update evaluated (1 /
    top_k: the weight it would have in the average, so that a non-IID update is judged by the step
    it would make). ``clip_norm`` (the round's clipping bound, e.g. the median norm of its
    submissions, fl_node.robust.median_norm) shortens a longer update to that L2 norm first, as the
    aggregation will: the member scores the step that can be applied, so an update boosted to the
    job's norm bound gains no more from its length than the aggregate would give it. A malformed or
    non-finite update scores 0.
    """
    if clip_norm is not None and not (clip_norm > 0 and math.isfinite(clip_norm)):
        raise ValueError(f"clip_norm must be a positive number, got {clip_norm}")
    scaled = scaled_update(update, global_state, scale)
    if scaled is None:
        return 0
    if clip_norm is not None:
        scaled = _clipped(scaled, clip_norm * scale)
        if scaled is None:
            return 0
    value = score_update(
        model,
        global_state,
        scaled,
        x_val,
        y_val,
        batch_size=batch_size,
        metric=metric,
        noise_multiplier=noise_multiplier,
        randomness=randomness,
        records=records,
    )
    return relative_score_int(value, base_value, allowance)


# The key under which :func:`member_scores` draws the base model's noise (trainer keys are addresses).
BASE_KEY = "base"


def member_scores(
    model: nn.Module,
    global_state: Mapping[str, Tensor],
    updates: Mapping[K, Update | None],
    x_val: Tensor,
    y_val: Tensor,
    *,
    scale: float,
    norm_bound: float | None = None,
    clip_to_median: bool = True,
    batch_size: int = 512,
    metric: str = "likelihood",
    noise_multiplier: float | None = None,
    randomness: Callable[[K | str], NoiseSource | None] | None = None,
    records: int | None = None,
) -> dict[K, int]:
    """One honest committee member's relative scores of a round's updates, as the node's committee
    (backend.jobs.driver.committee) and the simulator both compute them; the member's base score is
    :data:`BASE_SCORE`.

    ``updates`` are the round's decoded updates by key (None: unreadable or malformed, scores 0). An
    update above ``norm_bound`` (or not finite) scores 0; the others are scored by
    :func:`relative_update_score` at ``scale`` (1 / top_k), clipped first (``clip_to_median``) to the
    median norm of those scorable updates (fl_node.robust.median_norm: the bound the aggregation
    will allow), against this member's score of the unchanged model. ``randomness(key)`` gives the
    noise stream of each release (:data:`BASE_KEY` for the base model's); None draws fresh noise.
    ``records``: the public count noisy scores are normalized by (required with
    ``noise_multiplier``; fl_node.job.plan.validation_records), not ``len(x_val)``."""

    def draw(key: K | str) -> NoiseSource | None:
        return randomness(key) if randomness is not None else None

    zero = {name: torch.zeros_like(t) for name, t in global_state.items() if t.is_floating_point()}
    base_value = score_update(
        model,
        global_state,
        zero,
        x_val,
        y_val,
        randomness=draw(BASE_KEY),
        batch_size=batch_size,
        metric=metric,
        noise_multiplier=noise_multiplier,
        records=records,
    )
    scorable = {k: u for k, u in updates.items() if u is not None and within_norm_bound(u, norm_bound)}
    clip = median_norm(scorable.values()) if clip_to_median else None
    allowance = (
        noise_allowance(
            base_value, metric=metric, noise_multiplier=noise_multiplier, records=public_records(records)
        )
        if noise_multiplier
        else 0.0
    )
    return {
        key: relative_update_score(
            model,
            global_state,
            scorable[key],
            x_val,
            y_val,
            base_value=base_value,
            scale=scale,
            clip_norm=clip,
            allowance=allowance,
            randomness=draw(key),
            batch_size=batch_size,
            metric=metric,
            noise_multiplier=noise_multiplier,
            records=records,
        )
        if key in scorable
        else 0
        for key in updates
    }
