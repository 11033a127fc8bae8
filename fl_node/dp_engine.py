"""A lean DP-SGD gradient engine ("bk") for Sequential models of Linear, Conv2d and GroupNorm layers.

DP-SGD (Abadi et al. 2016) needs, per step, the sum over the batch of every
example's gradient clipped to L2 norm ``max_grad_norm``, plus Gaussian noise.
Opacus materialises every per-example gradient of every parameter, stacks
them, and sums them again; this engine follows the book-keeping idea of Bu et
al. 2022 ("Differentially Private Optimization on Large Model at Small Cost")
and the ghost norm of Li et al. 2022 ("Large Language Models Can Be Strong
Differentially Private Learners") instead:

* one forward through the model's own layers, with each trainable layer run
  through a small ``autograd.Function`` that keeps its input and, in the single
  backward pass, its output gradient -- and returns only the input gradient:
  autograd never computes the (non-private) weight gradients at all;
* per-example gradient norms layer by layer from those two tensors: for a
  Linear layer without a sequence dimension ``||g_i||^2 ||a_i||^2``, never the
  gradient itself; for a convolution either the per-example gradients (batched
  GEMMs on a partly or wholly unfolded input, or one grouped convolution,
  whichever is fastest for the layer's shape) or the ghost norm (``sum_{l,l'} (g_l . g_l')(a_l . a_l')``), whichever costs fewer
  multiplications for that layer's shape; for GroupNorm the per-channel sums;
* the clipped sum ``sum_i c_i g_i`` with ``c_i = min(1, C / (||g_i|| + 1e-6))``
  as ONE weight gradient of the re-weighted output gradients ``c_i * dL_i/ds_i``
  (the gradient of ``sum_i c_i L_i``, without a second backward), or, where the
  per-example gradients were materialised anyway, as their ``c``-weighted sum.

The mechanism is exactly Opacus's: the same clip factor formula (including its
``1e-6``), noise ``N(0, (noise_multiplier * max_grad_norm)^2)`` drawn with
the same noise source per parameter in the same order (``fl_node.secure_random``), the
same scaling by the expected batch size for a mean loss, and a noisy step for an
empty Poisson batch. ``tests/fl_node/test_dp_engine.py`` checks it against
Opacus. The accounting is unchanged: the caller records every step.

Supported models: ``nn.Sequential`` trees (possibly nested) whose leaves are
Linear, Conv2d (zero padding, groups 1) or GroupNorm layers, or parameter-free
per-example modules from a fixed list (activations, pooling, flatten, dropout,
identity). ``unsupported_reason`` says why any other model is not; callers
fall back to Opacus for those.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from concurrent.futures import Future

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fl_node.layers import MaxPool2d
from fl_node.secure_random import DrawAhead, NoiseSource, SecureRandom, TorchRandom, helper_thread

# Parameter-free modules that act on each example on its own, so they cannot mix examples.
PER_EXAMPLE_MODULES: tuple[type[nn.Module], ...] = (
    nn.Identity,
    nn.Flatten,
    nn.Unflatten,
    nn.Tanh,
    nn.ReLU,
    nn.ELU,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.LeakyReLU,
    nn.Softplus,
    nn.Hardtanh,
    nn.MaxPool1d,
    nn.MaxPool2d,
    MaxPool2d,  # fl_node.layers: nn.MaxPool2d with a faster inference path
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
    nn.Dropout,
    nn.Dropout2d,
)
LOSS_REDUCTIONS = ("mean", "sum")
# Above this many floats (256 MiB) a layer's per-example gradients are never materialised.
_MAX_PER_EXAMPLE_ELEMENTS = 1 << 26


def _leaves(module: nn.Module) -> Iterator[nn.Module]:
    if type(module) is nn.Sequential:
        for child in module:
            yield from _leaves(child)
    else:
        yield module


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the engine cannot train ``model`` exactly, or None when it can."""
    if type(model) is not nn.Sequential:
        return f"the model is a {type(model).__name__}, not an nn.Sequential of supported layers"
    seen: set[int] = set()
    for leaf in _leaves(model):
        name = type(leaf).__name__
        if isinstance(leaf, nn.Conv2d) and type(leaf) is nn.Conv2d:
            if leaf.groups != 1:
                return f"{name} with groups={leaf.groups} (only groups=1)"
            if leaf.padding_mode != "zeros" or isinstance(leaf.padding, str):
                return (
                    f"{name} with padding {leaf.padding!r}/{leaf.padding_mode!r} (only numeric zero padding)"
                )
        elif type(leaf) in (nn.Linear, nn.GroupNorm):
            pass
        elif isinstance(leaf, PER_EXAMPLE_MODULES) and type(leaf) in PER_EXAMPLE_MODULES:
            if any(True for _ in leaf.parameters()):
                return f"{name} has parameters"
            continue
        else:
            return f"layer type {name} is not supported"
        for param in leaf.parameters(recurse=False):
            if id(param) in seen:
                return f"a parameter of {name} is shared with another layer"
            seen.add(id(param))
    if len(seen) != len({id(p) for p in model.parameters()}):
        return "the model has parameters outside its supported layers"
    return None


class StepNoise:
    """Each step's Gaussian noise for a fixed list of tensors, in one flat buffer the caller may keep.

    An engine (``BookKeepingDP``, ``fl_node.dp_sgd.SecretNoiseDPOptimizer``) owns one and closes
    it when it closes. From a secret stream the whole step is one draw on a helper thread (the
    noise does not depend on the data): one step ahead (``DrawAhead``, the default), or, with
    ``ahead=False`` (``BookKeepingDP``), started by ``prefetch`` as the step's forward begins,
    so it runs while the forward's long kernels leave the interpreter to it and nothing is drawn
    before its step. The helper also cuts the draw into the tensors' views (on the default
    path) or pins it (for a GPU); from a torch
    generator the draws go tensor by tensor in Opacus's order, so tests can compare two
    engines draw for draw. Tensors of mixed dtypes get one draw each and no flat buffer.

    Device: the noise is always drawn on the CPU, from the same stream in the same order,
    whatever device trains (never from a device's generator, which a public seed would
    determine). For tensors off the CPU, or for an explicit ``device``, each draw takes the
    device path: it lands in page-locked memory (pinned by the helper thread where the device
    is a GPU) and is copied into a fresh buffer on ``device`` without blocking, ordered before
    the kernels that add the clipped sum to it. With ``device=torch.device("cpu")`` that path
    runs on the CPU (a real copy), which is how tests compare it with the default one.
    """

    def __init__(
        self,
        source: NoiseSource,
        tensors: Sequence[torch.Tensor],
        *,
        device: torch.device | str | None = None,
        ahead: bool = True,
    ) -> None:
        self.source = source
        self._shapes = [t.shape for t in tensors]
        self._sizes = [t.numel() for t in tensors]
        dtypes = {t.dtype for t in tensors}
        self._dtype = dtypes.pop() if len(dtypes) == 1 else None
        self._dtypes = [t.dtype for t in tensors]
        self._ahead: DrawAhead[tuple[torch.Tensor, list[torch.Tensor]]] | None = None
        self._ahead_std: float | None = None
        # ahead=False: no draw is made before its step; ``prefetch`` starts the step's own draw.
        self._one_ahead = ahead
        self._soon: Future[tuple[torch.Tensor, list[torch.Tensor]]] | None = None
        self._soon_std: float | None = None
        if device is None:
            on = {t.device for t in tensors}
            if len(on) > 1:
                raise ValueError(f"the noised tensors lie on several devices: {sorted(map(str, on))}")
            device = on.pop() if on and next(iter(on)).type != "cpu" else None
        # None: the default path (the CPU, no copy). Otherwise the device the noise goes to.
        self.device = torch.device(device) if device is not None else None
        self._pin = self.device is not None and self.device.type == "cuda"

    def draw(self, std: float) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """(flat buffer or None, one fresh noise tensor per tensor, views of the buffer when there is one)."""
        if self._dtype is None:
            if std == 0:
                noises = [torch.zeros(s, dtype=d) for s, d in zip(self._shapes, self._dtypes, strict=True)]
            else:
                noises = [
                    self.source.normal(s, std=std, dtype=d)
                    for s, d in zip(self._shapes, self._dtypes, strict=True)
                ]
            return None, noises if self.device is None else [self._to_device(n) for n in noises]
        total = sum(self._sizes)
        if std == 0:
            flat = torch.zeros(total, dtype=self._dtype)
        elif isinstance(self.source, SecureRandom) and not self._one_ahead:
            soon, self._soon = self._soon, None
            if soon is not None and self._soon_std == std:
                flat, views = soon.result()
            else:  # no prefetch this step (an empty batch): drawn here
                flat, views = self._secure_draw(self.source, total, std, self._dtype)
            if self.device is None:
                return flat, views
        elif isinstance(self.source, SecureRandom):
            if self._ahead is None or self._ahead_std != std:
                self.close()
                self._ahead = DrawAhead(
                    functools.partial(self._secure_draw, self.source, total, std, self._dtype)
                )
                self._ahead_std = std
            flat, views = self._ahead.take()
            if self.device is None:
                return flat, views
        else:
            flat = torch.empty(total, dtype=self._dtype)
            for part, shape in zip(flat.split(self._sizes), self._shapes, strict=True):
                part.copy_(self.source.normal(shape, std=std, dtype=self._dtype).view(-1))
        if self.device is not None:
            flat = self._to_device(flat)
        return flat, self._views(flat)

    def prefetch(self, std: float) -> None:
        """Start this step's draw from the secret stream on the helper thread (``ahead=False``).

        Called as the step's forward begins, so the draw runs while the forward and backward
        keep the training thread busy; ``draw`` then takes it. Nothing is drawn before its step.
        """
        if self._one_ahead or self._soon is not None or std == 0 or self._dtype is None:
            return
        if isinstance(self.source, SecureRandom):
            total = sum(self._sizes)
            self._soon = helper_thread().submit(self._secure_draw, self.source, total, std, self._dtype)
            self._soon_std = std

    def _secure_draw(
        self, source: SecureRandom, total: int, std: float, dtype: torch.dtype
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One step's noise from the secret stream (on the helper thread): the flat buffer, and
        its views on the default path; pinned, without views, on a GPU's path."""
        flat = source.normal((total,), std=std, dtype=dtype)
        if self.device is not None:
            return (flat.pin_memory() if self._pin else flat), []
        return flat, self._views(flat)

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [part.view(shape) for part, shape in zip(flat.split(self._sizes), self._shapes, strict=True)]

    def _to_device(self, noise: torch.Tensor) -> torch.Tensor:
        """A copy of ``noise`` on the device, sent without blocking from pinned memory.

        The caching host allocator keeps a pinned block until the copy that reads it is done.
        """
        if self._pin and not noise.is_pinned():
            noise = noise.pin_memory()
        return torch.empty_like(noise, device=self.device).copy_(noise, non_blocking=True)

    def close(self) -> None:
        """Stop drawing ahead (the training run is over)."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None


# A convolution's per-example weight gradients, as _conv_per_example returns them: (B, N, F)
# blocks, and the layout they follow: ``weight.view(shape).permute(order)`` is (B, *F's dims).
ConvLayout = tuple[tuple[int, ...], tuple[int, ...]]


class _Tape:
    """What one layer keeps between forward and privatization: input and output gradient."""

    __slots__ = (
        "module",
        "params",
        "activation",
        "grad_output",
        "stats",
        "per_example",
        "plan",
        "conv_layout",
    )

    def __init__(self, module: nn.Linear | nn.Conv2d | nn.GroupNorm) -> None:
        self.module = module
        self.params = [p for p in module.parameters(recurse=False) if p.requires_grad]
        self.activation: torch.Tensor | None = None
        self.grad_output: torch.Tensor | None = None
        self.stats: tuple[torch.Tensor, torch.Tensor] | None = None  # GroupNorm's mean and 1/std
        self.per_example: list[torch.Tensor] = []
        self.plan: str | None = None
        self.conv_layout: ConvLayout = ((), ())  # how a convolution's per-example gradients are laid out

    def clear(self) -> None:
        self.activation = self.grad_output = self.stats = None
        self.per_example = []

    def recorded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's input and output gradient of the last backward pass."""
        if self.activation is None or self.grad_output is None:
            raise RuntimeError("no backward pass recorded this layer's input and output gradient")
        return self.activation, self.grad_output


class _LinearTap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, tape):  # noqa: ANN001, ANN205
        ctx.tape = tape
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):  # noqa: ANN001, ANN205
        x, weight = ctx.saved_tensors
        ctx.tape.activation, ctx.tape.grad_output = x, grad_output
        grad_x = grad_output @ weight if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


class _Conv2dTap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, tape):  # noqa: ANN001, ANN205
        ctx.tape = tape
        ctx.save_for_backward(x, weight)
        conv = tape.module
        return F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation, 1)

    @staticmethod
    def backward(ctx, grad_output):  # noqa: ANN001, ANN205
        x, weight = ctx.saved_tensors
        ctx.tape.activation, ctx.tape.grad_output = x, grad_output
        grad_x = None
        if ctx.needs_input_grad[0]:
            conv = ctx.tape.module
            grad_x = torch.ops.aten.convolution_backward(
                grad_output,
                x,
                weight,
                None,
                list(conv.stride),
                list(conv.padding),
                list(conv.dilation),
                False,
                [0, 0],
                1,
                [True, False, False],
            )[0]
        return grad_x, None, None, None


class _GroupNormTap(torch.autograd.Function):
    """GroupNorm through the fused kernels; keeps the input and the group statistics."""

    @staticmethod
    def forward(ctx, x, weight, bias, tape):  # noqa: ANN001, ANN205
        norm = tape.module
        n, channels = x.shape[:2]
        x = x.contiguous(memory_format=_memory_format(x))  # what the fused kernels expect
        out, mean, rstd = torch.native_group_norm(
            x, weight, bias, n, channels, x[0, 0].numel(), norm.num_groups, norm.eps
        )
        ctx.tape = tape
        ctx.save_for_backward(x, weight, mean, rstd)
        return out

    @staticmethod
    def backward(ctx, grad_output):  # noqa: ANN001, ANN205
        x, weight, mean, rstd = ctx.saved_tensors
        tape = ctx.tape
        tape.activation, tape.grad_output, tape.stats = x, grad_output, (mean, rstd)
        grad_x = None
        if ctx.needs_input_grad[0]:
            n, channels = x.shape[:2]
            grad_x = torch.ops.aten.native_group_norm_backward(
                grad_output.contiguous(memory_format=_memory_format(x)),
                x,
                mean,
                rstd,
                weight,
                n,
                channels,
                x[0, 0].numel(),
                tape.module.num_groups,
                [True, False, False],
            )[0]
        return grad_x, None, None, None


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    """Channels-last for a 4-d tensor laid out so (and not also plain contiguous), else contiguous."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _unfold(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """(N, C, H, W) -> (N, L, K): every output position's receptive field, K = C * kh * kw.

    One gather of the (padded) input by precomputed positions (``_gather``): several times
    faster on CPU than ``F.unfold`` (im2col), and faster than copying the strided view. K is
    ordered (C, kh, kw) -- the weight's own order -- when there are fewer channels than
    kernel columns (the first layer), and (kh, kw, C) otherwise (the order the copy of the
    strided view ran fastest in); ``_weight_order`` maps gradients back to the weight.
    """
    (ph, pw), (sh, sw), (dh, dw) = _padding(conv), conv.stride, conv.dilation
    kh, kw = conv.kernel_size
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    n, channels, height, width = x.shape
    out_h = (height - dh * (kh - 1) - 1) // sh + 1
    out_w = (width - dw * (kw - 1) - 1) // sw + 1
    plane = height * width
    if _channels_last(conv):
        size, stride = (kh, kw, channels), (dh * width, dw, plane)
    else:
        size, stride = (channels, kh, kw), (plane, dh * width, dw)
    u = _gather(x, (out_h, out_w, *size), (sh * width, sw, *stride))
    return u.view(n, out_h * out_w, channels * kh * kw)


def _gather(x: torch.Tensor, size: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
    """(N, prod(size)): each example's strided view (size, stride) of its flattened (C, H, W), copied.

    One gather by positions computed once per shape (``_positions``): about three times
    faster on this CPU than copying the strided view itself when its innermost runs are short.
    """
    n, channels, height, width = x.shape
    positions = _positions(channels * height * width, size, stride, x.device)
    return x.reshape(n, -1).index_select(1, positions)


@functools.lru_cache(maxsize=16)
def _positions(
    elements: int, size: tuple[int, ...], stride: tuple[int, ...], device: torch.device
) -> torch.Tensor:
    return torch.arange(elements, device=device).as_strided(size, stride).reshape(-1)


def _padding(conv: nn.Conv2d) -> tuple[int, int]:
    """The layer's numeric padding (a string one, "same" or "valid", is refused by unsupported_reason)."""
    if isinstance(conv.padding, str):
        raise ValueError(f"padding {conv.padding!r}: only numeric zero padding is supported")
    ph, pw = conv.padding
    return ph, pw


def _channels_last(conv: nn.Conv2d) -> bool:
    return conv.in_channels >= conv.kernel_size[1]


def _channels_last_k(module: nn.Module) -> bool:
    """Whether ``_unfold`` orders this layer's K as (kh, kw, C) rather than the weight's (C, kh, kw)."""
    return isinstance(module, nn.Conv2d) and _channels_last(module)


def _weight_order(weight: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """A view of a weight-shaped tensor whose layout matches the (O, K) gradients of ``_unfold``'s K order."""
    if _channels_last_k(module):
        return weight.permute(0, 2, 3, 1)  # (O, kh, kw, C)
    return weight.view(weight.shape[0], -1)


def _ghost_norm_is_cheaper(n: int, length: int, fan_in: int, fan_out: int) -> bool:
    """Whether a layer over ``length`` positions takes the ghost norm rather than per-example gradients.

    Autograd computed no weight gradient, so materialising the per-example ones costs about
    that GEMM, after which their weighted sum is cheap; the ghost norm costs its two Gram
    matrices on top of the re-weighted GEMM, and wins only where they are small next to one
    per-example gradient, or where the per-example gradients would take too much memory.
    (Measured in a training step on this CPU: the ghost norm of the default CNN's second
    convolution, 25 positions, is slower than materialising, although alone it is faster.)
    """
    grams = length * length * (fan_in + fan_out)
    return grams < fan_in * fan_out or n * fan_in * fan_out > _MAX_PER_EXAMPLE_ELEMENTS


def _conv_per_example(x: torch.Tensor, g: torch.Tensor, conv: nn.Conv2d) -> tuple[torch.Tensor, ConvLayout]:
    """Every example's weight gradient of ``conv`` from its input (N, C, H, W) and output gradient (N, O, oh, ow).

    Three ways, each the fastest on one kind of layer (measured in a training step of the
    default CNN on this CPU, 64 examples), none with a copy larger than a few times the
    layer's input or than the per-example gradients themselves:

    * fewer input channels than kernel columns (a first layer): ``_conv_rows``, a batched
      GEMM per kernel row (or per ``stride`` kernel rows) on a copy of the input unfolded
      along the columns only (0.6-0.7x the time of the grouped convolution of
      ``weight[n, o, c, i, j] = sum_pq g[n, o, p, q] x[n, c, i*dil + p*stride, ...]`` it replaces);
    * no more output positions than output channels: the unfolded input (``_unfold``, no
      larger than the per-example gradients) times the output gradients, one batched GEMM
      (about half the time of the grouped convolution below);
    * otherwise the weight gradient of the layer run as one grouped convolution with a
      group per example (Rochette et al. 2019), whose weight gradient is the per-example one.
    """
    (ph, pw), (sh, sw), (dh, dw) = _padding(conv), conv.stride, conv.dilation
    kh, kw = conv.kernel_size
    n, channels = x.shape[:2]
    out_channels, oh, ow = g.shape[1:]
    method = _conv_method(conv, oh * ow)
    if method == "rows":
        return _conv_rows(x, g, conv)
    if method == "unfolded":  # _unfold's K in (kh, kw, C) order
        return torch.bmm(g.flatten(2), _unfold(x, conv)).view(1, n, -1), (conv.weight.shape, (0, 2, 3, 1))
    shape = (n * out_channels, channels, kh, kw)
    per_example = torch.ops.aten.convolution_backward(
        g.reshape(1, n * out_channels, oh, ow),
        x.reshape(1, n * channels, *x.shape[2:]),
        g.new_empty(()).expand(shape),  # only its shape is read
        None,
        [sh, sw],
        [ph, pw],
        [dh, dw],
        False,
        [0, 0],
        n,
        [False, True, False],
    )[1]
    return per_example.view(1, n, -1), (conv.weight.shape, (0, 1, 2, 3))


def _conv_method(conv: nn.Conv2d, positions: int) -> str:
    """Which way ``_conv_per_example`` takes for a layer with ``positions`` output positions."""
    if not _channels_last(conv):
        return "rows"
    return "unfolded" if positions <= conv.out_channels else "grouped"


def _conv_rows(x: torch.Tensor, g: torch.Tensor, conv: nn.Conv2d) -> tuple[torch.Tensor, ConvLayout]:
    """Per-example weight gradients of a convolution with few input channels, a kernel row at a time.

    Kernel row i reads input rows ``dh * i + sh * p`` = ``sh * (start_i + p) + phase_i``. The
    input is copied once as u[n, m, q, s, c, j] = x[n, c, sh*m + s, dw*j + sw*q]: unfolded
    along the columns only, its rows split by phase. For every kernel row, u's rows
    start_i .. start_i + oh - 1 of its phase are then a plain (oh * ow, C * kw) matrix per
    example, and the row's gradients are one batched GEMM with the output gradients
    (N, O, oh * ow). Without dilation and with kh a multiple of the stride, sh consecutive
    kernel rows share their start: one GEMM covers all their phases.
    """
    (ph, pw), (sh, sw), (dh, dw) = _padding(conv), conv.stride, conv.dilation
    kh, kw = conv.kernel_size
    n, out_channels, oh, ow = g.shape
    channels = x.shape[1]
    starts = [(dh * i) // sh for i in range(kh)]
    phases = [(dh * i) % sh for i in range(kh)]
    m = max(starts) + oh
    extra = max(0, sh * m - (x.shape[2] + 2 * ph))  # zero rows so that every phase has m rows
    x = F.pad(x, (pw, pw, ph, ph + extra))
    height, width = x.shape[2:]
    u = _gather(x, (m, ow, sh, channels, kw), (sh * width, sw, width, height * width, dw))
    u = u.view(n, m, ow, sh, channels, kw)
    gm = g.reshape(n, out_channels, oh * ow)
    if dh == 1 and kh % sh == 0:  # kernel row i = sh * b + s
        blocks = kh // sh
        out = torch.empty(blocks, n, out_channels, sh * channels * kw, dtype=g.dtype, device=g.device)
        for b in range(blocks):
            torch.bmm(gm, u[:, b : b + oh].reshape(n, oh * ow, sh * channels * kw), out=out[b])
        # (blocks, O, s, C, kw) of the weight seen as (O, C, blocks, s, kw)
        return out.view(blocks, n, -1), ((out_channels, channels, blocks, sh, kw), (2, 0, 3, 1, 4))
    out = torch.empty(kh, n, out_channels, channels * kw, dtype=g.dtype, device=g.device)
    for i in range(kh):
        rows = u[:, starts[i] : starts[i] + oh, :, phases[i]].reshape(n, oh * ow, channels * kw)
        torch.bmm(gm, rows, out=out[i])
    return out.view(kh, n, -1), ((out_channels, channels, kh, kw), (2, 0, 1, 3))


def _trainable(param: torch.Tensor | None) -> torch.Tensor | None:
    return param if param is not None and param.requires_grad else None


class BookKeepingDP:
    """Per-example clipping and Gaussian noise for one ``nn.Sequential`` model, Opacus-exact.

    Per step::

        loss = F.cross_entropy(engine.forward(x), y)     # mean loss: loss_reduction="mean"
        loss.backward()
        engine.privatize()       # sets p.grad = (sum_i clip(g_i) + noise) / expected_batch_size

    and ``engine.privatize()`` alone for an empty Poisson batch (noise only).
    The optimizer then steps on ``p.grad`` as usual.

    On a GPU (the model's parameters there) the per-example norms, clip factors and clipped
    sums run there too; only the secret noise is drawn on the CPU and sent over (StepNoise).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        noise_multiplier: float,
        max_grad_norm: float,
        expected_batch_size: int,
        noise: NoiseSource | None = None,
        generator: torch.Generator | None = None,
        loss_reduction: str = "mean",
        noise_device: torch.device | str | None = None,
    ) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the bk engine cannot train this model: {reason}")
        if loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"loss_reduction must be one of {LOSS_REDUCTIONS}, got {loss_reduction!r}")
        self.model = model
        self.noise_multiplier = float(noise_multiplier)
        self.max_grad_norm = float(max_grad_norm)
        self.expected_batch_size = int(expected_batch_size)
        # The noise is secret (SecureRandom) unless a caller asks for a reproducible torch
        # generator, which only tests and benchmarks comparing against Opacus do.
        if noise is None:
            noise = TorchRandom(generator) if generator is not None else SecureRandom()
        self.noise = noise
        self.loss_reduction = loss_reduction
        self._leaves = list(_leaves(model))
        self._tapes = {
            id(m): _Tape(m) for m in self._leaves if isinstance(m, nn.Linear | nn.Conv2d | nn.GroupNorm)
        }
        self._tapes = {k: t for k, t in self._tapes.items() if t.params}
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        # The noise goes to the parameters' device (see StepNoise); ``noise_device`` forces the
        # device path, also on the CPU.
        self._noise = StepNoise(self.noise, self.params, device=noise_device, ahead=False)
        self.batch_size = 0

    # ------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's forward, with every trainable layer taped for per-example norms.

        Starts this step's noise draw on the helper thread (it runs while forward and backward
        keep this thread busy; ``privatize`` takes it).
        """
        self.batch_size = len(x)
        self._noise.prefetch(self.noise_multiplier * self.max_grad_norm)
        for leaf in self._leaves:
            tape = self._tapes.get(id(leaf))
            if tape is None:
                x = leaf(x)
            elif isinstance(leaf, nn.Linear):
                x = _LinearTap.apply(x, leaf.weight, leaf.bias, tape)
            elif isinstance(leaf, nn.Conv2d):
                x = _Conv2dTap.apply(x, leaf.weight, leaf.bias, tape)
            else:
                x = _GroupNormTap.apply(x, leaf.weight, leaf.bias, tape)
        return x

    __call__ = forward

    # ------------------------------------------------------------ per-example norms

    def _norms(self, tape: _Tape) -> list[torch.Tensor]:
        """Per-example gradient norms (N,) of each of the layer's trainable parameters; plans the clipped sum.

        Works on the unscaled output gradients (the caller folds a mean loss's
        batch size into the norms and clip factors instead of copying them).
        """
        module = tape.module
        a, g = tape.recorded()
        n = len(g)
        weight, bias = _trainable(module.weight), _trainable(module.bias)
        if isinstance(module, nn.GroupNorm):
            # Per example and channel c in group k: d/dweight_c = sum_s g * (x - mean_k) * rstd_k,
            # d/dbias_c = sum_s g. A GroupNorm of one example whose channels are all the batch's
            # (N * C channels, N * groups groups) has the same groups and statistics, and its
            # weight and bias gradients are exactly these sums: one fused kernel computes them.
            if tape.stats is None:
                raise RuntimeError("no forward pass recorded this GroupNorm's statistics")
            mean, rstd = tape.stats
            channels, groups = module.num_channels, module.num_groups
            _, weight_grads, bias_grads = torch.ops.aten.native_group_norm_backward(
                g.reshape(1, n * channels, -1),  # a copy only for a channels-last layout
                a.reshape(1, n * channels, -1),
                mean.view(1, n * groups),
                rstd.view(1, n * groups),
                g.new_ones(n * channels),  # a real weight, though only the input gradient reads one
                1,
                n * channels,
                g[0, 0].numel(),
                n * groups,
                [False, weight is not None, bias is not None],
            )
            per_example = [t.view(n, channels) for t in (weight_grads, bias_grads) if t is not None]
            tape.per_example, tape.plan = per_example, "materialized"
            return [torch.linalg.vector_norm(t, dim=1) for t in per_example]
        if isinstance(module, nn.Conv2d):
            return self._conv_norms(tape, module, weight is not None, bias is not None)
        # Linear: (N, *, I) -> a: (N, L, I), g: (N, O, L)
        a = a.reshape(n, -1, a.shape[-1])
        g = g.reshape(n, -1, g.shape[-1]).transpose(1, 2)
        return self._sequence_norms(tape, a, g, weight is not None, bias is not None)

    def _conv_norms(self, tape: _Tape, module: nn.Conv2d, weight: bool, bias: bool) -> list[torch.Tensor]:
        x, g = tape.recorded()
        n, fan_out = g.shape[:2]
        length = g.shape[2] * g.shape[3]
        fan_in = module.in_channels * module.kernel_size[0] * module.kernel_size[1]
        if weight and _ghost_norm_is_cheaper(n, length, fan_in, fan_out):
            return self._sequence_norms(tape, _unfold(x, module), g.flatten(2), weight, bias)
        # Per-example weight gradients (_conv_per_example), then their clip-weighted sum.
        tape.plan, tape.per_example, norms = "materialized", [], []
        if weight:
            tape.plan = f"materialized {_conv_method(module, length)}"
            per_example, tape.conv_layout = _conv_per_example(x, g, module)
            tape.per_example.append(per_example)
            norms.append(torch.linalg.vector_norm(per_example, dim=(0, 2)))
        if bias:
            bias_grads = g.sum((2, 3))  # (N, O)
            tape.per_example.append(bias_grads)
            norms.append(torch.linalg.vector_norm(bias_grads, dim=1))
        return norms

    def _sequence_norms(
        self, tape: _Tape, a: torch.Tensor, g: torch.Tensor, weight: bool, bias: bool
    ) -> list[torch.Tensor]:
        """Norms from a: (N, L, K) and g: (N, O, L) -- a Linear layer, or a convolution's unfolded input."""
        n = len(g)
        length, fan_in, fan_out = a.shape[1], a.shape[2], g.shape[1]
        tape.per_example = []
        norms = []
        if length == 1:  # no sequence: ||g a^T|| = ||g|| ||a||, and the sum is one GEMM
            g, a = g.reshape(n, fan_out), a.reshape(n, fan_in)
            tape.activation, tape.grad_output, tape.plan = a, g, "reweight"
            g_norm = torch.linalg.vector_norm(g, dim=1)
            if weight:
                norms.append(g_norm * torch.linalg.vector_norm(a, dim=1))
            if bias:
                tape.per_example.append(g)  # the bias gradients are the output gradients
                norms.append(g_norm)
            return norms
        tape.activation, tape.grad_output = a, g
        if weight:
            if _ghost_norm_is_cheaper(n, length, fan_in, fan_out):
                tape.plan = "reweight"
                gram = torch.bmm(g.transpose(1, 2), g).mul_(torch.bmm(a, a.transpose(1, 2)))
                # The sum of an elementwise product of two Gram matrices is ||g_i a_i^T||^2 >= 0;
                # clamp the rounding so the root is defined.
                norms.append(gram.sum((1, 2)).clamp_(min=0).sqrt_())
            else:
                per_example = torch.bmm(g, a)  # (N, O, K): the per-example weight gradients
                tape.per_example.append(per_example)
                tape.plan = "materialized"
                norms.append(torch.linalg.vector_norm(per_example.flatten(1), dim=1))
        if bias:
            bias_grads = g.sum(2)  # (N, O), kept for the clipped sum
            tape.per_example.append(bias_grads)
            norms.append(torch.linalg.vector_norm(bias_grads, dim=1))
        return norms

    def _add_clipped_sum(self, tape: _Tape, clip: torch.Tensor, grads: list[torch.Tensor]) -> None:
        """Add sum_i clip_i * grad_i of each trainable parameter of the layer into ``grads`` (in place).

        ``grads`` are the noise tensors of ``tape.params``, in order; each sum is one BLAS
        call that accumulates into them, except where the sum's layout is not the weight's
        (a convolution's unfolded or per-row gradients): one batched GEMM, then one add.
        """
        module = tape.module
        per_example = iter(tape.per_example)
        if _trainable(module.weight) is not None:
            weight = grads[0]
            if tape.plan == "reweight":  # one weight gradient of the re-weighted output gradients
                a, g = tape.recorded()
                if g.dim() == 2:  # (N, O), (N, K): no sequence
                    weighted, rows = g * clip.view(-1, 1), a
                else:  # (N, O, L), (N, L, K)
                    weighted = (g * clip.view(-1, 1, 1)).transpose(1, 2).reshape(-1, g.shape[1])
                    rows = a.reshape(-1, a.shape[2])
                if _channels_last_k(module):  # K in _unfold's (kh, kw, C) order, also for one position
                    order = _weight_order(weight, module)
                    order.add_((weighted.T @ rows).view(order.shape))
                else:
                    weight.view(weighted.shape[1], rows.shape[1]).addmm_(weighted.T, rows)
            else:
                materialized = next(per_example)
                if isinstance(module, nn.Conv2d):  # (B, N, F) blocks laid out as tape.conv_layout says
                    shape, dims = tape.conv_layout
                    if len(materialized) == 1 and dims == tuple(range(len(dims))):
                        weight.view(-1).addmv_(materialized[0].T, clip)
                    else:
                        summed = torch.bmm(clip.expand(len(materialized), 1, -1), materialized)
                        target = weight.view(shape).permute(dims)
                        target.add_(summed.view(target.shape))
                else:  # (N, ...) in the weight's own order
                    weight.view(-1).addmv_(materialized.flatten(1).T, clip)
        if _trainable(module.bias) is not None:
            grads[-1].addmv_(next(per_example).T, clip)

    @torch.no_grad()
    def privatize(self) -> None:
        """Set each trainable parameter's ``.grad`` to its clipped, noised, scaled batch gradient.

        Call after ``forward`` and the loss's ``backward``, or on its own for an
        empty batch. Clears what the layers kept.
        """
        tapes = [t for t in self._tapes.values() if t.grad_output is not None]
        if (tapes or self.batch_size) and len(tapes) != len(self._tapes):
            # A forward without backward (or a loss that skips layers) would otherwise pass for
            # an empty batch or drop layers from the clipping norm.
            self.zero_grad()
            raise RuntimeError("some trainable layers got no gradient: call backward on a loss of the model")
        # The step's noise becomes the gradient: each clipped sum is accumulated into it in place.
        flat, grads = self._noise.draw(self.noise_multiplier * self.max_grad_norm)
        if tapes:
            # A mean loss scales every example's gradient by 1 / batch size; undo it as Opacus does.
            scale = float(self.batch_size) if self.loss_reduction == "mean" else 1.0
            # Opacus's per-example norm: the norm over parameters of each parameter's norm.
            per_param = [norm for tape in tapes for norm in self._norms(tape)]
            norms = torch.linalg.vector_norm(torch.stack(per_param), dim=0).mul_(scale)
            clip = (self.max_grad_norm / (norms + 1e-6)).clamp_(max=1.0).mul_(scale)
            for tape in tapes:
                self._add_clipped_sum(tape, clip, [grads[self._index[id(p)]] for p in tape.params])
                tape.clear()
        if self.loss_reduction == "mean" and self.expected_batch_size != 1:
            for buffer in [flat] if flat is not None else grads:
                buffer.div_(self.expected_batch_size)
        for param, grad in zip(self.params, grads, strict=True):
            param.grad = grad
        self.batch_size = 0

    def layer_plans(self) -> list[str]:
        """How the last step computed each trainable layer's clipped sum, in model order.

        "materialized": per-example gradients, then their clip-weighted sum (for a
        convolution's weight, also how: "rows", "unfolded" or "grouped", see _conv_per_example);
        "reweight": norms without per-example gradients (||g|| ||a||, or the ghost
        norm), then one weight gradient of the clip-weighted output gradients.
        """
        return [f"{type(t.module).__name__} {t.plan}" for t in self._tapes.values()]

    def close(self) -> None:
        """Stop drawing noise ahead (the training run is over)."""
        self._noise.close()

    def zero_grad(self) -> None:
        for tape in self._tapes.values():
            tape.clear()
        for param in self.params:
            param.grad = None
        self.batch_size = 0
