"""The committee scores the updates of one pass on several threads, each on its own module."""

from __future__ import annotations

import threading
import time

import torch

from backend.jobs.driver import committee
from fl_node.codec import encode_update
from fl_node.models import create_model
from fl_node.score import score_update_int


def test_scores_come_back_in_order_and_each_module_stays_on_one_thread(monkeypatch):
    monkeypatch.setattr(committee, "SCORE_THREADS", 3)
    scratch = torch.nn.Linear(2, 2)
    seen: list[tuple[int, int]] = []

    def score(item, model):
        seen.append((threading.get_ident(), id(model)))
        time.sleep(0.01)
        return item * 10

    assert committee.score_each(list(range(7)), score, scratch) == [i * 10 for i in range(7)]
    threads_of: dict[int, set[int]] = {}
    for thread, model in seen:
        threads_of.setdefault(model, set()).add(thread)
    assert len(threads_of) == 3 and id(scratch) in threads_of
    assert all(len(threads) == 1 for threads in threads_of.values())  # no module shared


def test_concurrent_scores_equal_one_by_one(monkeypatch):
    torch.manual_seed(0)
    model = create_model("cnn", input_shape=(1, 28, 28), num_classes=10)
    global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    updates = [
        encode_update(
            {k: torch.randn_like(v) * 0.05 for k, v in global_state.items() if v.is_floating_point()}
        )
        for _ in range(5)
    ]
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def score(blob, module):
        return score_update_int(module, global_state, blob, x, y, metric="likelihood")

    one_by_one = [score(blob, model) for blob in updates]
    monkeypatch.setattr(committee, "SCORE_THREADS", 2)
    assert committee.score_each(updates, score, model) == one_by_one
    assert committee.score_each([], score, model) == []
