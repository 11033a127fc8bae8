"""fl_node.train's step boundaries (the cluster's cancel and pacing) and training device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_node.data import ArrayDataset
from fl_node.models import create_model
from fl_node.secure_random import SecureRandom
from fl_node.train import (
    TrainConfig,
    device_memory_mb,
    on_device,
    resolve_device,
    step_boundary,
    train_local,
)

CUDA = torch.cuda.is_available()


def _setup(n: int = 96):
    rng = np.random.default_rng(0)
    data = ArrayDataset(
        rng.normal(size=(n, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, n).astype(np.int64)
    )
    model = create_model("mlp", input_shape=(1, 8, 8), num_classes=3, seed=0)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return model, state, data


class Stop(Exception):
    pass


@pytest.mark.parametrize("private", [False, True])
def test_hooks_run_before_every_step_and_a_raise_stops_training(private):
    model, state, data = _setup()
    extra = {"noise_multiplier": 1.0} if private else {}
    seen: list[int] = []
    with step_boundary(seen.append):
        result = train_local(model, state, data, TrainConfig(local_steps=6, batch_size=16, **extra))
    assert seen == list(range(6)) and result.steps == 6

    def stop_at_3(step: int) -> None:
        if step == 3:
            raise Stop

    outer: list[int] = []
    with step_boundary(outer.append), step_boundary(stop_at_3), pytest.raises(Stop):
        train_local(model, state, data, TrainConfig(local_steps=1000, batch_size=16, **extra))
    assert outer == [0, 1, 2, 3]  # hooks stack; the training stopped between whole steps
    with step_boundary(outer.append):
        pass
    train_local(model, state, data, TrainConfig(local_steps=2, batch_size=16))
    assert outer == [0, 1, 2, 3]  # out of the context: no hook any more


def test_the_device_flows_from_the_context_and_the_config():
    assert resolve_device() == torch.device("cpu")
    with on_device("cpu"):
        assert resolve_device() == torch.device("cpu")
    with on_device("cuda:0"):
        # Where torch sees no GPU a cuda slot's task still trains (on the CPU).
        assert resolve_device().type == ("cuda" if CUDA else "cpu")
        assert resolve_device("cpu") == torch.device("cpu")  # the config's own device wins
    with pytest.raises(ValueError):
        resolve_device("mps-or-whatever")


@pytest.mark.skipif(not CUDA, reason="no CUDA device: the GPU run needs one")
def test_training_on_the_gpu_returns_a_cpu_update_close_to_the_cpu_one():
    model, state, data = _setup()
    cpu = train_local(model, state, data, TrainConfig(local_steps=5, batch_size=16, seed=3))
    with on_device("cuda"):
        gpu = train_local(model, state, data, TrainConfig(local_steps=5, batch_size=16, seed=3))
    assert next(model.parameters()).device.type == "cpu"  # the model is handed back on the CPU
    for name, value in cpu.update.items():
        assert gpu.update[name].device.type == "cpu"
        assert torch.allclose(gpu.update[name], value, atol=1e-4), name
    # DP-SGD trains on the GPU too, from the same secret draws as on the CPU.
    dp = TrainConfig(local_steps=4, batch_size=16, noise_multiplier=1.0, seed=3)
    cpu = train_local(model, state, data, dp, randomness=SecureRandom(bytes(32)))
    with on_device("cuda"):
        gpu = train_local(model, state, data, dp, randomness=SecureRandom(bytes(32)))
    assert gpu.privacy.history == cpu.privacy.history
    for name, value in cpu.update.items():
        assert gpu.update[name].device.type == "cpu"
        assert torch.allclose(gpu.update[name], value, atol=1e-4), name


@pytest.mark.parametrize("mode", ["bk", "ew", None])
def test_the_device_path_run_on_the_cpu_equals_the_default_path(mode):
    """The path a GPU run takes (model, data and DP noise copied to the device, the batch indices
    sent over) run on the CPU: the same update bit for bit as the default path, given the same
    secret, for DP-SGD in the book-keeping engine and in Opacus's, and for plain training."""
    model, state, data = _setup()
    extra = {"noise_multiplier": 1.1, "grad_sample_mode": mode} if mode else {}
    config = TrainConfig(local_steps=5, batch_size=16, seed=2, **extra)
    default = train_local(model, state, data, config, randomness=SecureRandom(bytes(32)))
    device = train_local(model, state, data, config, randomness=SecureRandom(bytes(32)), device_path=True)
    assert device.update.keys() == default.update.keys()
    for name, value in default.update.items():
        assert torch.equal(device.update[name], value), name
    if mode:
        assert device.privacy.history == default.privacy.history and device.privacy.steps == 5
    other = train_local(
        model, state, data, config, randomness=SecureRandom(bytes([1] * 32)), device_path=True
    )
    if mode:  # another secret, other noise: the comparison above can fail
        assert not any(torch.equal(other.update[k], v) for k, v in default.update.items())


def test_device_memory_estimate_bounds_the_worst_batch():
    model, _, data = _setup()
    plain = device_memory_mb(model, data, TrainConfig(batch_size=16))
    private = device_memory_mb(model, data, TrainConfig(batch_size=16, noise_multiplier=1.0))
    assert 1 <= plain < private  # DP keeps per-example gradients and more copies
    # A batch far larger than the data is bounded by the data (a Poisson batch can be no larger).
    assert device_memory_mb(model, data, TrainConfig(batch_size=10**9, noise_multiplier=1.0)) == (
        device_memory_mb(model, data, TrainConfig(batch_size=len(data), noise_multiplier=1.0))
    )
    big = ArrayDataset(np.zeros((200_000, 1, 8, 8), np.float32), np.zeros(200_000, np.int64))
    assert device_memory_mb(model, big, TrainConfig(batch_size=16)) > plain + 45  # the data's 50 MiB
    with pytest.raises(ValueError, match="empty"):
        device_memory_mb(model, data.subset(np.arange(0)), TrainConfig())
    wrong = ArrayDataset(np.zeros((4, 5), np.float32), np.zeros(4, np.int64))  # not the model's input
    assert device_memory_mb(model, wrong, TrainConfig()) is None


def test_plain_training_never_steps_on_an_epochs_short_tail():
    """A share of 450 at batch 64 used to end each epoch with a step on 2 examples at the full
    learning rate (members training past one epoch then diverged now and then)."""
    from fl_node.train import _shuffled_batches

    batches = _shuffled_batches(450, 64, torch.Generator().manual_seed(0))
    first = [next(batches) for _ in range(7)]
    assert all(len(b) == 64 for b in first)
    assert len(torch.cat(first).unique()) == 448  # one epoch: distinct examples, the tail dropped
    assert all(len(next(batches)) == 64 for _ in range(30))
    small = _shuffled_batches(10, 64, torch.Generator().manual_seed(0))
    assert sorted(next(small).tolist()) == list(range(10))  # fewer than a batch: all of them
