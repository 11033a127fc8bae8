"""fl_node.aggregate: byte-exact order independence, weighting, robustness, sparse rows, server state."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fl_node.aggregate as aggregate
from fl_node.aggregate import (
    WeightedUpdate,
    available_strategies,
    coordinate_median,
    get_strategy,
    krum_select,
    pairwise_squared_distances,
    sorting_network,
    trimmed_mean,
    weighted_mean,
)
from fl_node.codec import SparseRows, content_hash, decode_model, decode_update, encode_model, encode_update

REPO = Path(__file__).resolve().parents[2]
PARAMS = {"krum": {"f": 1}, "multi_krum": {"f": 1}, "trimmed_mean": {"beta": 0.2}}


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    # Tiny chunks exercise the chunk loops and their ragged tails on small tensors.
    monkeypatch.setattr(aggregate, "CHUNK", 7)
    monkeypatch.setattr(aggregate, "SORT_CHUNK", 5)


def make_global(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "embedding.weight": torch.randn(20, 4, generator=generator),
        "head.weight": torch.randn(3, 4, generator=generator),
        "head.bias": torch.randn(3, generator=generator),
        "steps": torch.tensor(5),
    }


def make_updates(count: int = 6, seed: int = 1) -> list[WeightedUpdate]:
    generator = torch.Generator().manual_seed(seed)
    updates = []
    for i in range(count):
        embedding = torch.zeros(20, 4)
        rows = torch.randperm(20, generator=generator)[:3]
        embedding[rows] = torch.randn(3, 4, generator=generator)
        tensors = {
            "embedding.weight": embedding,
            "head.weight": torch.randn(3, 4, generator=generator) * 0.1,
            "head.bias": torch.randn(3, generator=generator) * 0.1,
        }
        # Through the codec, as on a node: the embedding arrives as SparseRows.
        data = encode_update(tensors)
        updates.append(WeightedUpdate(decode_update(data), num_samples=10 + 7 * i, id=content_hash(data)))
    return updates


def result_bytes(result: tuple) -> bytes:
    state, server_state = result
    return encode_model(state, server_state)


@pytest.mark.parametrize("name", sorted(available_strategies()))
def test_every_strategy_is_order_independent_to_the_byte(name):
    global_state = make_global()
    updates = make_updates()
    strategy = get_strategy(name, **PARAMS.get(name, {}))
    reference = result_bytes(strategy.aggregate(global_state, updates))
    shuffled = list(updates)
    for seed in range(3):
        random.Random(seed).shuffle(shuffled)
        assert result_bytes(strategy.aggregate(global_state, shuffled)) == reference
    # Untouched non-float tensors pass through.
    new_state, _ = strategy.aggregate(global_state, updates)
    assert torch.equal(new_state["steps"], global_state["steps"])


def test_every_strategy_is_registered():
    assert set(available_strategies()) >= {
        "fedavg", "fedprox", "fedadam", "fedyogi", "median", "trimmed_mean", "krum", "multi_krum", "hybrid",
    }  # fmt: skip


def test_fedavg_weights_by_samples():
    global_state = {"w": torch.zeros(2, 2)}
    updates = [
        WeightedUpdate({"w": torch.full((2, 2), 4.0)}, num_samples=1, id="a"),
        WeightedUpdate({"w": torch.full((2, 2), 8.0)}, num_samples=3, id="b"),
    ]
    new_state, server_state = get_strategy("fedavg").aggregate(global_state, updates)
    assert server_state is None
    assert torch.allclose(new_state["w"], torch.full((2, 2), 7.0))  # (1*4 + 3*8) / 4


def test_fedavg_adds_the_mean_delta_to_the_global_model():
    global_state = {"w": torch.full((3,), 10.0)}
    updates = [WeightedUpdate({"w": torch.tensor([1.0, 2.0, 3.0])}, 2, "x")]
    new_state, _ = get_strategy("fedavg").aggregate(global_state, updates)
    assert torch.equal(new_state["w"], torch.tensor([11.0, 12.0, 13.0]))
    assert torch.equal(global_state["w"], torch.full((3,), 10.0))  # inputs untouched


def test_fedprox_aggregates_as_fedavg():
    global_state, updates = make_global(), make_updates()
    fedprox = get_strategy("fedprox", mu=0.1)
    assert fedprox.proximal_mu == 0.1
    assert result_bytes(fedprox.aggregate(global_state, updates)) == result_bytes(
        get_strategy("fedavg").aggregate(global_state, updates)
    )


@pytest.mark.parametrize("name", ["median", "trimmed_mean", "krum", "multi_krum"])
def test_robust_strategies_resist_an_outlier(name):
    global_state = {"w": torch.zeros(8)}
    generator = torch.Generator().manual_seed(3)
    updates = [
        WeightedUpdate({"w": 1.0 + 0.01 * torch.randn(8, generator=generator)}, 10, f"honest{i}")
        for i in range(6)
    ]
    updates.append(WeightedUpdate({"w": torch.full((8,), 1e6)}, 10_000, "byzantine"))
    new_state, _ = get_strategy(name, **PARAMS.get(name, {})).aggregate(global_state, updates)
    assert torch.allclose(new_state["w"], torch.ones(8), atol=0.05)
    fedavg_state, _ = get_strategy("fedavg").aggregate(global_state, updates)
    assert fedavg_state["w"].min() > 1e5  # the undefended mean is dragged away


def test_krum_selects_the_central_update():
    points = [
        torch.tensor([0.0]),
        torch.tensor([0.1]),
        torch.tensor([0.2]),
        torch.tensor([0.3]),
        torch.tensor([9.0]),
    ]
    distances = pairwise_squared_distances([[p] for p in points])
    assert torch.allclose(distances[0, 4], torch.tensor(81.0, dtype=torch.float64))
    assert krum_select(distances, f=1, m=1) in ([1], [2])
    assert 4 not in krum_select(distances, f=1, m=3)


def test_krum_needs_enough_updates():
    updates = [WeightedUpdate({"w": torch.ones(2)}, 1, str(i)) for i in range(4)]
    with pytest.raises(ValueError, match="n >= 2f \\+ 3"):
        get_strategy("krum", f=1).aggregate({"w": torch.zeros(2)}, updates)


def test_coordinate_median_and_trimmed_mean_values():
    tensors = [
        torch.tensor([1.0, -5.0]),
        torch.tensor([3.0, 0.0]),
        torch.tensor([2.0, 7.0]),
        torch.tensor([100.0, 1.0]),
    ]
    assert torch.equal(coordinate_median(tensors), torch.tensor([2.5, 0.5]))
    assert torch.equal(coordinate_median(tensors[:3]), torch.tensor([2.0, 0.0]))
    assert torch.equal(trimmed_mean(tensors, 0.25), torch.tensor([2.5, 0.5]))
    assert torch.equal(trimmed_mean(tensors, 0.0), torch.tensor([26.5, 0.75]))


def test_median_normalises_the_sign_of_zero():
    median = coordinate_median([torch.tensor([-0.0]), torch.tensor([0.0]), torch.tensor([-0.0])])
    assert not torch.signbit(median).any()


@pytest.mark.parametrize("n", range(1, 18))
def test_sorting_network_sorts(n):
    network = sorting_network(n)
    # 0/1 principle: a comparator network that sorts every 0/1 input sorts everything.
    for bits in itertools.product((0, 1), repeat=min(n, 12)):
        values = list(bits) + [1] * (n - len(bits))
        for a, b in network:
            if values[a] > values[b]:
                values[a], values[b] = values[b], values[a]
        assert values == sorted(values)


def test_weighted_mean_matches_float64_reference():
    generator = torch.Generator().manual_seed(5)
    tensors = [torch.randn(50, generator=generator) for _ in range(5)]
    weights = [1, 2, 3, 4, 5]
    reference = sum(w * t.double() for w, t in zip(weights, tensors, strict=True)) / 15
    assert torch.allclose(weighted_mean(tensors, weights).double(), reference, atol=1e-6)


def test_hybrid_averages_rows_only_over_updates_that_touched_them():
    global_state = {"emb": torch.zeros(4, 2), "bias": torch.zeros(2)}
    first = SparseRows(torch.tensor([0, 2]), torch.tensor([[2.0, 2.0], [1.0, 1.0]]), (4, 2))
    second = SparseRows(torch.tensor([1, 2]), torch.tensor([[4.0, 4.0], [5.0, 5.0]]), (4, 2))
    updates = [
        WeightedUpdate({"emb": first, "bias": torch.tensor([1.0, 1.0])}, 1, "a"),
        WeightedUpdate({"emb": second, "bias": torch.tensor([5.0, 5.0])}, 3, "b"),
    ]
    new_state, _ = get_strategy("hybrid").aggregate(global_state, updates)
    expected = torch.tensor([[2.0, 2.0], [4.0, 4.0], [4.0, 4.0], [0.0, 0.0]])  # row 2: (1*1 + 3*5) / 4
    assert torch.equal(new_state["emb"], expected)
    assert torch.equal(new_state["bias"], torch.tensor([4.0, 4.0]))  # dense: FedAvg over all
    fedavg_state, _ = get_strategy("fedavg").aggregate(global_state, updates)
    assert torch.equal(fedavg_state["emb"][0], torch.tensor([0.5, 0.5]))  # FedAvg dilutes rows


def test_hybrid_result_does_not_depend_on_the_encoding():
    global_state, updates = make_global(), make_updates()
    dense_updates = [
        WeightedUpdate(
            {name: SparseRows.densify(v) if isinstance(v, SparseRows) else v for name, v in u.update.items()},
            u.num_samples,
            u.id,
        )
        for u in updates
    ]
    strategy = get_strategy("hybrid", sparse_names=["embedding.weight"])
    assert result_bytes(strategy.aggregate(global_state, dense_updates)) == result_bytes(
        strategy.aggregate(global_state, updates)
    )
    assert result_bytes(strategy.aggregate(global_state, updates)) == result_bytes(
        get_strategy("hybrid").aggregate(global_state, updates)
    )
    # Without names the rule is chosen by content too: all-dense encodings give the same model.
    assert result_bytes(get_strategy("hybrid").aggregate(global_state, dense_updates)) == result_bytes(
        get_strategy("hybrid").aggregate(global_state, updates)
    )


def test_hybrid_rows_all_is_fedavg_computed_from_the_touched_rows():
    global_state, updates = make_global(), make_updates()
    hybrid, _ = get_strategy("hybrid", sparse_names=["embedding.weight"], rows="all").aggregate(
        global_state, updates
    )
    fedavg, _ = get_strategy("fedavg").aggregate(global_state, updates)
    for name in fedavg:
        assert torch.allclose(hybrid[name].double(), fedavg[name].double(), atol=1e-6), name
    touched, _ = get_strategy("hybrid", sparse_names=["embedding.weight"]).aggregate(global_state, updates)
    assert not torch.allclose(touched["embedding.weight"], fedavg["embedding.weight"])  # the rules differ


def test_hybrid_rows_all_keeps_untouched_rows_and_weights_by_samples():
    global_state = {"emb": torch.ones(4, 2)}
    first = SparseRows(torch.tensor([0, 2]), torch.tensor([[2.0, 2.0], [1.0, 1.0]]), (4, 2))
    second = SparseRows(torch.tensor([2]), torch.tensor([[5.0, 5.0]]), (4, 2))
    updates = [WeightedUpdate({"emb": first}, 1, "a"), WeightedUpdate({"emb": second}, 3, "b")]
    new_state, _ = get_strategy("hybrid", rows="all").aggregate(global_state, updates)
    expected = torch.tensor([[1.5, 1.5], [1.0, 1.0], [5.0, 5.0], [1.0, 1.0]])  # row 2: 1 + (1 + 15) / 4
    assert torch.equal(new_state["emb"], expected)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"rows": "some"}, "hybrid rows must be one of"),
        ({"sparse_names": "embedding.weight"}, "list of tensor names"),
        ({"sparse_names": [""]}, "list of tensor names"),
    ],
)
def test_hybrid_rejects_bad_parameters(params, message):
    with pytest.raises(ValueError, match=message):
        get_strategy("hybrid", **params)


@pytest.mark.parametrize("name", ["fedadam", "fedyogi"])
def test_server_optimizer_state_survives_serialization(name):
    global_state = make_global()
    strategy = get_strategy(name, lr=0.05)
    first_round, second_round = make_updates(seed=1), make_updates(seed=2)
    state1, server1 = strategy.aggregate(global_state, first_round)
    assert set(server1) == {
        f"{k}/{n}" for n in ("embedding.weight", "head.weight", "head.bias") for k in "mv"
    }
    direct = strategy.aggregate(state1, second_round, server1)
    # Another node fetches the global model with its server state and continues.
    loaded_state, loaded_server = decode_model(encode_model(state1, server1))
    resumed = get_strategy(name, lr=0.05).aggregate(loaded_state, second_round, loaded_server)
    assert result_bytes(resumed) == result_bytes(direct)


def test_fedadam_and_fedyogi_differ_and_move_by_about_lr():
    global_state, updates = make_global(), make_updates()
    adam, _ = get_strategy("fedadam", lr=0.01).aggregate(global_state, updates)
    yogi, _ = get_strategy("fedyogi", lr=0.01).aggregate(global_state, updates)
    step = (adam["head.bias"] - global_state["head.bias"]).abs()
    assert (step <= 0.01 + 1e-6).all() and (step > 0).all()
    assert not torch.equal(adam["head.weight"], yogi["head.weight"]) or not torch.equal(
        adam["embedding.weight"], yogi["embedding.weight"]
    )


def test_server_state_mismatch_is_rejected():
    global_state, updates = make_global(), make_updates()
    with pytest.raises(ValueError, match="server state"):
        get_strategy("fedadam").aggregate(global_state, updates, {"m/head.bias": torch.zeros(3)})


def test_registry_rejects_unknown_names_and_bad_parameters():
    with pytest.raises(ValueError, match="unknown aggregation strategy 'fedsgd'.*fedavg"):
        get_strategy("fedsgd")
    with pytest.raises(ValueError, match="bad parameters"):
        get_strategy("fedavg", beta=0.1)
    with pytest.raises(ValueError, match="beta"):
        get_strategy("trimmed_mean", beta=0.5)
    with pytest.raises(ValueError, match="beta1"):
        get_strategy("fedadam", beta1=1.0)


@pytest.mark.parametrize(
    ("updates", "message"),
    [
        ([], "no updates"),
        (
            [WeightedUpdate({"w": torch.ones(2)}, 1, "a"), WeightedUpdate({"w": torch.ones(2)}, 1, "a")],
            "share an id",
        ),
        ([WeightedUpdate({"w": torch.ones(2)}, 0, "a")], "num_samples"),
        (
            [WeightedUpdate({"w": torch.ones(2)}, 1, "a"), WeightedUpdate({"v": torch.ones(2)}, 1, "b")],
            "has tensors",
        ),
        ([WeightedUpdate({"w": torch.ones(3)}, 1, "a")], "shape"),
        ([WeightedUpdate({"x": torch.ones(2)}, 1, "a")], "not in the global model"),
        ([WeightedUpdate({"w": torch.ones(2, dtype=torch.float64)}, 1, "a")], "float32"),
    ],
)
def test_invalid_updates_are_rejected(updates, message):
    with pytest.raises(ValueError, match=message):
        get_strategy("fedavg").aggregate({"w": torch.zeros(2)}, updates)


_AGGREGATE_IN_CHILD = """
import sys
sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
import hashlib, random, torch
torch.set_num_threads({threads})
from test_aggregate import make_global, make_updates, result_bytes, PARAMS
from fl_node.aggregate import get_strategy
updates = make_updates(count=7)
random.Random({seed}).shuffle(updates)
for name in ("fedavg", "median", "hybrid", "fedyogi", "multi_krum"):
    strategy = get_strategy(name, **PARAMS.get(name, {{}}))
    print(name, hashlib.sha256(result_bytes(strategy.aggregate(make_global(), updates))).hexdigest())
"""


@pytest.mark.slow  # two interpreters of their own, importing torch
def test_aggregation_is_identical_across_processes():
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _AGGREGATE_IN_CHILD.format(
                    repo=str(REPO), tests=str(Path(__file__).parent), seed=seed, threads=threads
                ),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed, threads in ((1, 1), (2, 2))  # other arrival order, other thread count
    ]
    outputs = [child.communicate(timeout=120)[0] for child in children]
    assert all(child.returncode == 0 for child in children)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 5
