"""DP training placed by the cluster on a GPU the worker discovered (runs where torch sees a GPU).

Without a GPU the same placement is covered with a hand-made GPU slot (test_cluster_runner.py:
the slot's device reaches the training, which then runs on the CPU); here the worker declares the
GPU torch sees, the trainer's demand (its estimated memory) is placed on it, and the DP-SGD run's
parameters and gradients live on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from backend.cluster import registry, runner
from backend.cluster.models import DeviceSlot

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no GPU here: the CUDA path runs where torch sees one"
    ),
]


def test_dp_training_runs_on_the_gpu_the_worker_declared(settings):
    from test_cluster_runner import _tiny_training

    from fl_node.train import _DEVICE, TrainConfig, resolve_device, train_local

    settings.DEFL_CLUSTER_USE_GPU = True
    worker = registry.ensure_local()
    gpus = list(DeviceSlot.objects.filter(worker=worker, kind=DeviceSlot.Kind.CUDA))
    assert gpus and all(slot.capacity > 0 for slot in gpus)  # declared with its memory in MB
    model, state, data = _tiny_training()
    config = TrainConfig(local_steps=2, batch_size=16, noise_multiplier=1.0)
    demand = runner.train_demand(model, data, config)

    def train():
        return _DEVICE.get(), resolve_device().type, train_local(model, state, data, config)

    device, kind, result = runner.run(41, 1, train, demand=demand)
    assert device.startswith("cuda:") and kind == "cuda"
    assert result.privacy.steps == 2 and all(torch.isfinite(v).all() for v in result.update.values())
