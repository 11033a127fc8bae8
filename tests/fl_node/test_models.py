"""Models by name and by dotted path, seeded, Opacus-compatible; bad names fail clearly."""

import pytest
import torch
from torch import nn

from fl_node import models
from fl_node.models import available_models, create_model, register_model

IMAGE = {"input_shape": (1, 28, 28), "num_classes": 10}


class TinyLinear(nn.Module):
    """A plain module reachable by dotted path; it takes only its own arguments."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.flat = nn.Flatten()
        self.fc = nn.Linear(784, width)

    def forward(self, x):
        return self.fc(self.flat(x))


class WithBatchNorm(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(num_classes)
        )

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_builtin_image_models_forward(name):
    model = create_model(name, seed=0, **IMAGE)
    assert model(torch.rand(3, 1, 28, 28)).shape == (3, 10)


def test_cnn_on_digits_and_with_group_norm():
    small = create_model("cnn", input_shape=(1, 8, 8), num_classes=10, seed=0)
    assert small(torch.rand(2, 1, 8, 8)).shape == (2, 10)
    assert any(isinstance(m, nn.GroupNorm) for m in small.modules())
    plain = create_model("cnn", seed=0, groups=0, **IMAGE)
    assert not any(isinstance(m, nn.GroupNorm) for m in plain.modules())


def test_text_model_has_large_embedding():
    model = create_model("text", input_shape=(32,), num_classes=4, vocab_size=30_000, seed=0)
    assert model.embedding.num_embeddings == 30_000
    tokens = torch.randint(1, 30_000, (5, 32))
    assert model(tokens).shape == (5, 4)


def test_same_seed_same_weights_and_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = create_model("cnn", seed=5, **IMAGE)
    after = torch.rand(1)
    b = create_model("cnn", seed=5, **IMAGE)
    c = create_model("cnn", seed=6, **IMAGE)
    assert torch.equal(before, after)  # building a model does not consume the caller's random stream
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True))


def test_dotted_path_and_kwargs():
    model = create_model(f"{__name__}:TinyLinear", width=7, seed=0, **IMAGE)
    assert isinstance(model, TinyLinear) and model.fc.out_features == 7


def test_decorator_registers_a_factory(monkeypatch):
    # The registry is the process's: a copy for this test, or the name would leak into every later
    # test of this worker (the API's model list, its schema).
    monkeypatch.setattr(models, "_REGISTRY", dict(models._REGISTRY))

    @register_model("test_tiny")
    def tiny(*, input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(784, num_classes))

    assert "test_tiny" in available_models()
    assert create_model("test_tiny", **IMAGE)(torch.rand(1, 1, 28, 28)).shape == (1, 10)


def test_unknown_and_incompatible_models_fail_clearly():
    with pytest.raises(ValueError, match="unknown model 'resnet9'.*cnn"):
        create_model("resnet9", **IMAGE)
    with pytest.raises(ValueError, match="cannot import module"):
        create_model("no_such_pkg.mod:Net", **IMAGE)
    with pytest.raises(ValueError, match="has no callable"):
        create_model(f"{__name__}:Missing", **IMAGE)
    with pytest.raises(ValueError, match="Opacus"):
        create_model(f"{__name__}:WithBatchNorm", **IMAGE)
    with pytest.raises(ValueError, match="activation"):
        create_model("mlp", act="swish", **IMAGE)


def test_scatternet_features_are_fixed_and_split_off_exactly():
    from fl_node.models import Scattering2d, split_fixed_features

    model = create_model("scatternet", seed=0, **IMAGE)
    features, head = split_fixed_features(model)
    assert isinstance(features[0], Scattering2d) and features[0].channels == 81
    assert not list(features.parameters()) and list(head.parameters())  # only the head trains
    x = torch.rand(4, 1, 28, 28)
    maps = features(x)
    assert maps.shape == (4, 81, 7, 7) and bool(torch.isfinite(maps).all())
    assert torch.equal(head(maps), model(x)) and torch.equal(features(x), maps)  # deterministic
    # Zero-mean wavelets: a constant image has no first- or second-order energy.
    flat = features(torch.full((1, 1, 28, 28), 0.5))
    assert torch.allclose(flat[:, 0], torch.full((1, 7, 7), 0.5), atol=1e-4)
    assert float(flat[:, 1:].abs().max()) < 1e-3
    assert split_fixed_features(create_model("cnn", seed=0, **IMAGE))[0] is None
