"""fl_node.normalized_average: FedNova for unequal local work (pure maths, bit-exact)."""

from __future__ import annotations

import pytest
import torch

from fl_node.aggregate import WeightedUpdate, get_strategy
from fl_node.normalized_average import (
    WorkUpdate,
    capped_lr,
    clamp_steps,
    normalized_average,
    nova_weights,
    work_norm,
)


def _updates(steps, seed=0, samples=(50, 70, 90)):
    gen = torch.Generator().manual_seed(seed)
    return [
        WorkUpdate(
            {"w": torch.randn(4, 3, generator=gen), "b": torch.randn(3, generator=gen)},
            samples[i],
            s,
            f"t{i}",
        )
        for i, s in enumerate(steps)
    ]


GLOBAL = {"w": torch.ones(4, 3), "b": torch.zeros(3), "count": torch.tensor(7)}


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_equal_steps_is_fedavg_byte_for_byte(momentum):
    updates = _updates([6, 6, 6])
    nova = normalized_average(GLOBAL, updates, max_steps=24, momentum=momentum)
    fedavg, _ = get_strategy("fedavg").aggregate(
        GLOBAL, [WeightedUpdate(u.update, u.num_samples, u.id) for u in updates]
    )
    assert sorted(nova) == sorted(fedavg)
    for name in fedavg:
        assert torch.equal(nova[name], fedavg[name]), name
    assert nova["count"] is not GLOBAL["count"] and int(nova["count"]) == 7  # int buffers copied


def test_small_example_by_hand():
    # p = (1/4, 3/4); A ran 1 step (delta [1, 0]), B ran 3 (delta [0, 3]).
    # Normalized: d_A = [1, 0], d_B = [0, 1]; tau_eff = 1/4 * 1 + 3/4 * 3 = 2.5;
    # x_new = 0 + 2.5 * (1/4 [1, 0] + 3/4 [0, 1]) = [0.625, 1.875].
    g = {"x": torch.zeros(2)}
    updates = [
        WorkUpdate({"x": torch.tensor([1.0, 0.0])}, 100, 1, "a"),
        WorkUpdate({"x": torch.tensor([0.0, 3.0])}, 300, 3, "b"),
    ]
    out = normalized_average(g, updates, max_steps=10)
    assert out["x"].tolist() == pytest.approx([0.625, 1.875], abs=1e-7)
    factors, tau_eff = nova_weights([100, 300], [1, 3])
    assert tau_eff == pytest.approx(2.5) and factors == pytest.approx([0.625, 0.625])
    # FedAvg weighted by samples processed (100*1, 300*3) would give [0.1, 2.7]: B's 3 steps
    # count three times, the bias normalized averaging removes.
    processed, _ = get_strategy("fedavg").aggregate(
        g, [WeightedUpdate(u.update, u.num_samples * u.steps, u.id) for u in updates]
    )
    assert processed["x"].tolist() == pytest.approx([0.1, 2.7], abs=1e-6)


def test_work_norm_by_hand_and_closed_form():
    assert work_norm(5) == 5.0
    # rho = 0.5: per-step coefficients 1, 1.5, 1.75 -> 1, 2.5, 4.25
    assert [work_norm(k, 0.5) for k in (1, 2, 3)] == pytest.approx([1.0, 2.5, 4.25])
    for rho in (0.3, 0.9):
        for k in (1, 4, 17):
            direct = sum((1 - rho**j) / (1 - rho) for j in range(1, k + 1))
            assert work_norm(k, rho) == pytest.approx(direct, rel=1e-12)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError):
            work_norm(bad)
    with pytest.raises(ValueError):
        work_norm(3, 1.0)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_work_norm_is_what_torch_sgd_moves_under_a_constant_gradient(rho):
    # Loss = g . x has the constant gradient g: after k steps SGD moved x by -lr * a(k) * g.
    for k in (1, 3, 8):
        x = torch.zeros(3, requires_grad=True)
        g = torch.tensor([1.0, -2.0, 0.5])
        opt = torch.optim.SGD([x], lr=0.1, momentum=rho)
        for _ in range(k):
            opt.zero_grad()
            (x * g).sum().backward()
            opt.step()
        expected = -0.1 * work_norm(k, rho) * g
        assert x.detach().tolist() == pytest.approx(expected.tolist(), rel=1e-5)


def test_reported_steps_are_clamped_to_the_job_bound():
    assert clamp_steps(1000, max_steps=28) == 28
    assert clamp_steps(0, max_steps=28) == 1 and clamp_steps(-5, max_steps=28) == 1
    for bad in (2.5, True, "3", None):
        with pytest.raises(ValueError):
            clamp_steps(bad, max_steps=28)
    with pytest.raises(ValueError):
        clamp_steps(3, max_steps=0)
    # A trainer claiming 10**9 steps is treated as the bound: same model as reporting 28.
    honest = normalized_average(GLOBAL, _updates([5, 28, 9]), max_steps=28, momentum=0.5)
    inflated = normalized_average(GLOBAL, _updates([5, 10**9, 9]), max_steps=28, momentum=0.5)
    understated = normalized_average(GLOBAL, _updates([5, 28, 0]), max_steps=28, momentum=0.5)
    assert all(torch.equal(honest[n], inflated[n]) for n in honest)
    assert not torch.equal(honest["w"], understated["w"])
    # The worst claim (1 step) multiplies a delta by at most tau_eff / a(1) <= max_steps' norm.
    factors, tau_eff = nova_weights([50, 70, 90], [28, 28, 1], momentum=0.5)
    assert factors[2] / (90 / 210) == pytest.approx(tau_eff) and tau_eff <= work_norm(28, 0.5)


def test_order_does_not_matter_and_inputs_are_not_modified():
    updates = _updates([3, 11, 7], seed=4)
    before = {u.id: {k: v.clone() for k, v in u.update.items()} for u in updates}
    a = normalized_average(GLOBAL, updates, max_steps=28, momentum=0.9)
    b = normalized_average(GLOBAL, list(reversed(updates)), max_steps=28, momentum=0.9)
    assert all(torch.equal(a[n], b[n]) for n in a)
    for u in updates:
        assert all(torch.equal(u.update[k], before[u.id][k]) for k in u.update)
    assert torch.equal(GLOBAL["w"], torch.ones(4, 3))


def test_bad_updates_are_refused():
    good = _updates([3, 4, 5])
    with pytest.raises(ValueError):
        normalized_average(GLOBAL, [], max_steps=8)
    bad_shape = WorkUpdate({"w": torch.zeros(3, 4), "b": torch.zeros(3)}, 10, 3, "x")
    with pytest.raises(ValueError, match="shape"):
        normalized_average(GLOBAL, [*good, bad_shape], max_steps=8)
    dup = WorkUpdate(good[0].update, 10, 3, good[0].id)
    with pytest.raises(ValueError, match="share an id"):
        normalized_average(GLOBAL, [*good, dup], max_steps=8)
    zero = WorkUpdate(good[0].update, 0, 3, "z")
    with pytest.raises(ValueError, match="num_samples"):
        normalized_average(GLOBAL, [zero], max_steps=8)
    with pytest.raises(ValueError, match="momentum"):
        normalized_average(GLOBAL, good, max_steps=8, momentum=-0.1)


def test_a_given_server_step_scales_the_normalized_mean():
    g = {"x": torch.zeros(2)}
    updates = [
        WorkUpdate({"x": torch.tensor([1.0, 0.0])}, 100, 1, "a"),
        WorkUpdate({"x": torch.tensor([0.0, 3.0])}, 300, 3, "b"),
    ]
    # tau_eff = 2 (e.g. the job's nominal 2 steps): 2 * (1/4 [1, 0] + 3/4 [0, 1]) = [0.5, 1.5].
    out = normalized_average(g, updates, max_steps=10, tau_eff=2.0)
    assert out["x"].tolist() == pytest.approx([0.5, 1.5], abs=1e-7)
    # Equal steps with tau_eff at their norm: FedAvg byte for byte; another tau_eff scales it.
    same = _updates([6, 6, 6])
    fedavg, _ = get_strategy("fedavg").aggregate(
        GLOBAL, [WeightedUpdate(u.update, u.num_samples, u.id) for u in same]
    )
    at_norm = normalized_average(GLOBAL, same, max_steps=24, momentum=0.5, tau_eff=work_norm(6, 0.5))
    assert all(torch.equal(at_norm[n], fedavg[n]) for n in fedavg)
    doubled = normalized_average(GLOBAL, same, max_steps=24, tau_eff=12.0)
    assert torch.allclose(doubled["b"], 2 * fedavg["b"] - GLOBAL["b"], atol=1e-6)
    for bad in (0.0, -1.0, float("nan"), float("inf"), "2"):
        with pytest.raises(ValueError, match="tau_eff"):
            normalized_average(g, updates, max_steps=10, tau_eff=bad)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_capped_lr_keeps_the_trajectory_at_the_nominal_length(momentum):
    # Up to the cap: the job's lr. Beyond: lr * a(cap) / a(steps), so lr x work norm is constant.
    assert capped_lr(0.1, 3, cap_steps=7, momentum=momentum) == 0.1
    assert capped_lr(0.1, 7, cap_steps=7, momentum=momentum) == 0.1
    for steps in (8, 14, 28):
        lr = capped_lr(0.1, steps, cap_steps=7, momentum=momentum)
        assert lr < 0.1
        assert lr * work_norm(steps, momentum) == pytest.approx(0.1 * work_norm(7, momentum), rel=1e-12)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_capped_lr_is_what_torch_sgd_moves_under_a_constant_gradient(momentum):
    # The cap's claim, checked on torch's optimizer: 4x the steps at the capped lr move exactly
    # as far as the nominal steps at the job's lr (for a constant gradient).
    def moved(steps, lr):
        x = torch.zeros(3, requires_grad=True)
        opt = torch.optim.SGD([x], lr=lr, momentum=momentum)
        for _ in range(steps):
            opt.zero_grad()
            (x * torch.tensor([1.0, -2.0, 0.5])).sum().backward()
            opt.step()
        return x.detach()

    nominal = moved(7, 0.1)
    more = moved(28, capped_lr(0.1, 28, cap_steps=7, momentum=momentum))
    assert torch.allclose(more, nominal, rtol=1e-5)


def test_cap_steps_normalizes_by_the_capped_work():
    # Under the lr cap every delta of at least cap_steps has the nominal work norm: with all of
    # them above the cap, FedNova is FedAvg byte for byte whatever their steps.
    updates = _updates([7, 14, 28])
    capped = normalized_average(GLOBAL, updates, max_steps=28, momentum=0.5, cap_steps=7)
    fedavg, _ = get_strategy("fedavg").aggregate(
        GLOBAL, [WeightedUpdate(u.update, u.num_samples, u.id) for u in updates]
    )
    for name in fedavg:
        assert torch.equal(capped[name], fedavg[name]), name
    # A trainer below the cap ran at the job's lr: its delta is scaled up by a(cap) / a(steps).
    factors, tau_eff = nova_weights([1, 1], [3, 7], momentum=0.5, cap_steps=7, tau_eff=work_norm(7, 0.5))
    assert tau_eff == work_norm(7, 0.5)
    assert factors == pytest.approx([0.5 * work_norm(7, 0.5) / work_norm(3, 0.5), 0.5])
    # Without the cap the 28-step delta would be divided by its own (4x larger) norm.
    uncapped = normalized_average(GLOBAL, updates, max_steps=28, momentum=0.5)
    assert not torch.equal(uncapped["w"], capped["w"])
