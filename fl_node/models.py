"""Model registry: built-in models by name, any Opacus-compatible module by dotted path.

Built-ins are chosen to train well under DP-SGD (Abadi et al. 2016):

* ``mlp`` -- 784-128-10 style with tanh: bounded activations keep per-example
  gradient norms small, so less is lost to clipping (Papernot et al. 2021,
  "Tempered Sigmoid Activations for Deep Learning with Differential Privacy").
* ``cnn`` -- the strided tanh CNN of Papernot et al. 2021 / Opacus's MNIST example,
  with GroupNorm (not BatchNorm): BatchNorm mixes examples in a batch,
  which breaks per-example gradients, so Opacus refuses it.
* ``text`` -- a large ``nn.Embedding`` table, mean pooling and a linear head
  (fastText-style, Joulin et al. 2017): the embedding-heavy workload.
* ``lm`` and ``hashed_rec`` -- a next-token language model and a recommender
  with hashed feature embeddings; see :mod:`fl_node.sparse_models`.

Factories take ``input_shape`` and ``num_classes`` plus their own keyword options.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable

import torch
from opacus.validators import ModuleValidator
from torch import nn

from fl_node import sparse_models
from fl_node.layers import MaxPool2d

ModelFactory = Callable[..., nn.Module]
_REGISTRY: dict[str, ModelFactory] = {}

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}


def register_model(name: str) -> Callable[[ModelFactory], ModelFactory]:
    """Decorator: make a factory available to ``create_model`` under ``name``."""

    def decorator(factory: ModelFactory) -> ModelFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"model name {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return decorator


def available_models() -> list[str]:
    return sorted(_REGISTRY)


def activation(name: str) -> nn.Module:
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(_ACTIVATIONS)}") from None


def create_model(
    name_or_path: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int | None = None,
    **kwargs: object,
) -> nn.Module:
    """Build a registered model or ``"package.module:Class"``; initialised from ``seed``.

    Seeding uses a forked RNG so building a model never disturbs the caller's
    random stream. The model must be one that Opacus can wrap (no BatchNorm,
    ...); otherwise a ValueError lists Opacus's objections.
    """
    factory = _resolve(name_or_path)
    call_kwargs = (
        _accepted_kwargs(factory, {"input_shape": tuple(input_shape), "num_classes": num_classes}) | kwargs
    )
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model = factory(**call_kwargs)
    if not isinstance(model, nn.Module):
        raise TypeError(f"{name_or_path!r} built a {type(model).__name__}, not a torch.nn.Module")
    errors = ModuleValidator.validate(model, strict=False)
    if errors:
        raise ValueError(f"{name_or_path!r} cannot be trained with DP-SGD (Opacus): {errors}")
    return model


def _resolve(name_or_path: str) -> ModelFactory:
    if ":" not in name_or_path:
        try:
            return _REGISTRY[name_or_path]
        except KeyError:
            raise ValueError(
                f"unknown model {name_or_path!r}; registered: {', '.join(available_models())}, "
                "or give a dotted path 'package.module:Class'"
            ) from None
    module_name, _, attr = name_or_path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} for model {name_or_path!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{module_name!r} has no callable {attr!r}")
    return factory


def _accepted_kwargs(factory: ModelFactory, offered: dict[str, object]) -> dict[str, object]:
    """Pass ``input_shape``/``num_classes`` only to factories that take them (plain modules may not)."""
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(offered)
    return {k: v for k, v in offered.items() if k in params}


@register_model("mlp")
def mlp(*, input_shape: tuple[int, ...], num_classes: int, hidden: int = 128, act: str = "tanh") -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), hidden),
        activation(act),
        nn.Linear(hidden, num_classes),
    )


@register_model("cnn")
def cnn(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: tuple[int, int] = (16, 32),
    hidden: int = 32,
    act: str = "tanh",
    groups: int = 4,
) -> nn.Module:
    """Two strided convolutions, max-pooling, two linear layers.

    Large strides keep the unfolded activations small, and those are what
    per-example convolution gradients cost. GroupNorm with ``groups`` groups
    follows each convolution (0 turns it off): normalising per example is
    compatible with DP-SGD and trains better under noise (De et al. 2022,
    "Unlocking High-Accuracy Differentially Private Image Classification through Scale").
    """
    in_channels, height, width = _image_shape(input_shape)
    first, second = channels
    small = min(height, width) < 16  # 8x8 digits: smaller kernels, no pooling
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, first, 3 if small else 8, stride=1 if small else 2, padding=1 if small else 3),
        *_norm(groups, first),
        activation(act),
        MaxPool2d(2, 1),
        nn.Conv2d(first, second, 3 if small else 4, stride=2),
        *_norm(groups, second),
        activation(act),
        MaxPool2d(2, 1),
        nn.Flatten(),
    ]
    features = nn.Sequential(*layers)
    with torch.no_grad():
        flat = features(torch.zeros(1, in_channels, height, width)).shape[1]
    return nn.Sequential(features, nn.Linear(flat, hidden), activation(act), nn.Linear(hidden, num_classes))


def _norm(groups: int, channels: int) -> list[nn.Module]:
    return [nn.GroupNorm(groups, channels)] if groups > 0 else []


def _image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) == 2:
        return (1, *input_shape)
    if len(input_shape) == 3:
        return input_shape
    raise ValueError(f"cnn needs an image shape (C, H, W) or (H, W), got {input_shape}")


class MeanPoolTextClassifier(nn.Module):
    """Embedding -> mean over non-padding tokens -> linear. Token id 0 is padding."""

    def __init__(self, vocab_size: int, embed_dim: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tokens = tokens.long()  # a node's stored datasets hold features as float32 (exact ids < 2**24)
        mask = (tokens != 0).unsqueeze(-1).to(self.head.weight.dtype)
        summed = (self.embedding(tokens) * mask).sum(dim=1)
        return self.head(summed / mask.sum(dim=1).clamp(min=1.0))


@register_model("text")
def text(
    *, input_shape: tuple[int, ...], num_classes: int, vocab_size: int = 20_000, embed_dim: int = 64
) -> nn.Module:
    if len(input_shape) != 1:
        raise ValueError(f"text needs input_shape (seq_len,), got {input_shape}")
    return MeanPoolTextClassifier(vocab_size, embed_dim, num_classes)


# ---------------------------------------------------------------- scattering features


def _morlet(size: int, sigma: float, theta: float, xi: float, slant: float) -> torch.Tensor:
    """A 2-D Morlet (or, with ``xi = 0``, Gaussian) filter on a periodic ``size x size`` grid.

    The formula is Kymatio's (Andreux et al. 2020): a Gabor wavelet minus a
    Gaussian multiple that gives it zero mean, periodised by summing the shifted
    copies of the neighbouring periods.
    """
    coords = torch.arange(-2 * size, 2 * size, dtype=torch.float64)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    rotation = torch.tensor(
        [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]], dtype=torch.float64
    )
    inverse = rotation @ torch.diag(torch.tensor([1.0, 1.0 / slant**2], dtype=torch.float64)) @ rotation.T
    inverse = inverse / (2 * sigma**2)
    quad = inverse[0, 0] * xx**2 + (inverse[0, 1] + inverse[1, 0]) * xx * yy + inverse[1, 1] * yy**2
    envelope = torch.exp(-quad)
    gabor = envelope * torch.exp(1j * xi * (xx * math.cos(theta) + yy * math.sin(theta)))
    if xi > 0:
        gabor = gabor - envelope * (gabor.sum() / envelope.sum())  # zero mean: a wavelet
    folded = gabor.reshape(4, size, 4, size).sum(dim=(0, 2))  # periodise onto size x size
    return torch.roll(folded, shifts=(-2 * size % size, -2 * size % size), dims=(0, 1))


class Scattering2d(nn.Module):
    """Second-order 2-D scattering transform with fixed Morlet filters (Bruna and Mallat 2013).

    Input ``(N, 1, H, W)``; output ``(N, K, H / 2**J, W / 2**J)`` with
    ``K = 1 + J L + L**2 J (J - 1) / 2`` channels (81 for J=2, L=8):
    low-passed image, ``|x * psi_{j,l}| * phi`` and ``||x * psi_{j1,l1}| * psi_{j2,l2}| * phi``
    for ``j2 > j1``. The filters are buffers, not parameters, and depend on no
    data, so the features cost no privacy: Tramer and Boneh 2021 ("Differentially
    Private Learning Needs Better Features (or Much More Data)") show that a linear
    model on them beats end-to-end CNNs under DP-SGD on MNIST-sized problems.
    """

    fixed_features = True  # see split_fixed_features

    psi_hat: torch.Tensor  # buffers
    phi_hat: torch.Tensor

    def __init__(self, height: int, width: int, *, scales: int = 2, orientations: int = 8) -> None:
        super().__init__()
        self.scales, self.orientations = scales, orientations
        self.pad = 2**scales
        size = max(height, width) + 2 * self.pad
        self.height, self.width, self.size = height, width, size
        psi = []
        for j in range(scales):
            for ell in range(orientations):
                theta = (int(orientations - orientations / 2 - 1) - ell) * math.pi / orientations
                sigma, xi, slant = 0.8 * 2**j, 3.0 / 4.0 * math.pi / 2**j, 4.0 / orientations
                psi.append(torch.fft.fft2(_morlet(size, sigma, theta, xi, slant)))
        psi_hat = torch.stack(psi)
        psi_hat = psi_hat / psi_hat.abs().amax(dim=(1, 2), keepdim=True)  # unit peak gain per band
        phi_hat = torch.fft.fft2(_morlet(size, 0.8 * 2**scales, 0.0, 0.0, 1.0)).real
        phi_hat = phi_hat / phi_hat[0, 0]  # passes the mean unchanged
        self.register_buffer("psi_hat", psi_hat.to(torch.complex64), persistent=False)
        self.register_buffer("phi_hat", phi_hat.to(torch.float32), persistent=False)

    @property
    def channels(self) -> int:
        j, ell = self.scales, self.orientations
        return 1 + j * ell + ell * ell * j * (j - 1) // 2

    def _low_pass(self, maps: torch.Tensor) -> torch.Tensor:
        smooth = torch.fft.ifft2(torch.fft.fft2(maps) * self.phi_hat).real
        step = 2**self.scales
        rows = slice(self.pad, self.pad + self.height, step)
        cols = slice(self.pad, self.pad + self.width, step)
        return smooth[..., rows, cols]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 1:
            raise ValueError(f"Scattering2d takes one channel, got {x.shape[1]}")
        p = self.pad
        padded = nn.functional.pad(
            x, (p, p + self.size - self.width - 2 * p, p, p + self.size - self.height - 2 * p), mode="reflect"
        )
        x_hat = torch.fft.fft2(padded[:, 0].to(torch.complex64))  # (N, S, S)
        first_hat = x_hat[:, None] * self.psi_hat  # (N, J*L, S, S)
        first = torch.fft.ifft2(first_hat).abs()
        outputs = [self._low_pass(padded[:, 0:1]), self._low_pass(first)]
        first_fft = torch.fft.fft2(first.to(torch.complex64))
        ell = self.orientations
        for j1 in range(self.scales):
            for j2 in range(j1 + 1, self.scales):
                source = first_fft[:, j1 * ell : (j1 + 1) * ell, None]  # (N, L, 1, S, S)
                bands = self.psi_hat[j2 * ell : (j2 + 1) * ell][None, None]  # (1, 1, L, S, S)
                second = torch.fft.ifft2(source * bands).abs().flatten(1, 2)
                outputs.append(self._low_pass(second))
        return torch.cat(outputs, dim=1)


@register_model("scatternet")
def scatternet(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    scales: int = 2,
    orientations: int = 8,
    groups: int = 27,
) -> nn.Module:
    """ScatterNet + linear (Tramer and Boneh 2021): fixed scattering features, GroupNorm, one linear layer.

    GroupNorm normalises each example's features on its own (no batch statistics,
    so no privacy cost), which Tramer and Boneh found essential; the classifier
    is linear, hence convex, which also suits federated averaging of skewed clients.
    """
    channels, height, width = _image_shape(input_shape)
    if channels != 1:
        raise ValueError(f"scatternet takes single-channel images, got {channels} channels")
    scattering = Scattering2d(height, width, scales=scales, orientations=orientations)
    out_h, out_w = len(range(0, height, 2**scales)), len(range(0, width, 2**scales))
    return nn.Sequential(
        scattering,
        *_norm(groups, scattering.channels),
        nn.Flatten(),
        nn.Linear(scattering.channels * out_h * out_w, num_classes),
    )


def split_fixed_features(model: nn.Module) -> tuple[nn.Module | None, nn.Module]:
    """Split a Sequential into its leading fixed feature extractor and the trainable rest.

    A module counts as fixed when it sets ``fixed_features = True`` (the
    scattering transform): it has no parameters and draws no randomness, so
    applying it to a dataset once gives exactly what every forward pass would
    compute, and DP-SGD on the rest is the same mechanism as on the whole model.
    Returns ``(None, model)`` when there is nothing to split off.
    """
    if not isinstance(model, nn.Sequential):
        return None, model
    modules = list(model)
    count = 0
    while count < len(modules) - 1 and getattr(modules[count], "fixed_features", False):
        count += 1
    if count == 0:
        return None, model
    return model[:count], model[count:]


# The embedding-dominated models (fl_node.sparse_models), registered here: that module imports none of this.
register_model("lm")(sparse_models.lm)
register_model("hashed_rec")(sparse_models.hashed_rec)
