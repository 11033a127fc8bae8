"""fl_node.sparse: the per-tensor dense / delta-array choice, its policy, and what DP does to it."""

from __future__ import annotations

import pytest
import torch

from fl_node.aggregate import WeightedUpdate, get_strategy
from fl_node.codec import CodecError, SparseRows, content_hash, decode_update, encode_model, encode_update
from fl_node.models import create_model
from fl_node.sparse import (
    Costs,
    SparsePolicy,
    choose_encodings,
    decoded_encodings,
    encode_for_job,
    encode_with_policy,
    measured_costs,
    round_encodings,
)
from fl_node.text import lm_windows, topic_corpus
from fl_node.train import TrainConfig, train_local

# Fixed costs, so the choice does not depend on the machine the test runs on.
FAST = Costs(copy_bytes_per_s=1e10, gather_bytes_per_s=1e10, link_bytes_per_s=1e7)


def global_state() -> dict[str, torch.Tensor]:
    return {
        "embedding.weight": torch.zeros(1000, 16),
        "head.weight": torch.zeros(4, 16),
        "head.bias": torch.zeros(4),
        "steps": torch.tensor(3),
    }


def update_touching(fraction: float, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    embedding = torch.zeros(1000, 16)
    rows = torch.randperm(1000, generator=generator)[: int(1000 * fraction)]
    embedding[rows] = torch.randn(len(rows), 16, generator=generator)
    return {
        "embedding.weight": embedding,
        "head.weight": torch.randn(4, 16, generator=generator),
        "head.bias": torch.randn(4, generator=generator),
    }


def test_auto_sends_a_sparse_table_as_delta_and_dense_tensors_dense():
    update = update_touching(0.02)
    choices = choose_encodings(update, global_state(), SparsePolicy(), FAST)
    assert choices["embedding.weight"].encoding == "delta"
    assert choices["embedding.weight"].density == pytest.approx(0.02)
    assert choices["head.weight"].encoding == "dense"
    assert choices["head.bias"].encoding == "dense"  # 1-D: an index per value never pays
    blob, _ = encode_with_policy(update, global_state(), SparsePolicy(), FAST)
    decoded = decode_update(blob)
    assert decoded_encodings(decoded) == {
        "embedding.weight": "delta", "head.bias": "dense", "head.weight": "dense"
    }  # fmt: skip
    assert len(blob) < 0.05 * len(encode_update(update, allow_sparse=False))
    assert torch.equal(decoded["embedding.weight"].densify(), update["embedding.weight"])


def test_auto_sends_a_dense_table_dense_at_no_extra_bytes():
    update = update_touching(1.0)
    blob, choices = encode_with_policy(update, global_state(), SparsePolicy(), FAST)
    assert {c.encoding for c in choices.values()} == {"dense"}
    assert blob == encode_update(update, allow_sparse=False)


def test_slow_gather_tips_a_near_break_even_table_to_dense():
    update = update_touching(0.85)  # delta is smaller: 850 * (64 + 8) < 1000 * 64 bytes
    fast_link = SparsePolicy(link_bytes_per_s=1e12)
    assert choose_encodings(update, global_state(), fast_link, FAST)["embedding.weight"].encoding == "delta"
    slow_gather = Costs(copy_bytes_per_s=1e10, gather_bytes_per_s=1e8, link_bytes_per_s=1e12)
    choice = choose_encodings(update, global_state(), fast_link, slow_gather)["embedding.weight"]
    assert choice.encoding == "dense"
    assert choice.delta_bytes < choice.dense_bytes  # chosen by time, not bytes


@pytest.mark.parametrize("encoding", ["auto", "dense", "delta"])
def test_every_policy_is_lossless_and_aggregates_to_the_same_model(encoding):
    state = global_state()
    updates = [update_touching(0.05, seed) for seed in range(3)]
    reference = None
    for rule in ("touched", "all"):
        strategy = get_strategy("hybrid", sparse_names=["embedding.weight"], rows=rule)
        blobs = [encode_with_policy(u, state, SparsePolicy(encoding=encoding), FAST)[0] for u in updates]
        decoded = [decode_update(b) for b in blobs]
        for original, back in zip(updates, decoded, strict=True):
            for name, value in original.items():
                got = back[name].densify() if isinstance(back[name], SparseRows) else back[name]
                assert torch.equal(got, value)
        weighted = [WeightedUpdate(d, 10 + i, f"u{i}") for i, d in enumerate(decoded)]
        model = encode_model(strategy.aggregate(state, weighted)[0])
        dense_weighted = [WeightedUpdate(u, 10 + i, f"u{i}") for i, u in enumerate(updates)]
        assert model == encode_model(strategy.aggregate(state, dense_weighted)[0])
        reference = model if reference is None else reference


def test_delta_policy_sends_every_matrix_as_delta_even_when_dense():
    update = update_touching(1.0)
    _, choices = encode_with_policy(update, global_state(), SparsePolicy(encoding="delta"), FAST)
    assert choices["embedding.weight"].encoding == "delta"
    assert choices["head.weight"].encoding == "delta"
    assert choices["head.bias"].encoding == "dense"
    assert choices["head.weight"].sent_bytes == 4 * (16 * 4 + 8)


def test_dp_sgd_update_is_dense_and_auto_sends_every_noised_row():
    corpus = topic_corpus(documents=20, vocab_size=300, num_topics=2, common_words=50, seed=1)
    data = lm_windows(corpus.tokens, 4)
    model = create_model(
        "lm", input_shape=(4,), num_classes=300, vocab_size=300, embed_dim=8, hidden=8, seed=0
    )
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    plain = train_local(model, state, data, TrainConfig(batch_size=16, local_steps=2, seed=0)).update
    private = train_local(
        model, state, data,
        TrainConfig(batch_size=16, local_steps=2, noise_multiplier=1.0, grad_sample_mode="ew", seed=0),
    ).update  # fmt: skip
    plain_choice = choose_encodings(plain, state, SparsePolicy(), FAST)["embedding.weight"]
    assert plain_choice.density < 0.5  # without noise only the rows of seen tokens change
    for encoding in ("auto", "delta"):
        blob, choices = encode_with_policy(private, state, SparsePolicy(encoding=encoding), FAST)
        assert choices["embedding.weight"].density == 1.0  # noise on every row, seen or not
        assert choices["output.weight"].density == 1.0
        decoded = decode_update(blob)
        table = decoded["embedding.weight"]
        table = table.densify() if isinstance(table, SparseRows) else table
        assert torch.equal(table, private["embedding.weight"])  # no noised row dropped
    assert choose_encodings(private, state, SparsePolicy(), FAST)["embedding.weight"].encoding == "dense"


def test_encode_for_job_matches_encode_with_policy_and_is_deterministic_given_costs():
    update = update_touching(0.1)
    blob, _ = encode_with_policy(update, global_state(), SparsePolicy(), measured_costs())
    assert encode_for_job(update, global_state(), SparsePolicy()) == blob
    assert content_hash(blob) == content_hash(encode_update(update))  # auto = the canonical choice here


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"encoding": "sparse"}, "update encoding must be one of"),
        ({"link_bytes_per_s": 0}, "link_bytes_per_s"),
        ({"link_bytes_per_s": float("inf")}, "link_bytes_per_s"),
        ({"link_bytes_per_s": "fast"}, "link_bytes_per_s"),
    ],
)
def test_policy_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SparsePolicy(**kwargs)


def test_updates_that_do_not_match_the_global_model_are_refused():
    with pytest.raises(CodecError, match="not in the global model"):
        choose_encodings({"other": torch.zeros(2, 2)}, global_state(), SparsePolicy(), FAST)
    with pytest.raises(CodecError, match="has shape"):
        choose_encodings({"embedding.weight": torch.zeros(10, 16)}, global_state(), SparsePolicy(), FAST)


def test_pinned_codec_encodings_are_checked():
    update = update_touching(0.1)
    with pytest.raises(CodecError, match="unknown encoding"):
        encode_update(update, encodings={"head.weight": "zip"})
    with pytest.raises(CodecError, match="sparse rows need 2 or more dims"):
        encode_update(update, encodings={"head.bias": "sparse_rows"})
    with pytest.raises(CodecError, match="does not hold"):
        encode_update(update, encodings={"nothing": "dense"})


def test_round_encodings_counts_choices_and_mean_density():
    state = global_state()
    sparse = decode_update(encode_with_policy(update_touching(0.02), state, SparsePolicy(), FAST)[0])
    dense = decode_update(encode_with_policy(update_touching(1.0), state, SparsePolicy(), FAST)[0])
    summary = round_encodings([sparse, dense])
    assert summary["embedding.weight"] == {"dense": 1, "delta": 1, "density": pytest.approx(0.51)}
    assert summary["head.bias"]["dense"] == 2


def test_the_simulator_encodes_as_the_node_does_and_the_encoding_changes_bytes_not_the_model():
    from fl_node.job.config import SparseConfig
    from fl_node.simulate import run_simulation, simulation

    common = dict(
        model="text", nodes=3, rounds=1, partition="iid", committee_size=1,
        strategy="hybrid", batch_size=64, lr=0.5, seed=0, top_k=2,  # both trainers: no score decides
    )  # fmt: skip
    auto = run_simulation(simulation("zipf_text", **common, sparse=SparseConfig(encoding="auto"))).rounds[0]
    dense = run_simulation(simulation("zipf_text", **common, sparse=SparseConfig(encoding="dense"))).rounds[0]
    assert auto.test_loss == dense.test_loss
    for sparse, full in zip(auto.updates, dense.updates, strict=True):
        assert sparse.encoded_bytes < 0.5 * full.encoded_bytes  # the 20,000-row table went as delta
    with pytest.raises(ValueError, match="must be one of auto, dense, delta"):
        simulation("zipf_text", **common, sparse=SparseConfig(encoding="zip"))


def test_a_private_simulation_keeps_the_public_rows_of_each_round_as_the_node_does():
    from fl_node.job.config import DPConfig, SparseConfig
    from fl_node.simulate import prepared_model_and_data, run_simulation, simulation
    from fl_node.sparse import round_public_rows

    table, count = "embedding.weight", 400
    # About the rows the aggregate keeps, not the committee: every update averaged, no committee (one
    # round of noised updates rarely beats the base model's exact hold-out score, so none would pass).
    config = simulation(
        "zipf_text", model="text", nodes=3, rounds=1, partition="iid", committee_size=1, public_holdouts=True,
        batch_size=64, lr=0.5, seed=0, top_k=2, dp=DPConfig(mode="update", target_epsilon=8.0),
        sparse=SparseConfig(tables=(table,), public_rows=count), consensus=False,
    )  # fmt: skip
    result = run_simulation(config)
    _, model = prepared_model_and_data("zipf_text", "text", seed=0)
    initial = model.state_dict()[table]
    kept = round_public_rows(model.state_dict(), (table,), count, private=True, seed=0, round_=1)[table]
    assert any(u.accepted for u in result.rounds[0].updates)
    # Every public row noised and averaged in, no other row moved: the projection the node applies.
    assert touched_rows_of(result.final_state[table] - initial) == kept.tolist()
    dense_bytes = initial.numel() * 4
    for update in result.rounds[0].updates:
        assert update.encoded_bytes < 0.1 * dense_bytes  # the table went as a delta array of its public rows


def test_peers_bound_admits_a_dense_table_sent_as_a_delta_array():
    from fl_node.sizes import update_max_bytes

    # Narrow rows: the row ids add half the dense size, more than the codec's header slack.
    state = {"embedding.weight": torch.zeros(200_000, 4), "head.bias": torch.zeros(4)}
    update = {"embedding.weight": torch.ones(200_000, 4), "head.bias": torch.ones(4)}
    blob, choices = encode_with_policy(update, state, SparsePolicy(encoding="delta"), FAST)
    assert choices["embedding.weight"].encoding == "delta"
    dense = encode_update(update, allow_sparse=False)
    assert len(dense) < len(blob) <= update_max_bytes(state)


def test_auto_never_sends_more_bytes_than_dense_whatever_the_measured_costs():
    update = update_touching(0.97)  # delta would be larger: 970 * (64 + 8) > 1000 * 64
    gather_faster = Costs(copy_bytes_per_s=1e6, gather_bytes_per_s=1e12, link_bytes_per_s=1e12)
    choice = choose_encodings(update, global_state(), SparsePolicy(), gather_faster)["embedding.weight"]
    assert choice.encoding == "dense"


def test_public_rows_depend_on_the_seed_and_round_only_and_cover_the_head():
    from fl_node.sparse import public_rows

    shapes = {"embedding.weight": (1000, 16), "head.weight": (4, 16)}
    one = public_rows(shapes, ["embedding.weight"], 100, seed=3, round_=1)["embedding.weight"]
    assert torch.equal(
        one, public_rows(shapes, ["embedding.weight"], 100, seed=3, round_=1)["embedding.weight"]
    )
    assert len(one) == 100 and len(set(one.tolist())) == 100 and one.tolist() == sorted(one.tolist())
    assert one[:50].tolist() == list(range(50))
    later = public_rows(shapes, ["embedding.weight"], 100, seed=3, round_=2)["embedding.weight"]
    assert not torch.equal(one, later)  # the drawn half rotates over the rounds
    assert public_rows(shapes, ["head.weight"], 100, seed=3, round_=1)["head.weight"].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="not a tensor"):
        public_rows(shapes, ["missing"], 10, seed=0, round_=1)


def test_a_private_update_restricted_to_public_rows_is_a_delta_array_of_exactly_those_rows():
    from fl_node.data import ArrayDataset
    from fl_node.local_round import local_round
    from fl_node.privacy import UpdateGaussianMechanism
    from fl_node.secure_random import SecureRandom
    from fl_node.sparse import public_rows

    model = create_model("text", input_shape=(6,), num_classes=2, vocab_size=500, embed_dim=8, seed=0)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    data = ArrayDataset(
        torch.randint(1, 500, (64, 6), generator=generator).numpy(), torch.randint(0, 2, (64,)).numpy()
    )
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    kept = public_rows(shapes, ["embedding.weight"], 40, seed=0, round_=1)
    mechanism = UpdateGaussianMechanism(clip_norm=1.0, noise_multiplier=1.0, sampling_fraction=1.0)
    config = TrainConfig(batch_size=16, local_steps=2, lr=0.5, seed=0)
    result = local_round(
        model, state, data, config, num_classes=2, mechanism=mechanism, randomness=SecureRandom(b"k" * 32),
        kept_rows=kept,
    )  # fmt: skip
    table = result.update["embedding.weight"]
    changed = touched_rows_of(table)
    assert changed == kept["embedding.weight"].tolist()  # every public row noised, no other row sent
    blob, choices = encode_with_policy(
        result.update, state, SparsePolicy(tables=frozenset({"embedding.weight"})), FAST
    )
    assert choices["embedding.weight"].encoding == "delta"
    assert choices["embedding.weight"].density == pytest.approx(40 / 500)
    assert choices["head.weight"].encoding == "dense"  # not a table: dense whatever its rows
    decoded = decode_update(blob)
    assert torch.equal(decoded["embedding.weight"].densify(), table)  # lossless
    # The dense tensors kept their full noised update: only the table is projected.
    plain = local_round(
        model, state, data, config, num_classes=2, mechanism=mechanism, randomness=SecureRandom(b"k" * 32)
    )
    assert touched_rows_of(plain.update["embedding.weight"]) == list(range(500))  # noise on every row


def touched_rows_of(table: torch.Tensor) -> list[int]:
    return table.ne(0).any(dim=1).nonzero().flatten().tolist()


def test_the_head_rule_keeps_the_most_frequent_rows_every_round_and_a_bad_rule_is_refused():
    from fl_node.sparse import public_rows

    shapes = {"embedding.weight": (1000, 8)}
    for round_ in (1, 2, 7):
        kept = public_rows(shapes, ["embedding.weight"], 150, seed=round_, round_=round_, rule="head")
        assert kept["embedding.weight"].tolist() == list(range(150))
    with pytest.raises(ValueError, match="public rule"):
        public_rows(shapes, ["embedding.weight"], 150, seed=0, round_=1, rule="frequent")


def _token_data(vocab: int, seq: int, n: int, seed: int):
    from fl_node.data import ArrayDataset

    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(1, vocab, (n, seq), generator=generator).numpy()
    return ArrayDataset(x, torch.randint(0, 2, (n,), generator=generator).numpy())


def test_training_only_the_public_rows_equals_training_with_the_other_rows_gradients_removed():
    """The public-rows copy is the model with each example's gradient projected onto the kept rows."""
    from fl_node.sparse import full_update, public_rows, public_rows_model

    model = create_model("text", input_shape=(6,), num_classes=2, vocab_size=300, embed_dim=8, seed=0)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    data = _token_data(300, 6, 64, seed=1)
    kept = public_rows(
        {k: tuple(v.shape) for k, v in state.items()}, ["embedding.weight"], 50, seed=0, round_=1
    )
    sub, sub_state = public_rows_model(model, state, kept)
    # Only the kept rows are parameters: DP-SGD clips and noises exactly them.
    assert sorted(n for n, _ in sub.named_parameters()) == [
        "embedding.rows.weight",
        "head.bias",
        "head.weight",
    ]
    assert sub.embedding.rows.weight.shape == (50, 8)
    config = TrainConfig(batch_size=16, local_steps=3, lr=0.5, momentum=0.0, seed=0)
    ours = full_update(train_local(sub, sub_state, data, config).update, state, kept)

    mask = torch.zeros(300, 1)
    mask[kept["embedding.weight"]] = 1.0
    handle = model.embedding.weight.register_hook(lambda grad: grad * mask)
    try:
        reference = train_local(model, state, data, config).update
    finally:
        handle.remove()
    assert list(ours) == list(reference)
    for name in reference:
        torch.testing.assert_close(ours[name], reference[name], rtol=1e-5, atol=1e-6)
    outside = torch.ones(300, dtype=torch.bool)
    outside[kept["embedding.weight"]] = False
    assert not ours["embedding.weight"][outside].any()  # the other rows never move
    assert ours["embedding.weight"][~outside].ne(0).any(dim=1).sum() > 25  # kept rows the batches held


def test_under_dp_sgd_only_the_public_rows_train_and_each_is_noised():
    from fl_node.local_round import local_round
    from fl_node.secure_random import SecureRandom
    from fl_node.sparse import public_rows

    model = create_model("text", input_shape=(6,), num_classes=2, vocab_size=400, embed_dim=8, seed=0)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # Every example holds tokens outside the kept rows only (ids 200..399): they get no signal, but
    # each kept row moves (its noise), and the model ends holding the local weights.
    data = _token_data(200, 6, 64, seed=2)
    data = type(data)(data.x + 199, data.y)
    kept = public_rows(
        {k: tuple(v.shape) for k, v in state.items()}, ["embedding.weight"], 60, seed=0, round_=1, rule="head"
    )
    config = TrainConfig(
        batch_size=16, local_steps=2, lr=0.5, noise_multiplier=1.0, max_grad_norm=1.0, seed=0
    )
    result = local_round(
        model, state, data, config, num_classes=2, randomness=SecureRandom(b"k" * 32), kept_rows=kept
    )
    assert touched_rows_of(result.update["embedding.weight"]) == list(range(60))
    torch.testing.assert_close(
        model.state_dict()["embedding.weight"], state["embedding.weight"] + result.update["embedding.weight"]
    )


def test_a_table_that_is_not_a_plain_embedding_trains_whole_and_is_projected():
    from fl_node.sparse import public_rows, public_rows_model

    model = create_model("mlp", input_shape=(4,), num_classes=2, seed=0)
    state = model.state_dict()
    kept = public_rows({k: tuple(v.shape) for k, v in state.items()}, ["1.weight"], 8, seed=0, round_=1)
    assert public_rows_model(model, state, kept) is None
