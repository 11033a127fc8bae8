"""train_local: accounting equals Opacus, budgets refuse before training, targets hold, configs validate."""

import math

import pytest
import torch
from opacus.accountants import RDPAccountant

from fl_node.data import ArrayDataset, load_dataset
from fl_node.models import create_model
from fl_node.privacy import BudgetLedger, PrivacyBudgetExceeded, PrivacyHistory, epsilon, rdp_epsilon
from fl_node.secure_random import SecureRandom
from fl_node.train import TrainConfig, evaluate, plan_round, train_local


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _model(data, name="mlp", seed=0):
    return create_model(name, seed=seed, **data.model_kwargs())


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _apply(state, update):
    return {k: state[k] + update[k] for k in state}


def test_plain_training_learns_and_returns_a_delta(digits):
    model = _model(digits)
    start = _state(model)
    result = train_local(model, start, digits.train, TrainConfig(epochs=3, lr=0.1))
    assert set(result.update) == set(start) and result.num_samples == len(digits.train)
    assert result.privacy is None and result.steps == 3 * math.ceil(len(digits.train) / 64)
    for key, value in model.state_dict().items():
        assert torch.allclose(value, start[key] + result.update[key])
    assert result.metrics["accuracy"] > 0.85
    assert evaluate(model, *digits.test.tensors())["accuracy"] > 0.8


def test_dp_epsilon_is_the_replace_one_accounting_of_what_ran(digits):
    model = _model(digits)
    history = PrivacyHistory()
    config = TrainConfig(noise_multiplier=1.1, max_grad_norm=1.0, batch_size=32, epochs=2, delta=1e-5)
    result = train_local(model, _state(model), digits.train, config, privacy_history=history)
    q = 32 / len(digits.train)
    assert history.as_tuples() == [(1.1, q, result.steps)]
    assert result.privacy.epsilon_rdp == pytest.approx(rdp_epsilon(history, delta=1e-5))
    # Replace-one (the size is public) costs more than Opacus's add/remove figure for the same run.
    reference = RDPAccountant()
    reference.history = [(1.1, q, result.steps)]
    assert result.privacy.epsilon_rdp > reference.get_epsilon(delta=1e-5)
    assert 0 < result.privacy.epsilon_pld <= result.privacy.epsilon_rdp
    assert (result.privacy.noise_multiplier, result.privacy.sample_rate) == (1.1, q)
    assert result.metrics["accuracy"] > 0.5  # learns despite noise


def test_budget_refused_before_any_training(digits):
    model = _model(digits, seed=1)
    before = _state(model)
    global_state = _state(_model(digits, seed=2))  # loading it would already change the model
    ledger = BudgetLedger(epsilon_cap=0.5, delta=1e-5)
    config = TrainConfig(noise_multiplier=0.8, epochs=5)
    with pytest.raises(PrivacyBudgetExceeded, match="cap is 0.5"):
        train_local(model, global_state, digits.train, config, ledger=ledger)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert ledger.history.as_tuples() == [] and ledger.spent() == 0.0
    with pytest.raises(PrivacyBudgetExceeded):  # non-private training can never fit a budget
        train_local(model, global_state, digits.train, TrainConfig(), ledger=ledger)


def test_ledger_charged_across_jobs(digits):
    ledger = BudgetLedger(epsilon_cap=8.0, delta=1e-5)
    config = TrainConfig(noise_multiplier=1.5, local_steps=20)
    for _ in range(2):
        model = _model(digits)
        train_local(model, _state(model), digits.train, config, ledger=ledger)
    assert ledger.history.as_tuples() == [(1.5, 64 / len(digits.train), 40)]


def test_target_epsilon_job_ends_within_target(digits):
    rounds = 3
    config = TrainConfig(target_epsilon=2.0, delta=1e-5, rounds=rounds, local_steps=15, batch_size=64)
    model = _model(digits)
    state = _state(model)
    history = PrivacyHistory()
    for _ in range(rounds):
        result = train_local(model, state, digits.train, config, privacy_history=history)
        state = _apply(state, result.update)
    spent = epsilon(history, delta=1e-5)
    assert history.total_steps == rounds * 15
    assert 1.9 <= spent <= 2.0
    assert result.privacy.epsilon_rdp == pytest.approx(spent)


def test_private_training_is_reproducible_only_with_its_secret_key(digits):
    """The public seed does not determine DP training: only the secret stream's key does."""
    config = TrainConfig(noise_multiplier=1.0, local_steps=10, seed=3)
    key = bytes(range(32))
    runs = []
    for randomness in (SecureRandom(key), SecureRandom(key), None, None):
        model = _model(digits)
        runs.append(train_local(model, _state(model), digits.train, config, randomness=randomness))
    assert all(torch.equal(runs[0].update[k], runs[1].update[k]) for k in runs[0].update)
    # Same public seed, no key given: fresh secret randomness every time.
    assert not all(torch.equal(runs[2].update[k], runs[3].update[k]) for k in runs[0].update)
    assert not all(torch.equal(runs[0].update[k], runs[2].update[k]) for k in runs[0].update)


def test_plain_training_is_reproducible_from_its_seed(digits):
    config = TrainConfig(local_steps=10, seed=3)
    runs = []
    for seed in (3, 3, 4):
        model = _model(digits)
        runs.append(
            train_local(model, _state(model), digits.train, TrainConfig(**{**config.__dict__, "seed": seed}))
        )
    assert all(torch.equal(runs[0].update[k], runs[1].update[k]) for k in runs[0].update)
    assert not all(torch.equal(runs[0].update[k], runs[2].update[k]) for k in runs[0].update)


def test_grad_sample_modes_agree_under_poisson_sampling(digits):
    updates = []
    for mode in ("hooks", "ew"):
        model = _model(digits, name="cnn")
        config = TrainConfig(noise_multiplier=1.0, local_steps=5, grad_sample_mode=mode, max_grad_norm=0.5)
        randomness = SecureRandom(bytes(32))  # the same secret draws for both modes
        updates.append(train_local(model, _state(model), digits.train, config, randomness=randomness).update)
    for key in updates[0]:
        assert torch.allclose(updates[0][key], updates[1][key], atol=1e-5), key


def test_empty_poisson_batches_still_count_as_steps():
    tiny = ArrayDataset(torch.rand(4, 1, 8, 8).numpy(), torch.tensor([0, 1, 0, 1]).numpy())
    model = create_model("mlp", input_shape=(1, 8, 8), num_classes=2, seed=0)
    history = PrivacyHistory()
    config = TrainConfig(noise_multiplier=1.0, batch_size=1, local_steps=12)
    train_local(model, _state(model), tiny, config, privacy_history=history)
    assert history.total_steps == 12  # (3/4)^4 ~ 0.32: some of the 12 batches were empty


def test_fedprox_pulls_towards_global(digits):
    norms = []
    for mu in (0.0, 10.0):
        model = _model(digits)
        result = train_local(model, _state(model), digits.train, TrainConfig(local_steps=30, proximal_mu=mu))
        norms.append(sum(float(t.pow(2).sum()) for t in result.update.values()))
    assert norms[1] < 0.5 * norms[0]


def test_dp_text_model_with_large_embedding():
    text = load_dataset("zipf_text", seed=0, num_samples=600, vocab_size=20_000)
    model = create_model("text", seed=0, **text.model_kwargs())
    result = train_local(model, _state(model), text.train, TrainConfig(noise_multiplier=1.0, local_steps=3))
    assert result.update["embedding.weight"].shape == (20_000, 64)
    assert result.privacy.steps == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"lr": -0.1}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"proximal_mu": -1}, "proximal_mu"),
        ({"noise_multiplier": 1.0, "target_epsilon": 3.0}, "either noise_multiplier or target_epsilon"),
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"target_epsilon": -3.0}, "target_epsilon"),
        ({"delta": 1.5}, "delta"),
        ({"max_grad_norm": 0}, "max_grad_norm"),
        ({"rounds": 0}, "rounds"),
        ({"local_steps": 0}, "local_steps"),
        ({"grad_sample_mode": "ghost"}, "grad_sample_mode"),
    ],
)
def test_bad_config_is_a_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_empty_data_is_refused():
    with pytest.raises(ValueError, match="empty dataset"):
        plan_round(0, TrainConfig())
