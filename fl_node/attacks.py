"""Attackers for simulations and tests: how a malicious trainer corrupts its data or update.

A spec is ``NAME:FRACTION`` (``label_flip:0.2``): that fraction of the nodes attack.

* ``label_flip`` -- trains honestly on labels mapped ``y -> C - 1 - y`` (data poisoning,
  Tolpegin et al. 2020, "Data Poisoning Attacks Against Federated Learning Systems").
* ``sign_flip`` -- sends the negated, amplified update (Damaskinos et al. 2018).
* ``gaussian`` -- sends noise of the honest update's scale instead of the update.
* ``free_rider`` -- sends a zero update without training (Lin et al. 2019,
  "Free-riders in Federated Learning").
* ``copy`` -- does not train; re-submits an honest trainer's update (the same bytes and
  content hash, visible in the round's event before the deadline) to ride free.
* ``inflate`` -- trains on flipped labels and claims a huge sample count, so that a
  sample-weighted average would be its model alone.
* ``absent`` -- not an attack but its reference: the same nodes an attack at that fraction
  would pick (same seed) take no part at all (no training, no seat), so the federation is the
  honest nodes alone. An attack's damage is what it costs below this: the data the attackers
  withhold is lost whatever the defense does.
* ``backdoor`` -- targeted poisoning (Bagdasaryan et al. 2020, "How To Backdoor Federated
  Learning"; Gu et al. 2017, "BadNets"): half of its examples carry a trigger patch and
  the label :data:`BACKDOOR_TARGET`; the model stays accurate on clean inputs, so an
  accuracy-scoring committee cannot see it. Success is the fraction of triggered test
  inputs of other classes classified as the target (:func:`backdoor_success`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
register_attack(Attack("copy", trains=False, copies=True))
register_attack(Attack("inflate", poison_data=_flip_labels, claimed_samples=INFLATED_SAMPLES))
register_attack(Attack("backdoor", poison_data=_backdoor, boosts=True))
register_attack(Attack("absent", trains=False, absent=True))


BOUND_SHARE = 0.999  # of the norm bound a boosting attacker scales to: inside it after rounding


def boost_to_bound(update: Update, bound: float) -> Update:
    """``update`` scaled so that its L2 norm is ``BOUND_SHARE * bound`` (a zero update stays zero)."""
    total = sum(float((v.double() ** 2).sum()) for v in update.values() if v.is_floating_point())
    if total <= 0.0 or not np.isfinite(total):
        return update
    factor = BOUND_SHARE * bound / total**0.5
    return {k: (v * factor).to(v.dtype) if v.is_floating_point() else v for k, v in update.items()}


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
