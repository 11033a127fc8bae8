"""fl_node.sparse_models and fl_node.text: the LM, the hashed recommender, and their generated data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_node.codec import touched_rows
from fl_node.data import available_datasets, load_dataset
from fl_node.models import available_models, create_model
from fl_node.sparse_models import hash_buckets
from fl_node.text import click_log, lm_windows, topic_corpus
from fl_node.train import TrainConfig, evaluate, train_local


def small_lm(**options):
    options = {"vocab_size": 400, "embed_dim": 8, "hidden": 8, "sampled": 20} | options
    return create_model("lm", input_shape=(4,), num_classes=options["vocab_size"], seed=0, **options)


def test_models_and_datasets_are_registered():
    assert {"lm", "hashed_rec", "text"} <= set(available_models())
    assert {"zipf_lm", "hashed_clicks"} <= set(available_datasets())


def test_lm_defaults_to_a_50k_vocabulary_and_predicts_every_token():
    model = create_model("lm", input_shape=(8,), num_classes=50_000, seed=0)
    assert model.embedding.weight.shape == (50_000, 32)
    logits = model(torch.randint(1, 50_000, (3, 8)))
    assert logits.shape == (3, 50_000)
    with pytest.raises(ValueError, match="num_classes"):
        create_model("lm", input_shape=(8,), num_classes=10, seed=0)


def test_sampled_softmax_touches_only_target_negative_and_context_rows():
    model = small_lm()
    tokens = torch.tensor([[0, 0, 5, 7], [9, 5, 11, 13]])
    targets = torch.tensor([17, 19])
    torch.manual_seed(0)
    model.training_loss(tokens, targets).backward()
    embedding_rows = set(touched_rows(model.embedding.weight.grad).tolist())
    assert embedding_rows <= {5, 7, 9, 11, 13}  # padding (0) is masked: its row stays untouched
    assert {7, 13} <= embedding_rows  # the last position always contributes
    output_rows = set(touched_rows(model.output.weight.grad).tolist())
    assert {17, 19} <= output_rows
    assert len(output_rows) <= 2 + model.sampled
    full = small_lm(sampled=0)
    full.training_loss(tokens, targets).backward()
    assert touched_rows(full.output.weight.grad).numel() == 400  # full softmax: every row


def test_lm_update_from_local_training_is_row_sparse_and_lowers_the_loss():
    corpus = topic_corpus(documents=30, vocab_size=2000, num_topics=4, common_words=100, seed=3)
    data = lm_windows(corpus.tokens, 4)
    model = small_lm(vocab_size=2000, sampled=50)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x, y = data.tensors()
    before = evaluate(model, x, y)["loss"]
    result = train_local(
        model, state, data, TrainConfig(batch_size=32, local_steps=30, lr=0.1, momentum=0.5, seed=0)
    )
    density = touched_rows(result.update["embedding.weight"]).numel() / 2000
    assert 0 < density < 0.6
    assert touched_rows(result.update["output.weight"]).numel() < 2000
    assert evaluate(model, x, y)["loss"] < before


def test_topic_corpus_is_seeded_zipfian_and_topics_have_their_own_words():
    first = topic_corpus(documents=200, vocab_size=5000, num_topics=4, common_words=100, seed=1)
    again = topic_corpus(documents=200, vocab_size=5000, num_topics=4, common_words=100, seed=1)
    assert np.array_equal(first.tokens, again.tokens)
    assert first.tokens.min() >= 1 and first.tokens.max() < 5000
    counts = np.bincount(first.tokens.ravel(), minlength=5000)
    assert counts[1] > counts[50] > 0  # common words follow a Zipf ranking
    words = [set(first.tokens[first.topics == t].ravel().tolist()) - set(range(101)) for t in range(4)]
    assert all(not (words[a] & words[b]) for a in range(4) for b in range(a + 1, 4))


def test_lm_windows_pad_on_the_left_and_pair_each_context_with_the_next_token():
    tokens = np.array([[3, 4, 5, 6]])
    windows = lm_windows(tokens, 2)
    assert windows.x.tolist() == [[0, 3], [3, 4], [4, 5]]
    assert windows.y.tolist() == [4, 5, 6]


def test_zipf_lm_dataset_builds_the_lm():
    splits = load_dataset("zipf_lm", documents=40, vocab_size=3000, num_topics=4)
    model = create_model("lm", seed=0, **splits.model_kwargs())
    assert model(torch.from_numpy(splits.test.x[:2])).shape == (2, 3000)


def test_hash_buckets_take_any_id_deterministically():
    ids = torch.tensor([[0, 1], [2**62, -5], [123456789012, 7]])
    buckets = hash_buckets(ids, 1000)
    assert buckets.min() >= 0 and buckets.max() < 1000
    assert torch.equal(buckets, hash_buckets(ids.clone(), 1000))
    # Fixed by the formula, on every platform: a change would silently remap every trained row.
    assert (
        buckets.tolist()
        == hash_buckets(torch.tensor([[0, 1], [2**62, -5], [123456789012, 7]]), 1000).tolist()
    )
    assert (
        hash_buckets(torch.tensor([[42]]), 1000).item()
        == ((42 * 1_103_515_245 + 2_654_435_761 % 2_147_483_647) % 2_147_483_647) % 1000
    )
    same_id_other_field = hash_buckets(torch.tensor([[42, 42]]), 1_000_000)
    assert same_id_other_field[0, 0] != same_id_other_field[0, 1]  # salted per field
    with pytest.raises(ValueError, match="int64"):
        hash_buckets(torch.tensor([[1.0]]), 10)


def test_hashed_recommender_trains_on_ids_it_never_saw():
    splits = load_dataset("hashed_clicks", events=3000)
    model = create_model("hashed_rec", seed=0, buckets=5000, **splits.model_kwargs())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    result = train_local(model, state, splits.train, TrainConfig(batch_size=64, local_steps=20, lr=0.2))
    assert 0 < touched_rows(result.update["table.weight"]).numel() < 5000
    unseen = torch.tensor([[2**61 + 3, -(2**50), 99_999, 23]])
    assert model(unseen).shape == (1, 2)
    assert len(click_log(events=10, seed=1)) == 10
