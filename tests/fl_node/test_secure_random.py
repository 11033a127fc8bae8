"""The DP randomness is secret: a curious member with every public value cannot replay it."""

import math

import pytest
import torch

from fl_node.data import load_dataset
from fl_node.models import create_model
from fl_node.privacy import UpdateGaussianMechanism
from fl_node.secure_random import SecureRandom, TorchRandom, poisson_batches
from fl_node.train import TrainConfig, train_local

NOISE = 1.0
CLIP = 0.5
STEPS = 6
BATCH = 32
LR = 0.1


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _train(digits, randomness):
    model = create_model("mlp", seed=0, **digits.model_kwargs())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    config = TrainConfig(
        noise_multiplier=NOISE,
        max_grad_norm=CLIP,
        local_steps=STEPS,
        batch_size=BATCH,
        lr=LR,
        momentum=0.0,
        seed=7,
    )
    return train_local(model, state, digits.train, config, randomness=randomness).update


def _norm(update):
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in update.values()))


def _residual(a, b):
    return _norm({k: a[k] - b[k] for k in a})


def _noise_norm(digits):
    """The norm of the noise alone in one update: lr * std / batch * sqrt(params * steps)."""
    params = sum(p.numel() for p in create_model("mlp", seed=0, **digits.model_kwargs()).parameters())
    return LR * NOISE * CLIP / BATCH * math.sqrt(params * STEPS)


def test_a_curious_member_cannot_replay_the_noise(digits):
    """Attack class: noise regeneration from public values (job seed, round, participant index).

    The member knows everything public and, beyond that, even the victim's training data. It
    replays training with every stream it can derive from public values. With a public seed
    (the control) the replay is exact; with the secret stream the residual stays at the noise's
    own norm, so subtracting the replay leaves the noise in place.
    """
    public_seed = 7 * 1_000_003 + 3 * 1009 + 1  # what the old round seed was: all public inputs
    # Control: a node that drew from a public seed is exposed, the test can fail.
    exposed = _train(digits, TorchRandom(torch.Generator().manual_seed(public_seed)))
    replay = _train(digits, TorchRandom(torch.Generator().manual_seed(public_seed)))
    assert _residual(exposed, replay) < 1e-6

    released = _train(digits, None)  # what the node does: a fresh secret key
    noise_norm = _noise_norm(digits)
    attempts = [
        TorchRandom(torch.Generator().manual_seed(public_seed)),
        SecureRandom.derive(public_seed.to_bytes(32, "big"), "job", 3, 1),
        SecureRandom(public_seed.to_bytes(32, "big")),
        SecureRandom(bytes(32)),
    ]
    for attempt in attempts:
        residual = _residual(released, _train(digits, attempt))
        # Two independent noise draws differ by sqrt(2) x the noise norm.
        assert residual > 0.8 * noise_norm, (residual, noise_norm)


def test_update_mechanism_noise_is_secret():
    """Attack class: replaying the update-level mechanism's noise from public values."""
    update = {"w": torch.zeros(4000)}
    mechanism = UpdateGaussianMechanism(clip_norm=1.0, noise_multiplier=1.0, sampling_fraction=1.0)
    released = mechanism.privatize(update)
    replay = UpdateGaussianMechanism(clip_norm=1.0, noise_multiplier=1.0, sampling_fraction=1.0).privatize(
        update, randomness=TorchRandom(torch.Generator().manual_seed(0))
    )
    assert float((released["w"] - replay["w"]).norm()) > 0.8 * math.sqrt(2 * 4000)


def test_same_key_same_stream_and_derivation_is_keyed():
    key = bytes(range(32))
    assert torch.equal(SecureRandom(key).normal((100,), std=1.0), SecureRandom(key).normal((100,), std=1.0))
    secret = b"node-local secret of 32 bytes!!!"
    a = SecureRandom.derive(secret, "job", 1, "round", 2, "attempt", 1).uniform(8)
    b = SecureRandom.derive(secret, "job", 1, "round", 2, "attempt", 1).uniform(8)
    c = SecureRandom.derive(secret, "job", 1, "round", 2, "attempt", 2).uniform(8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ValueError):
        SecureRandom(b"short")
    with pytest.raises(ValueError):
        SecureRandom.derive(b"short", "job")


def test_secure_normal_has_the_right_distribution():
    samples = SecureRandom().normal((200_000,), std=3.0, dtype=torch.float64)
    assert float(samples.mean()) == pytest.approx(0.0, abs=0.03)
    assert float(samples.std()) == pytest.approx(3.0, rel=0.01)
    # Gaussian tails: about 4.55% beyond two standard deviations.
    assert float((samples.abs() > 6.0).double().mean()) == pytest.approx(0.0455, abs=0.003)
    uniforms = SecureRandom().uniform(100_000)
    assert float(uniforms.min()) > 0 and float(uniforms.max()) < 1
    assert float(uniforms.mean()) == pytest.approx(0.5, abs=0.005)


def test_poisson_mask_rate():
    mask = SecureRandom().poisson_mask(100_000, 0.1)
    assert float(mask.double().mean()) == pytest.approx(0.1, abs=0.004)


def test_poisson_batches_drawn_ahead_are_the_stream_in_order():
    """Masks drawn in blocks ahead on the helper thread are the ones drawn step by step."""
    key = bytes(range(32))
    for source, replay in (
        (SecureRandom(key), SecureRandom(key)),
        (TorchRandom(torch.Generator().manual_seed(3)), TorchRandom(torch.Generator().manual_seed(3))),
    ):
        batches = poisson_batches(source, 300, 0.1)
        drawn = [next(batches) for _ in range(40)]  # three blocks of 16 steps from a secret stream
        batches.close()
        for got in drawn:
            assert torch.equal(got, torch.nonzero(replay.poisson_mask(300, 0.1)).flatten())
        assert len({tuple(b.tolist()) for b in drawn}) == len(drawn)  # a fresh mask every step
