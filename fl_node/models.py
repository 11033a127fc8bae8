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
        nn.MaxPool2d(2, 1),
        nn.Conv2d(first, second, 3 if small else 4, stride=2),
        *_norm(groups, second),
        activation(act),
        nn.MaxPool2d(2, 1),
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
        return input_shape  # type: ignore[return-value]
    raise ValueError(f"cnn needs an image shape (C, H, W) or (H, W), got {input_shape}")


class MeanPoolTextClassifier(nn.Module):
    """Embedding -> mean over non-padding tokens -> linear. Token id 0 is padding."""

    def __init__(self, vocab_size: int, embed_dim: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
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
