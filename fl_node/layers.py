"""Layers the built-in models use where torch's own is slow on the CPU.

``MaxPool2d``: torch's max-pooling kernel for NCHW tensors without autograd (inference: a
committee member's scores, a node's metrics, the served model) is about 16 times slower than
the same window maximum taken as elementwise maxima of shifted views, for the 2x2, stride-1
pools of the CNN (bench/eval_pool.py: 14.6 ms against 0.9 ms on 180 MNIST feature maps; a
score takes 18 ms instead of 35). The values are identical (a maximum is exact). With autograd the
module keeps torch's kernel: it is as fast there, and its backward sends a tie's gradient to
one input, as training always did.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.modules.utils import _pair


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d``, with stride-1 pools without padding taken as shifted maxima when no
    gradient is needed (see the module docstring)."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 (torch's argument name)
        if (torch.is_grad_enabled() and input.requires_grad) or not self._shifted_maxima():
            return super().forward(input)
        kh, kw = _pair(self.kernel_size)
        out = _window_max(input, kw, dim=-1)
        return _window_max(out, kh, dim=-2)

    def _shifted_maxima(self) -> bool:
        return (
            _pair(self.stride) == (1, 1)
            and _pair(self.padding) == (0, 0)
            and _pair(self.dilation) == (1, 1)
            and not self.ceil_mode
            and not self.return_indices
        )


def _window_max(x: Tensor, size: int, *, dim: int) -> Tensor:
    """The maximum over every ``size`` consecutive entries along ``dim`` (stride 1)."""
    length = x.shape[dim] - size + 1
    if length < 1:  # as torch's kernel: an output of size 0 or less is an error
        raise RuntimeError(f"max pool window {size} is larger than the input's size {x.shape[dim]}")
    out = x.narrow(dim, 0, length)
    if size == 1:
        return out.clone()  # a new tensor, as torch's kernel returns, not a view of the input
    for offset in range(1, size):
        out = torch.maximum(out, x.narrow(dim, offset, length))
    return out
