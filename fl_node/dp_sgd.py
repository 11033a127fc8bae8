"""DP-SGD's noisy gradient behind one interface (``DPGradient``), from one of two engines.

Per step, with ``engine = dp_gradient(model, mode, ...)`` and the caller's own optimizer::

    loss = F.cross_entropy(engine.forward(x), y)   # the Poisson batch, through the engine
    loss.backward()
    engine.privatize()   # p.grad = (sum_i clip_C(g_i) + N(0, sigma^2 C^2)) / expected batch size
    optimizer.step()

and ``engine.privatize()`` alone for an empty Poisson batch (a noisy step all the same: skipping
it would reveal the empty batch). ``fl_node.train`` runs every private round through this loop.

Two engines, for a stated reason:

* ``"bk"`` (``fl_node.dp_engine.BookKeepingDP``): book-keeping per-example clipping in one
  backward, never the per-example gradient stacks; a DP step costs about 1.25x a plain step on
  the CNN (bench/dp_overhead.py). It supports ``nn.Sequential`` trees of Linear, Conv2d and
  GroupNorm layers and per-example parameter-free modules (``unsupported_reason`` says why
  another model is not).
* Opacus's modes (``"ew"``, ``"hooks"``, ``"functorch"``; ``OpacusGradient``): any module Opacus
  can wrap, among them the text and sparse models (embeddings, sequence layers), at about twice
  the plain step's cost. Re-implementing every such layer's per-example gradients in "bk" would
  duplicate Opacus; so a model "bk" cannot train falls back to Opacus "ew" (logged, with why).

Both are the same mechanism, draw for draw: the same clip factor (Opacus's, with its 1e-6), the
noise N(0, (sigma C)^2) from the same secret stream in the same parameter order
(``fl_node.secure_random``), the same scaling by the expected batch size for a mean loss
(tests/fl_node/test_dp_engine.py compares them). The accounting is the caller's: it records every
step it privatized.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch
from opacus.grad_sample.utils import prepare_module
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from torch import nn

from fl_node.dp_engine import BookKeepingDP, StepNoise, unsupported_reason
from fl_node.secure_random import NoiseSource

logger = logging.getLogger(__name__)

# "bk" is fl_node.dp_engine (book-keeping per-example clipping, one backward); the others are Opacus's.
GRAD_SAMPLE_MODES = ("bk", "hooks", "ew", "functorch")
OPACUS_GRAD_SAMPLE_MODES = ("hooks", "ew", "functorch")
# Fastest correct mode on the CPU CNN in bench/dp_overhead.py. Models that "bk" does not
# support train with FALLBACK_GRAD_SAMPLE_MODE (Opacus ExpandedWeights) instead.
DEFAULT_GRAD_SAMPLE_MODE = "bk"
FALLBACK_GRAD_SAMPLE_MODE = "ew"


class DPGradient(Protocol):
    """One DP-SGD engine: the clipped, noised, scaled gradient of a Poisson batch in every ``p.grad``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output on the batch, computed so that ``privatize`` can clip each example."""
        ...

    def privatize(self) -> None:
        """After the loss's backward (or on its own for an empty batch): set every trainable
        parameter's ``.grad`` to (sum of clipped per-example gradients + noise) / expected batch size."""
        ...

    def zero_grad(self) -> None: ...

    def close(self) -> None:
        """Stop drawing noise ahead (the training run is over)."""
        ...


def resolve_grad_sample_mode(model: nn.Module, requested: str) -> str:
    """The mode that will train ``model``: "bk" falls back to Opacus for models it does not support."""
    if requested != "bk":
        return requested
    reason = unsupported_reason(model)
    if reason is None:
        return "bk"
    logger.info(
        "grad_sample_mode 'bk' does not support this model (%s); using Opacus mode %r",
        reason,
        FALLBACK_GRAD_SAMPLE_MODE,
    )
    return FALLBACK_GRAD_SAMPLE_MODE


def dp_gradient(
    model: nn.Module,
    mode: str,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    expected_batch_size: int,
    noise: NoiseSource,
    noise_device: torch.device | None = None,
) -> DPGradient:
    """The engine of ``mode`` (a resolved one: see ``resolve_grad_sample_mode``) for ``model``.

    ``noise``: the secret stream of the step noise; ``noise_device``: the training device off the
    CPU (the noise reaches it through pinned memory), None on the CPU's default path.
    """
    if mode == "bk":
        return BookKeepingDP(
            model,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            noise=noise,
            loss_reduction="mean",
            noise_device=noise_device,
        )
    if mode not in OPACUS_GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {GRAD_SAMPLE_MODES}, got {mode!r}")
    return OpacusGradient(
        model,
        mode,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        noise=noise,
        noise_device=noise_device,
    )


class OpacusGradient:
    """Opacus's per-example gradients (a GradSampleModule of ``mode``) and its clip-and-noise step
    (``SecretNoiseDPOptimizer``), as a ``DPGradient``: the caller's optimizer takes the step."""

    def __init__(
        self,
        model: nn.Module,
        mode: str,
        *,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: int,
        noise: NoiseSource,
        noise_device: torch.device | None = None,
    ) -> None:
        self.module = prepare_module(model, mode)
        # Opacus's optimizer wraps an optimizer for its parameters; it never steps this one.
        params = torch.optim.SGD([p for p in self.module.parameters() if p.requires_grad], lr=1.0)
        self.optimizer = SecretNoiseDPOptimizer(
            params,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            expected_batch_size=expected_batch_size,
            randomness=noise,
            noise_device=noise_device,
        )
        self._batch = False  # a forward since the last privatize

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)  # the hooks accumulate per-example gradients
        self._batch = True
        return self.module(x)

    __call__ = forward

    def privatize(self) -> None:
        if not self._batch:  # an empty batch: no per-example gradient, the noise alone
            self.optimizer.zero_grad(set_to_none=True)
            for p in self.optimizer.params:
                p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
        self._batch = False
        if not self.optimizer.pre_step():  # clip, sum, noise, scale; skips only virtual steps
            raise RuntimeError("Opacus skipped a step: virtual steps are not used here")

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        self.optimizer.close()
        self.module._close()


class SecretNoiseDPOptimizer(DPOptimizer):
    """Opacus's DPOptimizer drawing its noise from a secret stream instead of a torch generator.

    Opacus's own secure mode needs torchcsprng, which has no build for this torch; the
    stream's ``normal`` is the same four-draw construction.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        randomness: NoiseSource,
        noise_device: torch.device | str | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(optimizer, **kwargs)
        self.noise = randomness
        self._noise = StepNoise(randomness, self.params, device=noise_device)

    def add_noise(self) -> None:
        std = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
        _, noises = self._noise.draw(std)
        for p, noise in zip(self.params, noises, strict=True):
            p.grad = noise.add_(p.summed_grad.view_as(noise)).view_as(p)
            _mark_as_processed(p.summed_grad)

    def close(self) -> None:
        """Stop drawing noise ahead (the training run is over)."""
        self._noise.close()
