"""A participant's local round, the one code path of the simulator and of a node's trainer.

Train on the global model (DP-SGD when the plan says so), keep the floating-point
tensors, apply the update-level mechanism when the plan has one, then let a scripted
attacker (tests and simulations only) poison what it sends. The caller encodes and
publishes the result; it charged the plan's release before calling.

Randomness: the DP draws come from ``randomness``, a secret stream (a fresh key unless the
caller passes one, which tests do to compare two runs byte for byte); an attacker's own
draws come from a generator seeded with ``attack_seed``: a hostile party's randomness
protects nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from fl_node.attacks import Attack
from fl_node.data import ArrayDataset
from fl_node.privacy import UpdateGaussianMechanism
from fl_node.secure_random import NoiseSource, SecureRandom
from fl_node.sparse import full_update, public_rows_model, restrict_rows
from fl_node.train import TrainConfig, train_local

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True)
class LocalUpdate:
    update: dict[str, torch.Tensor]  # the floating-point tensors of local - global, privatized
    samples: int  # the records trained on


def local_round(
    model: nn.Module,
    global_state: Mapping[str, torch.Tensor],
    data: ArrayDataset,
    train_config: TrainConfig,
    *,
    num_classes: int,
    mechanism: UpdateGaussianMechanism | None = None,
    attack: Attack | None = None,
    attack_seed: int = 0,
    randomness: NoiseSource | None = None,
    kept_rows: Mapping[str, torch.Tensor] | None = None,
) -> LocalUpdate:
    """One participant's update for one round (see the module docstring).

    ``kept_rows``: the public rows each sparse table keeps this round (fl_node.sparse.public_rows):
    only those rows of a table that is a plain embedding train (DP-SGD noises the rows that move);
    the update is projected onto them before the mechanism and its noise elsewhere zeroed after.
    """
    source = randomness if randomness is not None else SecureRandom()
    if attack and attack.poison_data:
        data = attack.poison_data(data, num_classes)
    if attack and not attack.trains:
        update = {k: torch.zeros_like(v) for k, v in global_state.items() if v.is_floating_point()}
    elif kept_rows and (public := public_rows_model(model, global_state, kept_rows)) is not None:
        # Only the public rows of each table train (fl_node.sparse: noise on every row that moves).
        sub, sub_state = public
        result = train_local(sub, sub_state, data, train_config, randomness=source)
        update = {
            k: v
            for k, v in full_update(result.update, global_state, kept_rows).items()
            if v.is_floating_point()
        }
        model.load_state_dict({k: v + update[k] if k in update else v for k, v in global_state.items()})
    else:
        result = train_local(model, global_state, data, train_config, randomness=source)
        update = {k: v for k, v in result.update.items() if v.is_floating_point()}
    if kept_rows:
        update = restrict_rows(update, kept_rows)  # a public projection, before the clip
    if mechanism is not None:
        update = mechanism.privatize(update, randomness=source)
        if kept_rows:
            update = restrict_rows(update, kept_rows)  # post-processing: zero the noise off the rows
    if attack and attack.poison_update:
        update = attack.poison_update(update, torch.Generator().manual_seed(attack_seed))
    return LocalUpdate(update, len(data))
