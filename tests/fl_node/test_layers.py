"""fl_node.layers.MaxPool2d: torch's values, torch's gradients, a faster inference path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_node import layers
from fl_node.dp_engine import unsupported_reason
from fl_node.models import create_model


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ties = torch.randint(-2, 3, (4, 3, 9, 7), generator=g).float()  # many equal neighbours
    saturated = torch.tanh(torch.randn(4, 3, 9, 7, generator=g) * 50)  # exactly +-1 often
    nan = torch.randn(2, 3, 6, 6, generator=g)
    nan[0, 1, 2, 3] = float("nan")
    return [torch.randn(5, 16, 14, 14, generator=g), ties, saturated, nan, torch.randn(3, 8, 8, generator=g)]


@pytest.mark.parametrize("kernel", [2, 3, (2, 3)])
def test_inference_path_gives_torchs_values_without_its_kernel(monkeypatch, kernel):
    expected = [nn.MaxPool2d(kernel, 1)(x) for x in _inputs()]

    def refuse(*args, **kwargs):
        raise AssertionError("torch's max-pooling kernel was called on the inference path")

    monkeypatch.setattr(torch.nn.modules.pooling.F, "max_pool2d", refuse)
    pool = layers.MaxPool2d(kernel, 1)
    with torch.no_grad():
        got = [pool(x) for x in _inputs()]
    for want, have in zip(expected, got, strict=True):
        assert have.shape == want.shape
        assert torch.equal(have.isnan(), want.isnan())
        assert torch.equal(torch.nan_to_num(have), torch.nan_to_num(want))


def test_training_keeps_torchs_kernel_and_its_gradients():
    for x in _inputs()[:3]:
        ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_ours, out_theirs = layers.MaxPool2d(2, 1)(ours), nn.MaxPool2d(2, 1)(theirs)
        weights = torch.arange(out_ours.numel(), dtype=torch.float32).reshape(out_ours.shape)
        (out_ours * weights).sum().backward()
        (out_theirs * weights).sum().backward()
        assert torch.equal(out_ours, out_theirs)
        assert torch.equal(ours.grad, theirs.grad)  # a tie's gradient goes to one input, as torch's


@pytest.mark.parametrize(
    "options",
    [
        dict(kernel_size=2, stride=2),
        dict(kernel_size=3, stride=1, padding=1),
        dict(kernel_size=2, stride=1, ceil_mode=True),
    ],
)
def test_other_pools_are_torchs(options):
    x = _inputs()[0]
    with torch.no_grad():
        assert torch.equal(layers.MaxPool2d(**options)(x), nn.MaxPool2d(**options)(x))


def test_a_window_larger_than_the_input_is_an_error_as_in_torch():
    x = torch.randn(1, 1, 2, 2)
    with pytest.raises(RuntimeError):
        nn.MaxPool2d(3, 1)(x)
    with torch.no_grad(), pytest.raises(RuntimeError, match="larger than"):
        layers.MaxPool2d(3, 1)(x)


def test_a_window_of_one_returns_a_new_tensor():
    x = torch.randn(1, 2, 3, 3)
    with torch.no_grad():
        out = layers.MaxPool2d(1, 1)(x)
    out.add_(1.0)
    assert not torch.equal(out, x)


def test_the_cnn_pools_with_it_and_the_dp_engine_trains_it():
    model = create_model("cnn", input_shape=(1, 28, 28), num_classes=10)
    assert sum(isinstance(m, layers.MaxPool2d) for m in model.modules()) == 2
    assert unsupported_reason(model) is None
