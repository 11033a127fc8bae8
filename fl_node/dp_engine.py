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
  gradient itself; for a convolution either the per-example gradients (a
  batched matmul of the output gradients with the unfolded input) or the ghost
  norm (``sum_{l,l'} (g_l . g_l')(a_l . a_l')``), whichever costs fewer
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

from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from fl_node.secure_random import NoiseAhead, NoiseSource, SecureRandom, TorchRandom

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

    An engine (``BookKeepingDP``, ``fl_node.train.SecretNoiseDPOptimizer``) owns one and closes
    it when it closes. From a secret stream the whole step is one draw, made a step ahead on a
    helper thread (``NoiseAhead``: the noise does not depend on the data); from a torch
    generator the draws go tensor by tensor in Opacus's order, so tests can compare two
    engines draw for draw. Tensors of mixed dtypes get one draw each and no flat buffer.
    """

    def __init__(self, source: NoiseSource, tensors: list[torch.Tensor]) -> None:
        self.source = source
        self._shapes = [t.shape for t in tensors]
        self._sizes = [t.numel() for t in tensors]
        dtypes = {t.dtype for t in tensors}
        self._dtype = dtypes.pop() if len(dtypes) == 1 else None
        self._dtypes = [t.dtype for t in tensors]
        self._ahead: NoiseAhead | None = None
        self._ahead_std: float | None = None

    def draw(self, std: float) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """(flat buffer or None, one fresh noise tensor per tensor, views of the buffer when there is one)."""
        if self._dtype is None:
            if std == 0:
                return None, [
                    torch.zeros(s, dtype=d) for s, d in zip(self._shapes, self._dtypes, strict=True)
                ]
            return None, [
                self.source.normal(s, std=std, dtype=d)
                for s, d in zip(self._shapes, self._dtypes, strict=True)
            ]
        total = sum(self._sizes)
        if std == 0:
            flat = torch.zeros(total, dtype=self._dtype)
        elif isinstance(self.source, SecureRandom):
            if self._ahead is None or self._ahead_std != std:
                self.close()
                self._ahead = NoiseAhead(self.source, total, std=std, dtype=self._dtype)
                self._ahead_std = std
            flat = self._ahead.take()
        else:
            flat = torch.empty(total, dtype=self._dtype)
            for part, shape in zip(flat.split(self._sizes), self._shapes, strict=True):
                part.copy_(self.source.normal(shape, std=std, dtype=self._dtype).view(-1))
        views = [part.view(shape) for part, shape in zip(flat.split(self._sizes), self._shapes, strict=True)]
        return flat, views

    def close(self) -> None:
        """Stop drawing ahead (the training run is over)."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None


class _Tape:
    """What one layer keeps between forward and privatization: input and output gradient."""

    __slots__ = ("module", "params", "activation", "grad_output", "stats", "per_example", "plan")

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.params = [p for p in module.parameters(recurse=False) if p.requires_grad]
        self.activation: torch.Tensor | None = None
        self.grad_output: torch.Tensor | None = None
        self.stats: tuple[torch.Tensor, torch.Tensor] | None = None  # GroupNorm's mean and 1/std
        self.per_example: list[torch.Tensor] = []
        self.plan: str | None = None

    def clear(self) -> None:
        self.activation = self.grad_output = self.stats = None
        self.per_example = []


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

    A strided view of the (padded) input copied once: several times faster on
    CPU than ``F.unfold`` (im2col). The copy runs fastest with a long innermost
    run, so K is ordered (C, kh, kw) -- the weight's own order -- when there are
    fewer channels than kernel columns (the first layer), and (kh, kw, C) from a
    channels-last copy otherwise; ``_weight_order`` maps gradients back to the weight.
    """
    (ph, pw), (sh, sw), (dh, dw) = conv.padding, conv.stride, conv.dilation
    kh, kw = conv.kernel_size
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    n, channels, height, width = x.shape
    out_h = (height - dh * (kh - 1) - 1) // sh + 1
    out_w = (width - dw * (kw - 1) - 1) // sw + 1
    if _channels_last(conv):
        x = x.permute(0, 2, 3, 1).contiguous()
        sn, s_h, s_w, sc = x.stride()
        size, stride = (kh, kw, channels), (s_h * dh, s_w * dw, sc)
    else:
        x = x.contiguous()
        sn, sc, s_h, s_w = x.stride()
        size, stride = (channels, kh, kw), (sc, s_h * dh, s_w * dw)
    view = x.as_strided((n, out_h, out_w, *size), (sn, s_h * sh, s_w * sw, *stride))
    return view.reshape(n, out_h * out_w, channels * kh * kw)


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
        self._noise = StepNoise(self.noise, self.params)
        self.batch_size = 0

    # ------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's forward, with every trainable layer taped for per-example norms."""
        self.batch_size = len(x)
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
        module, a, g = tape.module, tape.activation, tape.grad_output
        assert a is not None and g is not None
        n = len(g)
        weight, bias = _trainable(module.weight), _trainable(module.bias)
        if isinstance(module, nn.GroupNorm):
            # Per example and channel c in group k: d/dweight_c = sum_s g * (x - mean_k) * rstd_k
            # = rstd_k * (sum_s g x - mean_k * sum_s g), d/dbias_c = sum_s g. No normalised copy.
            mean, rstd = tape.stats
            channels, groups = module.num_channels, module.num_groups
            g3 = g.reshape(n, channels, -1)
            g_sum = g3.sum(2)
            per_example = []
            if weight is not None:
                gx_sum = torch.linalg.vecdot(g3, a.reshape(n, channels, -1))
                per_group = (n, groups, channels // groups)
                centred = gx_sum.view(per_group) - mean.view(n, groups, 1) * g_sum.view(per_group)
                per_example.append(centred.mul_(rstd.view(n, groups, 1)).view(n, channels))
            if bias is not None:
                per_example.append(g_sum)
            tape.per_example, tape.plan = per_example, "materialized"
            return [torch.linalg.vector_norm(t, dim=1) for t in per_example]
        if isinstance(module, nn.Linear):  # (N, *, I) -> a: (N, L, I), g: (N, O, L)
            a = a.reshape(n, -1, a.shape[-1])
            g = g.reshape(n, -1, g.shape[-1]).transpose(1, 2)
        else:  # a: (N, L, kh * kw * C) unfolded, g: (N, O, L)
            a = _unfold(a, module)
            g = g.flatten(2)
        length, fan_in, fan_out = a.shape[1], a.shape[2], g.shape[1]
        tape.per_example = []
        norms = []
        if length == 1:  # no sequence: ||g a^T|| = ||g|| ||a||, and the sum is one GEMM
            g, a = g.reshape(n, fan_out), a.reshape(n, fan_in)
            tape.activation, tape.grad_output, tape.plan = a, g, "reweight"
            g_norm = torch.linalg.vector_norm(g, dim=1)
            if weight is not None:
                norms.append(g_norm * torch.linalg.vector_norm(a, dim=1))
            if bias is not None:
                tape.per_example.append(g)  # the bias gradients are the output gradients
                norms.append(g_norm)
            return norms
        tape.activation, tape.grad_output = a, g
        if weight is not None:
            # Autograd computed no weight gradient, so materialising the per-example ones costs
            # about that GEMM, after which their weighted sum is cheap; the ghost norm costs its two
            # Gram matrices on top of the re-weighted GEMM, and wins only where they are small next
            # to one per-example gradient, or where the per-example gradients would take too much
            # memory. (Measured in a training step on this CPU: the ghost norm of the default CNN's
            # second convolution, 25 positions, is slower than materialising, although alone it is faster.)
            grams = length * length * (fan_in + fan_out)
            if grams < fan_in * fan_out or n * fan_in * fan_out > _MAX_PER_EXAMPLE_ELEMENTS:
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
        if bias is not None:
            bias_grads = g.sum(2)  # (N, O), kept for the clipped sum
            tape.per_example.append(bias_grads)
            norms.append(torch.linalg.vector_norm(bias_grads, dim=1))
        return norms

    def _add_clipped_sum(self, tape: _Tape, clip: torch.Tensor, grads: list[torch.Tensor]) -> None:
        """Add sum_i clip_i * grad_i of each trainable parameter of the layer into ``grads`` (in place).

        ``grads`` are the noise tensors of ``tape.params``, in order; each sum is one BLAS
        call that accumulates into them (no temporary gradient, no separate add).
        """
        module = tape.module
        per_example = iter(tape.per_example)
        if _trainable(module.weight) is not None:
            weight = grads[0]
            if tape.plan == "reweight":  # one weight gradient of the re-weighted output gradients
                a, g = tape.activation, tape.grad_output
                if g.dim() == 2:  # (N, O), (N, K): no sequence
                    weight.view(g.shape[1], a.shape[1]).addmm_((g * clip.view(-1, 1)).T, a)
                else:  # (N, O, L), (N, L, K)
                    weighted = (g * clip.view(-1, 1, 1)).transpose(1, 2).reshape(-1, g.shape[1])
                    order = _weight_order(weight, module)
                    order.add_((weighted.T @ a.reshape(-1, a.shape[2])).view(order.shape))
            elif isinstance(module, nn.GroupNorm) or not _channels_last_k(module):
                weight.view(-1).addmv_(next(per_example).flatten(1).T, clip)
            else:
                order = _weight_order(weight, module)
                order.add_((clip @ next(per_example).flatten(1)).view(order.shape))
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

        "materialized": per-example gradients, then their clip-weighted sum;
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
