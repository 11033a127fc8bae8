"""Local training for one federated round: plain SGD or DP-SGD, with optional FedProx.

* DP-SGD (Abadi et al. 2016, "Deep Learning with Differential Privacy"): Poisson
  sampling of each batch, per-example gradient clipping to ``max_grad_norm`` and
  Gaussian noise, one loop over one interface (``fl_node.dp_sgd.DPGradient``) whose engine is
  ``fl_node.dp_engine`` for the Sequential Linear/Conv2d/GroupNorm models it supports
  (grad-sample mode "bk": per-example norms and the clipped sum from one backward, no
  per-example gradient stacks) and Opacus (Yousefpour et al. 2021) for the others: the same
  mechanism and noise draws either way (fl_node.dp_sgd says why two). Either a fixed noise
  multiplier, or a target epsilon for the whole job: sigma is calibrated once
  for ``rounds x steps per round`` with the RDP accountant, so the job ends
  within its target after its last round.
* FedProx (Li et al. 2020, "Federated Optimization in Heterogeneous Networks"):
  the proximal term mu/2 * ||w - w_global||^2. Its gradient mu * (w - w_global)
  does not touch the data, so under DP it is added after clipping and noise
  (post-processing: it costs no privacy and is not clipped away).

Every step is recorded through an optimizer step hook into the job's
``PrivacyHistory`` and the dataset's ``BudgetLedger``; the ledger is checked
before the first step, so an over-budget request trains nothing.

Step boundaries (:func:`step_boundary`): a caller may register hooks that run before every
local step of the current thread's (context's) training, e.g. the cluster runner's cancel
check: a hook that raises stops the training there, between two whole steps (under DP the
steps already taken were recorded as they happened). Hooks stack; none by default.

Device (:func:`on_device`, or ``TrainConfig.device``): training runs on that torch device
("cpu", "cuda:0"): the model and the data move there, and the update comes back on the CPU,
so what the caller encodes and hashes does not depend on where it was computed. DP-SGD too:
per-example norms, clipping and the noisy sum run on the device; the Poisson masks and the
noise are drawn on the CPU from the same secret streams as on a CPU run (so a run is
repeatable given its secret, never from the device's generator) and the noise reaches the
device through pinned memory without blocking (``fl_node.dp_engine.StepNoise``).
:func:`device_memory_mb` estimates what a run holds on a GPU, for the slot it is placed on.

Every draw the DP guarantee relies on (Poisson batch masks, gradient noise) comes from a
secret CSPRNG stream (``fl_node.secure_random.SecureRandom``): a fresh key per call unless
the caller passes a stream. Neither depends on the data, so both are drawn on a helper
thread, off the training thread: the noise while the step's forward and backward run ("bk";
one step ahead under Opacus), the masks in blocks of up to 16 steps ahead
(``fl_node.secure_random.poisson_batches``); the same draws in the same order.
``TrainConfig.seed`` seeds only what DP does not rely on (dropout, the shuffling of
non-private training).

The metrics (loss and accuracy on the local training data) are for the node
itself: they are not privatised and must not leave the node.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from fl_node.data import ArrayDataset
from fl_node.dp_engine import _MAX_PER_EXAMPLE_ELEMENTS, _leaves
from fl_node.dp_sgd import DEFAULT_GRAD_SAMPLE_MODE, GRAD_SAMPLE_MODES, dp_gradient, resolve_grad_sample_mode
from fl_node.privacy import BudgetLedger, PrivacyBudgetExceeded, PrivacyHistory, PrivacySpent, calibrate_noise
from fl_node.secure_random import NoiseSource, SecureRandom, poisson_batches

logger = logging.getLogger(__name__)


# Hooks called before each local step, innermost last (see the module doc).
_STEP_HOOKS: contextvars.ContextVar[tuple[Callable[[int], None], ...]] = contextvars.ContextVar(
    "defl_step_hooks", default=()
)
# The device of the training in this context when TrainConfig.device is None (the cluster slot's).
_DEVICE: contextvars.ContextVar[str | None] = contextvars.ContextVar("defl_train_device", default=None)


@contextlib.contextmanager
def step_boundary(hook: Callable[[int], None]) -> Iterator[None]:
    """Call ``hook(step_index)`` before every local step trained in this context; it may raise."""
    token = _STEP_HOOKS.set((*_STEP_HOOKS.get(), hook))
    try:
        yield
    finally:
        _STEP_HOOKS.reset(token)


@contextlib.contextmanager
def on_device(device: str | None) -> Iterator[None]:
    """Train on ``device`` in this context (unless a TrainConfig names its own)."""
    token = _DEVICE.set(device)
    try:
        yield
    finally:
        _DEVICE.reset(token)


def _at_step(index: int) -> None:
    for hook in _STEP_HOOKS.get():
        hook(index)


def resolve_device(config_device: str | None = None) -> torch.device:
    """The torch device training uses: the config's, else the context's, else the CPU.

    A CUDA device that torch does not see falls back to the CPU (logged), so a job planned on
    a GPU worker still trains on a machine without one.
    """
    name = config_device or _DEVICE.get() or "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unsupported training device {name!r} (cpu or cuda[:index])") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        logger.warning("device %s requested but torch sees no CUDA device: training on the CPU", name)
        return torch.device("cpu")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported training device {name!r} (cpu or cuda[:index])")
    return device


@dataclass(frozen=True)
class TrainConfig:
    """Local-training settings; DP is on when ``noise_multiplier`` or ``target_epsilon`` is set.

    ``batch_size`` is the expected batch size under Poisson sampling: each example joins each
    step's batch with probability ``sample_rate`` (a privacy plan's, fixed from public values),
    or batch_size / n when none is given. One round runs ``local_steps`` steps, or ``epochs``
    passes of ceil(n / batch_size) steps.
    ``rounds`` is the number of rounds in the job, needed to calibrate a target epsilon.
    ``grad_sample_mode`` picks the DP-SGD engine: "bk" (``fl_node.dp_engine``; models it
    does not support fall back to Opacus "ew", logged with the reason) or an Opacus mode.

    Under DP on the MNIST subset with the ``cnn`` model these did well at
    epsilon 3: batch_size 128, lr 0.5, momentum 0.5, max_grad_norm 1.0 (90% test
    accuracy centralised; federated results depend mostly on the number of rounds).
    """

    batch_size: int = 64
    epochs: int = 1
    local_steps: int | None = None
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    proximal_mu: float = 0.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    delta: float = 1e-5
    max_grad_norm: float = 1.0
    rounds: int = 1
    sample_rate: float | None = None
    grad_sample_mode: str = DEFAULT_GRAD_SAMPLE_MODE
    seed: int = 0
    device: str | None = None  # None: the context's (on_device), else the CPU

    def __post_init__(self) -> None:
        _require(self.batch_size >= 1, f"batch_size must be at least 1, got {self.batch_size}")
        _require(self.epochs >= 1, f"epochs must be at least 1, got {self.epochs}")
        _require(
            self.local_steps is None or self.local_steps >= 1,
            f"local_steps must be at least 1 when set, got {self.local_steps}",
        )
        _require(_positive(self.lr), f"lr must be a positive number, got {self.lr}")
        _require(0 <= self.momentum < 1, f"momentum must be in [0, 1), got {self.momentum}")
        _require(self.weight_decay >= 0, f"weight_decay must be non-negative, got {self.weight_decay}")
        _require(self.proximal_mu >= 0, f"proximal_mu must be non-negative, got {self.proximal_mu}")
        _require(self.rounds >= 1, f"rounds must be at least 1, got {self.rounds}")
        _require(
            self.sample_rate is None or (_positive(self.sample_rate) and self.sample_rate <= 1),
            f"sample_rate must be in (0, 1] when set, got {self.sample_rate}",
        )
        _require(
            self.noise_multiplier is None or self.target_epsilon is None,
            "set either noise_multiplier or target_epsilon, not both",
        )
        _require(
            self.noise_multiplier is None or _positive(self.noise_multiplier),
            f"noise_multiplier must be a positive number, got {self.noise_multiplier}",
        )
        _require(
            self.target_epsilon is None or _positive(self.target_epsilon),
            f"target_epsilon must be a positive number, got {self.target_epsilon}",
        )
        _require(0 < self.delta < 1, f"delta must be in (0, 1), got {self.delta}")
        _require(
            _positive(self.max_grad_norm),
            f"max_grad_norm must be a positive number, got {self.max_grad_norm}",
        )
        _require(
            self.grad_sample_mode in GRAD_SAMPLE_MODES,
            f"grad_sample_mode must be one of {GRAD_SAMPLE_MODES}, got {self.grad_sample_mode!r}",
        )

    @property
    def private(self) -> bool:
        return self.noise_multiplier is not None or self.target_epsilon is not None


def _positive(value: float) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class StepPlan:
    """How many steps one round takes on this data and, under DP, at what noise."""

    steps: int
    sample_rate: float
    noise_multiplier: float | None


def plan_round(num_samples: int, config: TrainConfig) -> StepPlan:
    if num_samples < 1:
        raise ValueError("cannot train on an empty dataset")
    steps = config.local_steps or config.epochs * math.ceil(num_samples / config.batch_size)
    sample_rate = config.sample_rate or min(config.batch_size / num_samples, 1.0)
    noise = config.noise_multiplier
    if config.target_epsilon is not None:
        noise = calibrate_noise(
            target_epsilon=config.target_epsilon,
            delta=config.delta,
            sample_rate=sample_rate,
            steps=config.rounds * steps,
        )
    return StepPlan(steps=steps, sample_rate=sample_rate, noise_multiplier=noise)


def check_budget(ledger: BudgetLedger, plan: StepPlan) -> float:
    """Projected epsilon of the dataset after this round; raises before anything is trained."""
    if plan.noise_multiplier is None:
        raise PrivacyBudgetExceeded(
            requested_epsilon=math.inf,
            cap_epsilon=ledger.epsilon_cap,
            spent_epsilon=ledger.spent(),
            delta=ledger.delta,
        )
    return ledger.check(
        noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate, steps=plan.steps
    )


# What a device run holds beyond its tensors: the allocator's rounding and cached blocks.
_DEVICE_SLACK_BYTES = 128 << 20
_EVAL_BATCH = 1024


def device_memory_mb(model: nn.Module, data: ArrayDataset, config: TrainConfig) -> int | None:
    """An upper estimate of the device memory (MiB) one :func:`train_local` run of ``model`` holds.

    For the cluster slot it is placed on (``backend.cluster.runner.train_demand``). Counted:
    the data copied to the device; the weights with their gradient, momentum, the round's
    anchor, the update and (under DP) the noise buffer and the proximal anchor; the activations
    of the largest batch kept for backward, and their gradients (a Poisson batch is counted at
    its mean plus six standard deviations); under DP the per-example gradients the engine keeps
    (Opacus: every parameter's; "bk": each layer's, unless it takes the ghost norm); the
    evaluation batches; a fixed slack. The activations are measured with one forward of one
    zero example where the model lies (the CPU: a few milliseconds; the "meta" device would
    cost seconds of imports). None when that forward fails (the caller keeps its default demand).
    """
    x, _ = data.tensors()
    n = len(data)
    if n < 1:
        raise ValueError("cannot train on an empty dataset")
    try:
        per_example = _activation_elements(model, x.shape[1:], x.dtype)
    except Exception as exc:  # a model that cannot run on a zero example: no estimate
        logger.info("no device memory estimate for this model: %s", exc)
        return None
    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    param_bytes += sum(b.numel() * b.element_size() for b in model.buffers())
    element = x.element_size() if x.is_floating_point() else 4
    if config.private:
        rate = min(config.batch_size / n, 1.0)
        batch = min(n, math.ceil(n * rate + 6 * math.sqrt(n * rate * (1 - rate))) + 1)
    else:
        batch = min(n, config.batch_size)
    total = data.x.nbytes + data.y.nbytes
    total += (7 if config.private else 5) * param_bytes
    total += 3 * batch * per_example * element  # kept activations, their gradients, one spare
    if config.private:
        mode = resolve_grad_sample_mode(model, config.grad_sample_mode)
        trainable = [p for p in params if p.requires_grad]
        if mode == "bk":
            layers = [sum(p.numel() for p in leaf.parameters() if p.requires_grad) for leaf in _leaves(model)]
            kept = sum(min(batch * size, _MAX_PER_EXAMPLE_ELEMENTS) for size in layers)
        else:
            kept = batch * sum(p.numel() for p in trainable)
        total += kept * element
    total += min(n, _EVAL_BATCH) * per_example * element
    total += _DEVICE_SLACK_BYTES
    return max(1, math.ceil(total / (1 << 20)))


def _activation_elements(model: nn.Module, shape: torch.Size, dtype: torch.dtype) -> int:
    """Elements of every leaf module's output for one example, from one forward of a zero example."""
    outputs = 0

    def count(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal outputs
        if isinstance(output, torch.Tensor):
            outputs += output.numel()

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    was_training = model.training
    model.eval()  # no dropout draw, no batch statistics of one example
    try:
        with torch.no_grad():
            model(torch.zeros((1, *shape), dtype=dtype, device=next(model.parameters()).device))
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return outputs + math.prod(shape)


@dataclass(frozen=True)
class TrainResult:
    update: dict[str, torch.Tensor]  # local - global, per state-dict entry
    num_samples: int
    metrics: dict[str, float]
    steps: int
    privacy: PrivacySpent | None  # the job's history so far, after this round; None without DP


def train_local(
    model: nn.Module,
    global_state: Mapping[str, torch.Tensor],
    data: ArrayDataset,
    config: TrainConfig,
    *,
    privacy_history: PrivacyHistory | None = None,
    ledger: BudgetLedger | None = None,
    randomness: NoiseSource | None = None,
    device_path: bool = False,
) -> TrainResult:
    """Load ``global_state`` into ``model``, train it locally and return the update.

    ``privacy_history`` is the job's history on this dataset (appended to);
    ``ledger`` is the dataset's budget across jobs (checked first, then charged
    step by step). ``randomness`` is the secret stream of the DP draws (a fresh
    ``SecureRandom`` by default). ``model`` ends holding the local weights.
    ``device_path``: take the path of a run off the CPU (the model, data and DP noise
    copied to the device) even when the device is the CPU; tests compare it with the default.
    """
    plan = plan_round(len(data), config)
    if ledger is not None:
        check_budget(ledger, plan)
    device = resolve_device(config.device)
    model.load_state_dict(global_state)
    moved = device_path or device.type != "cpu"
    if moved:
        model.to(device)
    anchor = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x, y = data.tensors()
    if moved:
        x, y = x.to(device, copy=True), y.to(device, copy=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)  # for modules that draw randomness themselves (dropout)
        generator = torch.Generator().manual_seed(config.seed)
        if config.private:
            history = privacy_history if privacy_history is not None else PrivacyHistory()
            # The masks and the noise each get a stream forked from this one (see the engines).
            source = randomness if randomness is not None else SecureRandom()
            noise_device = device if moved else None  # None: the default path (no copy)
            _train_private(
                model, x, y, config, plan, source, history=history, ledger=ledger, noise_device=noise_device
            )
        else:
            _train_plain(model, x, y, config, plan, generator)
    state = model.state_dict()
    update = {
        k: (state[k] - anchor[k]) if anchor[k].is_floating_point() else state[k].clone() for k in anchor
    }
    metrics = evaluate(model, x, y)
    if moved:  # what leaves training lives on the CPU, wherever it was computed
        update = {k: v.cpu() for k, v in update.items()}
        model.to("cpu")
    privacy = PrivacySpent.of(history, delta=config.delta) if config.private else None
    return TrainResult(
        update=update, num_samples=len(data), metrics=metrics, steps=plan.steps, privacy=privacy
    )


def _sgd(model: nn.Module, config: TrainConfig) -> torch.optim.SGD:
    return torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad],
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )


def _proximal_anchors(model: nn.Module, config: TrainConfig) -> list[tuple[nn.Parameter, torch.Tensor]]:
    if config.proximal_mu == 0:
        return []
    return [(p, p.detach().clone()) for p in model.parameters() if p.requires_grad]


def add_proximal_gradient(anchors: list[tuple[nn.Parameter, torch.Tensor]], mu: float) -> None:
    """Add the gradient of mu/2 * ||w - w_global||^2 to each parameter's gradient."""
    for param, start in anchors:
        prox = mu * (param.detach() - start)
        param.grad = prox if param.grad is None else param.grad + prox


def _shuffled_batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Full batches of a fresh permutation per epoch; an epoch's tail shorter than a batch is dropped.

    A tail step would take the full learning rate on a handful of examples (a share of 450 at
    batch 64 ends every epoch with a batch of 2): a gradient of that noise made members that
    train past one epoch diverge now and then (bench/heterogeneity.py's adaptive arm). With
    fewer examples than a batch, every step is the whole (shuffled) data.
    """
    full = n // batch_size
    while True:
        order = torch.randperm(n, generator=generator)
        if full == 0:
            yield order
            continue
        yield from order[: full * batch_size].split(batch_size)


def _train_plain(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    plan: StepPlan,
    generator: torch.Generator,
) -> None:
    model.train()
    optimizer = _sgd(model, config)
    anchors = _proximal_anchors(model, config)
    batches = _shuffled_batches(len(y), config.batch_size, generator)
    # A model may train on a cheaper loss than the full cross-entropy (fl_node.sparse_models.lm:
    # a sampled softmax); evaluation and DP-SGD, which needs per-example losses, use the full one.
    loss_of = getattr(model, "training_loss", None) or (lambda a, b: nn.functional.cross_entropy(model(a), b))
    for step, idx in zip(range(plan.steps), batches, strict=False):
        _at_step(step)
        optimizer.zero_grad(set_to_none=True)
        idx = idx.to(x.device)
        loss_of(x[idx], y[idx]).backward()
        add_proximal_gradient(anchors, config.proximal_mu)
        optimizer.step()


def _train_private(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    plan: StepPlan,
    randomness: NoiseSource,
    *,
    history: PrivacyHistory,
    ledger: BudgetLedger | None,
    noise_device: torch.device | None = None,
) -> None:
    """DP-SGD steps through the mode's engine (fl_node.dp_sgd: "bk" or Opacus, one interface);
    ``noise_device`` (the training device off the CPU) takes the device path.

    Every step: a Poisson batch, the engine's clipped noisy gradient (an empty batch is still a
    noisy step), the step recorded, the proximal gradient (post-processing), the SGD step.
    """
    assert plan.noise_multiplier is not None
    model.train()
    anchors = _proximal_anchors(model, config)
    record = _accounting_hook(plan, history, ledger)
    # Each example joins each batch independently with probability sample_rate: the privacy
    # amplification that the RDP analysis assumes holds for exactly this sampling (batches vary
    # in size and may be empty), and only while the batches are secret, hence the secret stream.
    masks = poisson_batches(randomness.fork("poisson"), len(y), plan.sample_rate)
    batches: Iterator[torch.Tensor] = masks
    if noise_device is not None:  # the masks are drawn on the CPU; the batch is gathered on the device
        batches = (idx.to(noise_device, non_blocking=True) for idx in masks)
    optimizer = _sgd(model, config)
    engine = dp_gradient(
        model,
        resolve_grad_sample_mode(model, config.grad_sample_mode),
        noise_multiplier=plan.noise_multiplier,
        max_grad_norm=config.max_grad_norm,
        expected_batch_size=config.batch_size,
        noise=randomness.fork("noise"),
        noise_device=noise_device,
    )
    try:
        for step, idx in zip(range(plan.steps), batches, strict=False):
            _at_step(step)
            optimizer.zero_grad(set_to_none=True)
            if len(idx) > 0:
                nn.functional.cross_entropy(engine.forward(x[idx]), y[idx]).backward()
            engine.privatize()  # clip, sum, noise, scale -> p.grad
            record(engine)
            add_proximal_gradient(anchors, config.proximal_mu)
            optimizer.step()
    finally:
        masks.close()
        engine.close()
        engine.zero_grad()


def _accounting_hook(
    plan: StepPlan, history: PrivacyHistory, ledger: BudgetLedger | None
) -> Callable[[object], None]:
    """Record every noisy step as it happens, so a crash mid-round cannot under-count."""
    noise = plan.noise_multiplier
    if noise is None:
        raise ValueError("only a DP plan (with a noise multiplier) is accounted")

    def record(_optimizer: object) -> None:
        history.record(noise_multiplier=noise, sample_rate=plan.sample_rate)
        if ledger is not None:
            ledger.record(noise_multiplier=noise, sample_rate=plan.sample_rate)

    return record


@torch.no_grad()
def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 1024
) -> dict[str, float]:
    """Mean cross-entropy and accuracy of ``model`` on (x, y)."""
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss_sum += float(nn.functional.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(dim=1) == target).sum())
    model.train(was_training)
    return {"loss": loss_sum / len(y), "accuracy": correct / len(y)}
