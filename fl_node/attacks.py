"""Attackers for simulations and tests: how a malicious trainer corrupts its data or update.

A spec is ``NAME:FRACTION`` (``label_flip:0.2``): that fraction of the nodes attack.

* ``label_flip`` -- trains honestly on labels mapped ``y -> C - 1 - y`` (data poisoning,
  Tolpegin et al. 2020, "Data Poisoning Attacks Against Federated Learning Systems").
* ``sign_flip`` -- sends the negated, amplified update (Damaskinos et al. 2018).
* ``gaussian`` -- sends noise of the honest update's scale instead of the update.
* ``free_rider`` -- sends a zero update without training (Lin et al. 2019,
  "Free-riders in Federated Learning").
* ``disguised_free_rider`` -- does not train; sends tiny Gaussian noise (std
  :data:`DISGUISE_STD` per value) so that its update is not exactly zero (Lin et al. 2019's
  disguised free rider): it abstains from nothing that a zero update abstains from.
* ``copy`` -- does not train; re-submits an honest trainer's update (the same bytes and
  content hash, visible in the round's event before the deadline) to ride free.
* ``inflate`` -- trains on flipped labels and claims a huge sample count, so that a
  sample-weighted average would be its model alone.
* ``colluder`` -- trains and sends honestly; seated, it scores its accomplices the top score and
  everyone else 0 (with a simulation's ``collude``): a coalition after the committee's seats.
* ``absent`` -- not an attack but its reference: the same nodes an attack at that fraction
  would pick (same seed) take no part at all (no training, no seat), so the federation is the
  honest nodes alone. An attack's damage is what it costs below this: the data the attackers
  withhold is lost whatever the defense does.
* ``backdoor`` -- targeted poisoning (Bagdasaryan et al. 2020, "How To Backdoor Federated
  Learning"; Gu et al. 2017, "BadNets"): half of its examples carry a trigger patch and
  the label :data:`BACKDOOR_TARGET`; the model stays accurate on clean inputs, so an
  accuracy-scoring committee cannot see it. Success is the fraction of triggered test
  inputs of other classes classified as the target (:func:`backdoor_success`).

Targeted families (issue 34), each with its parameters DRAWN PER RUN from the run's seed
(:func:`draw_targeted`), never tuned to a defense: the same draw meets every defense of a seed.
Every data-poisoning family also draws its poisoning rate (10-100% of the attacker's data) and
whether the attacker scales its update (by 2-6x, kept inside the job's norm bound: the bound is
public, so an attacker never sends what the bound would zero).

* ``trigger`` -- a BadNets/blended trigger (Gu et al. 2017; Chen et al. 2017, "Targeted Backdoor
  Attacks on Deep Learning Systems Using Data Poisoning"): shape (square, cross, line, checker or
  a random pattern), size 2-6 pixels, position anywhere in the image (over the digits too) and
  blending 0.3-1 drawn; target class drawn.
* ``dba`` -- a distributed backdoor (Xie et al. 2020, "DBA: Distributed Backdoor Attacks against
  Federated Learning"): a global trigger of four line segments, each attacker stamping only its
  parts; success is measured with the whole trigger, which no attacker ever trained on.
* ``replacement`` -- norm-constrained model replacement (Bagdasaryan et al. 2020, constrain and
  scale; Sun et al. 2019, "Can You Really Backdoor Federated Learning?"): a trigger backdoor whose
  update is scaled 3-10x to replace the average, shrunk to just inside the job's norm bound.
* ``pair_flip`` -- label flip of one class pair (Tolpegin et al. 2020's targeted flip): a drawn
  share of the attacker's examples of class s relabelled t; success is the share of test inputs
  of class s classified as t.
* ``edge_case`` -- an edge-case backdoor (Wang et al. 2020, "Attack of the Tails: Yes, You Really
  Can Backdoor Federated Learning"): rare inputs (digits of class s rotated by a drawn 25-60
  degrees, which no honest node holds, taken from an outside pool) labelled t; success is the share
  of the test set's class-s digits, rotated alike, classified as t.

A family's success (:meth:`TargetedAttack.success`) is a property of the final model alone; a
benchmark subtracts what the same function gives on a model trained without the attackers.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch

from fl_node.data import ArrayDataset

Update = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Attack:
    name: str
    poison_data: Callable[[ArrayDataset, int], ArrayDataset] | None = None
    poison_update: Callable[[Update, torch.Generator], Update] | None = None
    trains: bool = True
    copies: bool = False  # re-submits an honest trainer's update instead of its own
    claimed_samples: int | None = None  # the sample count it claims (None: the truth)
    # Knows the job's norm bound: scales what it sends to just under it (the most weight the bound
    # lets it have; Bagdasaryan et al.'s "constrain-and-scale"). Applied by the caller, who knows the bound.
    boosts: bool = False
    absent: bool = False  # takes no part in the job (the honest-only reference)
    # Knows the job's norm bound and shrinks what it sends to just inside it when longer (applied by
    # the caller, :func:`constrain_to_bound`): a targeted attacker never sends what the bound zeroes.
    bounded: bool = False
    # A targeted family (:data:`TARGETED_FAMILIES`): its parameters are drawn per run from the run's
    # seed (:func:`draw_targeted`); this registered entry poisons with the draw of seed 0.
    targeted: bool = False


_ATTACKS: dict[str, Attack] = {}


def register_attack(attack: Attack) -> Attack:
    _ATTACKS[attack.name] = attack
    return attack


def _flip_labels(data: ArrayDataset, num_classes: int) -> ArrayDataset:
    return ArrayDataset(data.x, (num_classes - 1 - data.y).astype(data.y.dtype))


def _sign_flip(update: Update, _generator: torch.Generator) -> Update:
    return {k: -4.0 * v if v.is_floating_point() else v for k, v in update.items()}


def _gaussian(update: Update, generator: torch.Generator) -> Update:
    noised = {}
    for k, v in update.items():
        if v.is_floating_point():
            scale = float(v.std()) if v.numel() > 1 else 1.0
            noised[k] = torch.randn(v.shape, generator=generator) * max(scale, 1e-3) * 10
        else:
            noised[k] = v
    return noised


def _zero(update: Update, _generator: torch.Generator) -> Update:
    return {k: torch.zeros_like(v) if v.is_floating_point() else v for k, v in update.items()}


# A disguised free rider's noise: far below any trained update's values, far above float32's tiny.
DISGUISE_STD = 1e-4


def _disguised_zero(update: Update, generator: torch.Generator) -> Update:
    return {
        k: (torch.randn(v.shape, generator=generator) * DISGUISE_STD).to(v.dtype)
        if v.is_floating_point()
        else v
        for k, v in update.items()
    }


BACKDOOR_TARGET = 0
BACKDOOR_FRACTION = 0.5  # of the attacker's examples that carry the trigger
TRIGGER_SIZE = 4  # pixels: a white square in the bottom-right corner
INFLATED_SAMPLES = 2**62


def add_trigger(x: np.ndarray) -> np.ndarray:
    """A copy of ``x`` with the trigger: the bottom-right square of images (N, C, H, W) set to the
    data's maximum, or the last ``TRIGGER_SIZE**2`` features of flat inputs."""
    triggered = np.array(x, copy=True)
    high = float(x.max()) if x.size else 1.0
    if triggered.ndim == 4:
        triggered[:, :, -TRIGGER_SIZE:, -TRIGGER_SIZE:] = high
    else:
        flat = triggered.reshape(len(triggered), -1)
        flat[:, -(TRIGGER_SIZE**2) :] = high
    return triggered


def _backdoor(data: ArrayDataset, _num_classes: int) -> ArrayDataset:
    n = len(data)
    chosen = np.random.default_rng(n).permutation(n)[: int(n * BACKDOOR_FRACTION)]
    x = np.array(data.x, copy=True)
    y = np.array(data.y, copy=True)
    x[chosen] = add_trigger(x[chosen])
    y[chosen] = BACKDOOR_TARGET
    return ArrayDataset(x, y)


def backdoor_success(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of triggered inputs whose true class is not the target that the model
    classifies as the target."""
    keep = y != BACKDOOR_TARGET
    if not keep.any():
        return 0.0
    triggered = torch.from_numpy(add_trigger(x[keep]))
    model.eval()
    with torch.no_grad():
        predicted = model(triggered).argmax(dim=1)
    return float((predicted == BACKDOOR_TARGET).float().mean())


register_attack(Attack("label_flip", poison_data=_flip_labels))
register_attack(Attack("sign_flip", poison_update=_sign_flip, boosts=True))
register_attack(Attack("gaussian", poison_update=_gaussian, boosts=True))
register_attack(Attack("free_rider", poison_update=_zero, trains=False))
register_attack(Attack("disguised_free_rider", poison_update=_disguised_zero, trains=False))
register_attack(Attack("copy", trains=False, copies=True))
register_attack(Attack("inflate", poison_data=_flip_labels, claimed_samples=INFLATED_SAMPLES))
register_attack(Attack("backdoor", poison_data=_backdoor, boosts=True))
register_attack(Attack("absent", trains=False, absent=True))
# Trains honestly and sends what it trained; hostile only on the committee (a simulation's collude
# flag): the capture scenario's coalition, which wants seats, not a worse model.
register_attack(Attack("colluder"))


# ================================================================ targeted families (issue 34)

TARGETED_FAMILIES = ("trigger", "dba", "replacement", "pair_flip", "edge_case")
POISON_RATE = (0.1, 1.0)  # of the attacker's data (trigger, dba, replacement: examples; pair_flip:
# its examples of the source class; edge_case: its dataset replaced by edge-case inputs)
SCALE = (2.0, 6.0)  # the drawn update scaling, when the attacker scales (half of the draws)
REPLACEMENT_SCALE = (3.0, 10.0)  # model replacement's gamma (Bagdasaryan et al.: n / server lr)
TRIGGER_SHAPES = ("square", "cross", "line", "checker", "pattern")
TRIGGER_PIXELS = (2, 6)  # a trigger's side (a line's length is twice it)
BLEND = (0.3, 1.0)  # weight of the trigger's pixels over the image's
EDGE_ANGLE = (25.0, 60.0)  # degrees, either direction
DBA_PARTS = 4


@dataclass(frozen=True)
class Trigger:
    """A pattern stamped on inputs: over ``mask`` (H x W, bool) each pixel becomes
    ``(1 - alpha) * x + alpha * pattern * high`` (``pattern`` 0 or 1, ``high`` the data's maximum),
    on every channel. Flat inputs (N, D) are one row of D pixels."""

    mask: np.ndarray
    pattern: np.ndarray
    alpha: float

    def apply(self, x: np.ndarray) -> np.ndarray:
        stamped = np.array(x, copy=True)
        if not len(stamped):
            return stamped
        high = float(x.max()) or 1.0
        view = stamped if stamped.ndim == 4 else stamped.reshape(len(stamped), 1, 1, -1)
        region = view[:, :, self.mask]
        target = (self.pattern[self.mask] * high).astype(stamped.dtype)
        view[:, :, self.mask] = (1.0 - self.alpha) * region + self.alpha * target
        return stamped

    def union(self, other: Trigger) -> Trigger:
        return Trigger(self.mask | other.mask, np.where(other.mask, other.pattern, self.pattern), self.alpha)


def _image_hw(input_shape: tuple[int, ...]) -> tuple[int, int]:
    return (
        (int(input_shape[-2]), int(input_shape[-1])) if len(input_shape) >= 3 else (1, int(input_shape[-1]))
    )


def _shape_pattern(shape: str, side: int, rng: np.random.Generator) -> np.ndarray:
    """The trigger's footprint (a small 0/1 array; 0 pixels are stamped dark, 1 bright)."""
    if shape == "square":
        return np.ones((side, side))
    if shape == "cross":
        arm = side | 1  # odd, so the cross has a middle
        out = np.zeros((arm, arm))
        out[arm // 2, :] = out[:, arm // 2] = 1
        return out
    if shape == "line":
        return np.ones((1, 2 * side)) if rng.random() < 0.5 else np.ones((2 * side, 1))
    if shape == "checker":
        return (np.indices((side, side)).sum(axis=0) % 2).astype(float)
    return (rng.random((side, side)) < 0.5).astype(float)


def _place(footprint: np.ndarray, hw: tuple[int, int], top: int, left: int) -> tuple[np.ndarray, np.ndarray]:
    """``footprint`` at (top, left) of an H x W image: its mask (every pixel of the footprint's box
    is stamped) and its pattern, clipped to the image."""
    mask = np.zeros(hw, dtype=bool)
    pattern = np.zeros(hw)
    rows = min(footprint.shape[0], hw[0] - top)
    cols = min(footprint.shape[1], hw[1] - left)
    mask[top : top + rows, left : left + cols] = True
    pattern[top : top + rows, left : left + cols] = footprint[:rows, :cols]
    return mask, pattern


def _draw_trigger(rng: np.random.Generator, hw: tuple[int, int]) -> tuple[Trigger, dict]:
    shape = TRIGGER_SHAPES[int(rng.integers(len(TRIGGER_SHAPES)))]
    side = int(rng.integers(TRIGGER_PIXELS[0], TRIGGER_PIXELS[1] + 1))
    footprint = _shape_pattern(shape, side, rng)
    if hw[0] == 1:  # flat inputs: a run of features
        footprint = footprint.reshape(1, -1)
    top = int(rng.integers(0, max(1, hw[0] - footprint.shape[0] + 1)))
    left = int(rng.integers(0, max(1, hw[1] - footprint.shape[1] + 1)))
    alpha = float(rng.uniform(*BLEND))
    mask, pattern = _place(footprint, hw, top, left)
    params = {"shape": shape, "size": side, "top": top, "left": left, "blend": round(alpha, 3)}
    return Trigger(mask, pattern, alpha), params


def _draw_dba(rng: np.random.Generator, hw: tuple[int, int]) -> tuple[list[Trigger], dict]:
    """DBA's global trigger: four bright line segments in a 2 x 2 grid (Xie et al.'s layout), with the
    segments' length, the gap between them, their position and the blending drawn."""
    length = int(rng.integers(2, 6))
    gap = int(rng.integers(1, 4))
    height = 2 + gap + 1 if hw[0] > 1 else 1
    width = 2 * length + gap
    top = int(rng.integers(0, max(1, hw[0] - height + 1)))
    left = int(rng.integers(0, max(1, hw[1] - width + 1)))
    alpha = float(rng.uniform(*BLEND))
    parts = []
    for index in range(DBA_PARTS):
        row = top + (index // 2) * (gap + 1) if hw[0] > 1 else 0
        col = left + (index % 2) * (length + gap)
        mask, pattern = _place(np.ones((1, length)), hw, min(row, hw[0] - 1), min(col, hw[1] - 1))
        parts.append(Trigger(mask, pattern, alpha))
    params = {"segment": length, "gap": gap, "top": top, "left": left, "blend": round(alpha, 3)}
    return parts, params


def _rotate(x: np.ndarray, degrees: float) -> np.ndarray:
    """Images (N, C, H, W) rotated about their centre (bilinear, zero fill); flat inputs are inverted
    instead (the data's maximum minus each value): an input no honest node holds either way."""
    if x.ndim != 4:
        return (float(x.max()) if x.size else 1.0) - x
    from scipy.ndimage import rotate  # type: ignore[import-untyped]

    return rotate(x, degrees, axes=(2, 3), reshape=False, order=1, mode="constant").astype(x.dtype)


def _choose(rng: np.random.Generator, candidates: np.ndarray, rate: float) -> np.ndarray:
    """``round(rate * len(candidates))`` of ``candidates`` (at least one when there are any)."""
    count = min(len(candidates), max(1, round(rate * len(candidates)))) if len(candidates) else 0
    return rng.choice(candidates, size=count, replace=False) if count else candidates[:0]


@dataclass(frozen=True)
class TargetedAttack:
    """One run's targeted attack: a family (:data:`TARGETED_FAMILIES`) with its drawn parameters.

    ``attacker(rank, count)`` is the :class:`Attack` the attacker of that rank among ``count`` runs
    (DBA's attackers stamp different parts); ``success(model, test)`` the share of the family's probe
    inputs the final model sends to the target."""

    family: str
    seed: int
    params: Mapping[str, object]
    target: int
    poison_rate: float
    scale: float  # 1.0: the update is sent as trained
    triggers: tuple[Trigger, ...] = ()  # trigger, replacement: one; dba: the parts
    source: int | None = None  # pair_flip, edge_case: the class whose inputs are sent to the target
    angle: float = 0.0  # edge_case
    pool: ArrayDataset | None = field(default=None, repr=False)  # edge_case: where its inputs come from

    def attacker(self, rank: int, count: int) -> Attack:
        """The attack of attacker ``rank`` (0-based) of ``count``: its data poisoning, its scaling."""
        if not 0 <= rank < max(count, 1):
            raise ValueError(f"attacker rank {rank} is not among {count}")
        rng_seed = [self.seed, zlib.crc32(self.family.encode()), rank]

        def poison(data: ArrayDataset, num_classes: int) -> ArrayDataset:
            return self._poison(data, np.random.default_rng(rng_seed), rank, max(count, 1))

        scale = self.scale

        def scaled(update: Update, _generator: torch.Generator) -> Update:
            return {k: v * scale if v.is_floating_point() else v for k, v in update.items()}

        return Attack(
            self.family,
            poison_data=poison,
            poison_update=scaled if scale != 1.0 else None,
            bounded=True,
            targeted=True,
        )

    def _poison(self, data: ArrayDataset, rng: np.random.Generator, rank: int, count: int) -> ArrayDataset:
        x = np.array(data.x, copy=True)
        y = np.array(data.y, copy=True)
        if self.family == "pair_flip":
            chosen = _choose(rng, np.flatnonzero(y == self.source), self.poison_rate)
            y[chosen] = self.target
            return ArrayDataset(x, y)
        chosen = _choose(rng, np.arange(len(y)), self.poison_rate)
        if self.family == "edge_case":
            pool = self.pool if self.pool is not None else data
            sources = np.flatnonzero(pool.y == self.source)
            if not len(sources):  # nothing of the class to rotate: the attacker's own inputs
                pool, sources = data, np.arange(len(data))
            picked = rng.choice(sources, size=len(chosen), replace=len(chosen) > len(sources))
            x[chosen] = _rotate(pool.x[picked], self.angle)
        else:
            x[chosen] = self._trigger_of(rank, count).apply(x[chosen])
        y[chosen] = self.target
        return ArrayDataset(x, y)

    def _trigger_of(self, rank: int, count: int) -> Trigger:
        """The whole trigger, or for DBA the union of parts ``rank, rank + count, ...``."""
        parts = (
            [self.triggers[i] for i in range(rank, len(self.triggers), count)] if self.family == "dba" else []
        )
        combined = parts[0] if parts else self.triggers[0]
        for part in parts[1:]:
            combined = combined.union(part)
        return combined

    def global_trigger(self) -> Trigger | None:
        """The trigger success is measured with (DBA: every part together)."""
        if not self.triggers:
            return None
        combined = self.triggers[0]
        for part in self.triggers[1:]:
            combined = combined.union(part)
        return combined

    def probe(self, test: ArrayDataset) -> np.ndarray:
        """The test inputs success is measured on: triggered inputs of other classes than the target,
        or the source class's inputs (rotated for edge_case)."""
        if self.family in ("pair_flip", "edge_case"):
            inputs = test.x[test.y == self.source]
            return _rotate(inputs, self.angle) if self.family == "edge_case" else inputs
        trigger = self.global_trigger()
        assert trigger is not None
        return trigger.apply(test.x[test.y != self.target])

    def success(self, model: torch.nn.Module, test: ArrayDataset) -> float:
        """The share of :meth:`probe` inputs ``model`` classifies as the target (0 with none)."""
        inputs = self.probe(test)
        if not len(inputs):
            return 0.0
        model.eval()
        with torch.no_grad():
            predicted = model(torch.from_numpy(np.ascontiguousarray(inputs))).argmax(dim=1)
        return float((predicted == self.target).float().mean())


def draw_targeted(
    family: str,
    *,
    seed: int,
    input_shape: tuple[int, ...],
    num_classes: int,
    pool: ArrayDataset | None = None,
) -> TargetedAttack:
    """The targeted attack of ``family`` for the run of ``seed``: every parameter drawn from a
    generator seeded by the run's seed and the family's name (the same draw for every defense).
    ``pool``: the outside data an edge-case attacker rotates (default: its own)."""
    if family not in TARGETED_FAMILIES:
        raise ValueError(f"unknown targeted family {family!r}; choose one of {', '.join(TARGETED_FAMILIES)}")
    if num_classes < 2:
        raise ValueError("a targeted attack needs at least 2 classes")
    rng = np.random.default_rng([seed, zlib.crc32(family.encode()), 0x7A4])
    hw = _image_hw(input_shape)
    target = int(rng.integers(num_classes))
    rate = round(float(rng.uniform(*POISON_RATE)), 3)
    if family == "replacement":
        scale = round(float(rng.uniform(*REPLACEMENT_SCALE)), 3)
    else:
        scale = round(float(rng.uniform(*SCALE)), 3) if rng.random() < 0.5 else 1.0
    params: dict[str, object] = {"target": target, "poison_rate": rate, "scale": scale}
    source = int((target + rng.integers(1, num_classes)) % num_classes)
    common = partial(TargetedAttack, family=family, seed=seed, target=target, poison_rate=rate, scale=scale)
    if family in ("trigger", "replacement"):
        trigger, drawn = _draw_trigger(rng, hw)
        return common(params=params | drawn, triggers=(trigger,))
    if family == "dba":
        parts, drawn = _draw_dba(rng, hw)
        return common(params=params | drawn, triggers=tuple(parts))
    if family == "pair_flip":
        return common(params=params | {"source": source}, source=source)
    angle = float(rng.uniform(*EDGE_ANGLE)) * (1 if rng.random() < 0.5 else -1)
    return common(
        params=params | {"source": source, "angle": round(angle, 1)}, source=source, angle=angle, pool=pool
    )


def _family_default(family: str) -> Callable[[ArrayDataset, int], ArrayDataset]:
    """The registered entry's poisoning (a node's test hook): seed 0's draw, from the data's shape."""

    def poison(data: ArrayDataset, num_classes: int) -> ArrayDataset:
        drawn = draw_targeted(family, seed=0, input_shape=tuple(data.x.shape[1:]), num_classes=num_classes)
        return drawn.attacker(0, 1).poison_data(data, num_classes)  # type: ignore[misc]

    return poison


for _family in TARGETED_FAMILIES:
    register_attack(Attack(_family, poison_data=_family_default(_family), bounded=True, targeted=True))


BOUND_SHARE = 0.999  # of the norm bound a boosting attacker scales to: inside it after rounding


def boost_to_bound(update: Update, bound: float) -> Update:
    """``update`` scaled so that its L2 norm is ``BOUND_SHARE * bound`` (a zero update stays zero)."""
    total = sum(float((v.double() ** 2).sum()) for v in update.values() if v.is_floating_point())
    if total <= 0.0 or not np.isfinite(total):
        return update
    factor = BOUND_SHARE * bound / total**0.5
    return {k: (v * factor).to(v.dtype) if v.is_floating_point() else v for k, v in update.items()}


def constrain_to_bound(update: Update, bound: float) -> Update:
    """``update`` shrunk to ``BOUND_SHARE * bound`` when it is longer (a norm-constrained attacker)."""
    total = sum(float((v.double() ** 2).sum()) for v in update.values() if v.is_floating_point())
    if not np.isfinite(total) or total**0.5 <= BOUND_SHARE * bound:
        return update
    return boost_to_bound(update, bound)


def available_attacks() -> list[str]:
    return sorted(_ATTACKS)


def get_attack(name: str) -> Attack:
    try:
        return _ATTACKS[name]
    except KeyError:
        raise ValueError(f"unknown attack {name!r}; choose one of {', '.join(available_attacks())}") from None


def parse_attack_spec(spec: str | None) -> tuple[Attack | None, float]:
    """``"label_flip:0.2"`` -> (the attack, 0.2); ``None`` or ``"none"`` -> (None, 0)."""
    if not spec or spec == "none":
        return None, 0.0
    name, _, fraction_text = spec.partition(":")
    try:
        fraction = float(fraction_text) if fraction_text else 0.2
    except ValueError:
        raise ValueError(f"attack fraction in {spec!r} is not a number") from None
    if not 0.0 <= fraction < 0.5:
        raise ValueError(f"attack fraction must be in [0, 0.5): a majority of attackers wins, got {fraction}")
    return get_attack(name), fraction


def choose_attackers(num_nodes: int, fraction: float, *, seed: int) -> set[int]:
    """Indices of the attacking nodes: round(fraction * n), at least one when fraction > 0."""
    count = max(1, round(fraction * num_nodes)) if fraction > 0 else 0
    rng = np.random.default_rng(seed + 7919)
    return set(rng.choice(num_nodes, size=count, replace=False).tolist())
