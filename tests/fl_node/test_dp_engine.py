"""The "bk" DP-SGD engine equals Opacus: same clipped sums, same noisy gradients, same training runs."""

import copy
import logging
import warnings

import pytest
import torch
from opacus.grad_sample.utils import prepare_module
from opacus.optimizers import DPOptimizer
from torch import nn

from fl_node.data import load_dataset
from fl_node.dp_engine import BookKeepingDP, unsupported_reason
from fl_node.models import create_model
from fl_node.secure_random import SecureRandom
from fl_node.train import TrainConfig, resolve_grad_sample_mode, train_local

warnings.filterwarnings("ignore", message=".*(Secure RNG|backward hook).*")


def _models():
    """(label, model, input shape): registered models and layer shapes that exercise every branch."""
    yield "cnn mnist", create_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=0), (1, 28, 28)
    yield "cnn digits", create_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=1), (1, 8, 8)
    yield (
        "cnn no groupnorm",
        create_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=2, groups=0),
        (
            1,
            28,
            28,
        ),
    )
    yield "mlp", create_model("mlp", input_shape=(1, 8, 8), num_classes=10, seed=3), (1, 8, 8)
    torch.manual_seed(4)
    mixed = nn.Sequential(  # padded dilated conv, ghost-norm conv, ghost-norm Linear over a sequence
        nn.Conv2d(3, 8, 3, stride=1, padding=2, dilation=2, bias=False),
        nn.GroupNorm(2, 8),
        nn.ReLU(),
        nn.Conv2d(8, 32, (4, 3), stride=(1, 2)),  # 2 x 2 output positions: the ghost norm is cheaper
        nn.Flatten(),
        nn.Unflatten(1, (2, 64)),  # (N, 2, 64): a Linear over a sequence of 2
        nn.Linear(64, 16),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(32, 5),
    )
    yield "mixed", mixed, (3, 5, 6)
    torch.manual_seed(5)
    frozen = nn.Sequential(nn.Flatten(), nn.Linear(12, 7), nn.ELU(), nn.Linear(7, 3))
    frozen[1].bias.requires_grad_(False)
    yield "frozen bias", frozen, (12,)


def _opacus_gradients(model, x, y, *, noise, clip, expected, seed):
    wrapped = prepare_module(model, "hooks")
    optimizer = DPOptimizer(
        torch.optim.SGD(wrapped.parameters(), lr=0.1),
        noise_multiplier=noise,
        max_grad_norm=clip,
        expected_batch_size=expected,
        generator=torch.Generator().manual_seed(seed),
    )
    optimizer.zero_grad(set_to_none=True)
    if len(y):
        nn.functional.cross_entropy(wrapped(x), y).backward()
    else:
        for p in optimizer.params:
            p.grad_sample = torch.zeros((0, *p.shape))
    assert optimizer.pre_step()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    wrapped._close()
    return grads


def _engine_gradients(model, x, y, *, noise, clip, expected, seed, reduction="mean"):
    engine = BookKeepingDP(
        model,
        noise_multiplier=noise,
        max_grad_norm=clip,
        expected_batch_size=expected,
        generator=torch.Generator().manual_seed(seed),
        loss_reduction=reduction,
    )
    if len(y):
        nn.functional.cross_entropy(engine.forward(x), y, reduction=reduction).backward()
    engine.privatize()
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("batch", [0, 1, 5, 64])
@pytest.mark.parametrize("noise", [0.0, 1.3])
def test_clipped_noisy_gradient_equals_opacus(batch, noise):
    for label, model, shape in _models():
        gen = torch.Generator().manual_seed(batch)
        x = torch.rand(batch, *shape, generator=gen) * 2
        num_classes = model[-1].out_features
        y = torch.randint(0, num_classes, (batch,), generator=gen)
        for clip in (0.05, 1.0, 100.0):  # all clipped, mixed, none clipped
            kwargs = {"noise": noise, "clip": clip, "expected": 32, "seed": 7}
            ours = _engine_gradients(copy.deepcopy(model), x, y, **kwargs)
            theirs = _opacus_gradients(copy.deepcopy(model), x, y, **kwargs)
            assert len(ours) == len(theirs)
            for a, b in zip(ours, theirs, strict=True):
                assert a.shape == b.shape
                assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (label, clip, (a - b).abs().max())
            if batch == 0 and noise == 0:
                assert all(not g.any() for g in ours)


def test_every_norm_strategy_is_exercised():
    models = {label: (model, shape) for label, model, shape in _models()}
    plans = {}
    for label in ("cnn mnist", "mixed"):
        model, shape = models[label]
        engine = BookKeepingDP(model, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4)
        nn.functional.cross_entropy(
            engine.forward(torch.rand(4, *shape)), torch.tensor([0, 1, 2, 3])
        ).backward()
        engine.privatize()
        plans[label] = engine.layer_plans()
    assert plans["cnn mnist"] == [
        "Conv2d materialized",
        "GroupNorm materialized",
        "Conv2d materialized",
        "GroupNorm materialized",
        "Linear reweight",
        "Linear reweight",
    ]
    assert plans["mixed"] == [
        "Conv2d materialized",
        "GroupNorm materialized",
        "Conv2d reweight",
        "Linear reweight",
        "Linear reweight",
    ]


def test_channels_last_model_equals_opacus_on_the_contiguous_one():
    model = create_model("cnn", input_shape=(1, 28, 28), num_classes=10, seed=0)
    x, y = torch.rand(6, 1, 28, 28), torch.randint(0, 10, (6,))
    kwargs = {"noise": 0.5, "clip": 0.2, "expected": 8, "seed": 3}
    theirs = _opacus_gradients(copy.deepcopy(model), x, y, **kwargs)
    last = copy.deepcopy(model).to(memory_format=torch.channels_last)
    ours = _engine_gradients(last, x.contiguous(memory_format=torch.channels_last), y, **kwargs)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_sum_reduction_equals_mean_reduction():
    for _, model, shape in _models():
        x = torch.rand(9, *shape)
        y = torch.randint(0, model[-1].out_features, (9,))
        mean = _engine_gradients(copy.deepcopy(model), x, y, noise=0.0, clip=0.5, expected=9, seed=0)
        summed = _engine_gradients(
            copy.deepcopy(model), x, y, noise=0.0, clip=0.5, expected=9, seed=0, reduction="sum"
        )
        for a, b in zip(mean, summed, strict=True):
            assert torch.allclose(a * 9, b, rtol=1e-4, atol=1e-6)


def test_noise_has_the_mechanism_scale():
    """Empty batch: the gradient is pure noise, std = noise_multiplier * max_grad_norm / expected batch."""
    model = nn.Sequential(nn.Linear(200, 100))
    engine = BookKeepingDP(model, noise_multiplier=2.0, max_grad_norm=3.0, expected_batch_size=10)
    engine.privatize()
    assert model[0].weight.grad.std().item() == pytest.approx(2.0 * 3.0 / 10, rel=0.03)
    assert abs(model[0].weight.grad.mean().item()) < 0.01


def test_train_local_bk_reproduces_the_opacus_run():
    """Same secret stream, so the same Poisson batches and noise draws: bk and Opacus hooks agree."""
    digits = load_dataset("digits", seed=0)
    updates = []
    for mode in ("bk", "hooks"):
        model = create_model("cnn", seed=0, **digits.model_kwargs())
        state = {k: v.clone() for k, v in model.state_dict().items()}
        config = TrainConfig(
            noise_multiplier=1.1, local_steps=8, batch_size=32, max_grad_norm=0.5, grad_sample_mode=mode
        )
        updates.append(train_local(model, state, digits.train, config, randomness=SecureRandom(bytes(32))))
    assert updates[0].privacy.history == updates[1].privacy.history
    for key in updates[0].update:
        assert torch.allclose(updates[0].update[key], updates[1].update[key], atol=1e-5), key


def test_supported_models_and_fallback(caplog):
    for name in ("cnn", "mlp"):
        model = create_model(name, input_shape=(1, 28, 28), num_classes=10, seed=0)
        assert unsupported_reason(model) is None
        assert resolve_grad_sample_mode(model, "bk") == "bk"
    text = create_model("text", input_shape=(16,), num_classes=3, seed=0, vocab_size=50)
    assert "MeanPoolTextClassifier" in unsupported_reason(text)
    with caplog.at_level(logging.INFO, logger="fl_node.train"):
        assert resolve_grad_sample_mode(text, "bk") == "ew"
    assert "does not support this model" in caplog.text
    assert resolve_grad_sample_mode(text, "hooks") == "hooks"
    assert "BatchNorm1d" in unsupported_reason(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))
    shared = nn.Linear(3, 3)
    assert "shared" in unsupported_reason(nn.Sequential(shared, nn.Tanh(), shared))
    assert "groups" in unsupported_reason(nn.Sequential(nn.Conv2d(4, 4, 3, groups=2)))
    with pytest.raises(ValueError, match="bk engine cannot train"):
        BookKeepingDP(text, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=8)


def test_forward_without_backward_is_refused():
    model = create_model("mlp", input_shape=(1, 8, 8), num_classes=10, seed=0)
    engine = BookKeepingDP(model, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4)
    engine.forward(torch.rand(4, 1, 8, 8))
    with pytest.raises(RuntimeError, match="no gradient"):
        engine.privatize()
    engine.privatize()  # the failed step left nothing behind: an empty batch is noise only
    assert all(p.grad is not None for p in model.parameters())


def test_text_model_falls_back_and_trains():
    text = load_dataset("zipf_text", seed=0, num_samples=200, vocab_size=500)
    model = create_model("text", seed=0, **text.model_kwargs())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    result = train_local(model, state, text.train, TrainConfig(noise_multiplier=1.0, local_steps=2))
    assert result.privacy.steps == 2
